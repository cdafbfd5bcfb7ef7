"""The 6 MiB test image (one incompressible file over six 1 MiB blocks), ``bootseer`` run as a
user runs it (a real process against a ``file://`` store and a cache), and the image recorded
with a hot list: shared by the prefetch, node-cache, agent and warm tests."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

from bootseer.nodecache import NodeCache
from bootseer.prefetch import hotlist
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.store import BlobStore, open_store
from support.layers import dir_, layer, reg
from support.oci import OCI_LAYER_GZIP, write_image, write_layout

MIB = 1 << 20
BIG = random.Random(11).randbytes(5 * MIB + 12345)  # six 1 MiB blocks, incompressible
MIB_BLOCKS = ("--block-size", str(MIB))  # the block counts below assume 1 MiB blocks


def big_image(root: Path) -> Path:
    layers = [layer(dir_("data"), reg("data/big.bin", BIG), reg("data/small.txt", b"small\n"))]
    return write_layout(root, [write_image(root, layers, [OCI_LAYER_GZIP])])


def bootseer(*args: str, store: Path, cache: Path, check: bool = True,
             env: dict[str, str] | None = None):
    env = {**os.environ, "BOOTSEER_STORE": f"file://{store}", "BOOTSEER_CACHE_DIR": str(cache),
           **(env or {})}
    result = subprocess.run([sys.executable, "-m", "bootseer", *args], capture_output=True,
                            text=True, env=env, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"bootseer {args}: {result.stderr}")
    return result


def recorded_big_image(d: dict[str, Path]) -> str:
    """The 6 MiB test image with a hot list (blocks 1, 3, 4 of /data/big.bin) for "train"."""
    bootseer("image", "convert", str(big_image(d["image"])), "--name", "big", *MIB_BLOCKS,
             store=d["store"], cache=d["cache"])
    blobs = BlobStore(open_store(str(d["store"])))
    image = LazyImage(blobs, "big", NodeCache(d["image"] / "record-cache", 1 << 30),
                      readahead_blocks=0)
    image.recorder = hotlist.Recorder(image.image_id, "train")
    for n in (3, 1, 4):
        image.read(image.lookup("/data/big.bin"), n * MIB, 10)
    hotlist.save(blobs, image.recorder.stop(), image.manifest)
    return image.image_id

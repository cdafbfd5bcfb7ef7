"""Lazy images end to end: convert into the store, mount with real FUSE, compare with tar -x;
block fetching, dedup, corruption and a killed mount process."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import zstandard
from support.images import BIG, MIB, MIB_BLOCKS, big_image, bootseer
from support.layers import (
    describe_disk,
    extract_like_a_runtime,
    multi_layer_image,
)
from support.oci import OCI_LAYER_GZIP, write_image, write_layout

from bootseer.mounts import is_mounted
from bootseer.nodecache import NodeCache
from bootseer.prefetch.blockformat import Manifest, encode_v1
from bootseer.prefetch.blocksource import BlockIntegrityError
from bootseer.prefetch.convert import convert
from bootseer.prefetch.image_source import open_image
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.store import BlobStore, open_store
from bootseer.store.local import LocalStore, pid_alive


@pytest.fixture
def mounted(dirs):
    """Unmounts whatever the test mounted at dirs["mnt"]."""
    yield dirs
    if is_mounted(dirs["mnt"]):
        subprocess.run(["umount", "-l", str(dirs["mnt"])], check=False)


@pytest.mark.parametrize("manifest_format", ["current", "format 1"])
def test_lazy_mount_equals_tar_extraction(mounted, manifest_format: str) -> None:
    """The multi-layer image (whiteouts, opaque dirs, hard links, xattrs, devices, ...); an
    image converted before manifest format 2 (its manifest JSON) mounts the same."""
    d = mounted
    layers = multi_layer_image()
    layout = write_layout(d["image"], [write_image(d["image"], layers, [OCI_LAYER_GZIP] * 3)])
    out = bootseer("image", "convert", str(layout), "--name", "multi", store=d["store"],
                   cache=d["cache"])
    assert out.stdout.strip().startswith("sha256:")
    assert "dedup ratio" in out.stderr
    if manifest_format == "format 1":
        blobs = BlobStore(open_store(str(d["store"])))
        old = encode_v1(Manifest.decode(blobs.get(out.stdout.strip())))
        assert zstandard.ZstdDecompressor().decompress(old).startswith(b'{"block_size"')
        blobs.set_ref("images/multi", blobs.put(old).digest)
    extract_like_a_runtime(layers, d["ref"], d["image"])
    bootseer("image", "mount", "multi", str(d["mnt"]), store=d["store"], cache=d["cache"])
    on_mount, mount_groups = describe_disk(d["mnt"])
    on_disk, disk_groups = describe_disk(d["ref"])
    assert sorted(on_mount) == sorted(on_disk)
    for path in on_disk:
        assert on_mount[path] == on_disk[path], path
    assert mount_groups == disk_groups
    with pytest.raises(OSError) as info:
        open(d["mnt"] / "new", "w")
    assert info.value.errno == errno.EROFS


def test_reads_fetch_only_what_they_need_and_then_hit_the_cache(mounted) -> None:
    d = mounted
    bootseer("image", "convert", str(big_image(d["image"])), "--name", "big", *MIB_BLOCKS,
             store=d["store"],
             cache=d["cache"])
    bootseer("image", "mount", "big", str(d["mnt"]), store=d["store"], cache=d["cache"])
    with open(d["mnt"] / "data" / "big.bin", "rb") as f:
        f.seek(3 * MIB + 10)
        assert f.read(100) == BIG[3 * MIB + 10 : 3 * MIB + 110]
    stats = json.loads(bootseer("image", "stats", str(d["mnt"]), store=d["store"],
                                cache=d["cache"]).stdout)
    # block 3, plus blocks 4 and 5 read ahead in the same ranged read; not blocks 0-2
    assert (stats["blocks_fetched"], stats["fetch_requests"]) == (3, 1)
    assert (d["mnt"] / "data" / "big.bin").read_bytes() == BIG
    stats = json.loads(bootseer("image", "stats", str(d["mnt"]), store=d["store"],
                                cache=d["cache"]).stdout)
    assert (stats["blocks_fetched"], stats["fetch_requests"]) == (6, 2)
    assert stats["cache_hits"] >= 1


def test_converting_again_stores_nothing_new(dirs) -> None:
    blobs = BlobStore(open_store(str(dirs["store"])))
    first = convert(open_image(big_image(dirs["image"])), blobs, name="a", block_size=MIB)
    again = convert(open_image(big_image(dirs["image"])), blobs, name="b", block_size=MIB)
    assert first.new_blocks == 7 and again.new_blocks == 0 and again.stored_bytes == 0
    assert again.image_id == first.image_id  # same content, same manifest


class CountingStore(LocalStore):
    """Counts ranged reads and makes each slow, so concurrent readers overlap."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reads = 0
        self.lock = threading.Lock()

    def _read_range(self, key: str, offset: int, length: int) -> bytes:
        with self.lock:
            self.reads += 1
        time.sleep(0.2)
        return super()._read_range(key, offset, length)


def test_concurrent_readers_of_a_block_fetch_it_once(dirs) -> None:
    store = CountingStore(str(dirs["store"]))
    blobs = BlobStore(store)
    convert(open_image(big_image(dirs["image"])), blobs, name="big", block_size=MIB)
    image = LazyImage(BlobStore(store), "big", NodeCache(dirs["cache"], 1 << 30))
    entry = image.lookup("/data/big.bin")
    store.reads = 0
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(image.read(entry, MIB, 100)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [BIG[MIB : MIB + 100]] * 8
    assert store.reads == 1 and image.stats.blocks_fetched == 1 + image.readahead_blocks


class FailingStore(CountingStore):
    """Ranged reads fail while ``broken`` is set (an unreachable store)."""

    broken = False

    def _read_range(self, key: str, offset: int, length: int) -> bytes:
        data = super()._read_range(key, offset, length)
        if self.broken:
            raise OSError(f"{key} is unreachable")
        return data


def test_a_failed_fetch_reaches_every_reader_and_the_next_read_retries(dirs) -> None:
    store = FailingStore(str(dirs["store"]))
    convert(open_image(big_image(dirs["image"])), BlobStore(store), name="big", block_size=MIB)
    image = LazyImage(BlobStore(store), "big", NodeCache(dirs["cache"], 1 << 30))
    entry = image.lookup("/data/big.bin")
    store.broken, store.reads = True, 0
    errors: list[Exception] = []

    def read() -> None:
        try:
            image.read(entry, MIB, 100)
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 6 and store.reads == 1  # one fetch, its failure for everyone
    assert len(image.inflight) == 0 and image.demand_fetches == 0
    assert image.stats.failed_blocks == 1 + image.readahead_blocks
    store.broken = False
    assert image.read(entry, MIB, 100) == BIG[MIB : MIB + 100]
    assert len(image.inflight) == 0 and store.reads == 2


def test_a_corrupt_block_is_refetched_once_then_fails(dirs, caplog) -> None:
    blobs = BlobStore(open_store(str(dirs["store"])))
    result = convert(open_image(big_image(dirs["image"])), blobs, name="big", block_size=MIB)
    manifest = Manifest.decode(blobs.get(result.image_id))
    block = manifest.blocks[manifest.by_path["/data/big.bin"].blocks[2]]
    pack = dirs["store"] / manifest.packs[block.pack]
    data = bytearray(pack.read_bytes())
    data[block.offset + 100] ^= 0xFF
    pack.write_bytes(bytes(data))
    image = LazyImage(blobs, "big", NodeCache(dirs["cache"], 1 << 30))
    entry = image.lookup("/data/big.bin")
    assert image.read(entry, MIB, 10) == BIG[MIB : MIB + 10]  # read-ahead met the bad block
    image = LazyImage(blobs, "big", NodeCache(dirs["cache"], 1 << 30), readahead_blocks=0)
    with pytest.raises(BlockIntegrityError, match=block.digest):
        image.read(entry, 2 * MIB, 10)
    assert image.stats.refetches == 1
    assert "fetching it from packs/" in caplog.text


def test_cache_survives_a_killed_mount(mounted) -> None:
    """SIGKILL the FUSE server in the middle of reads; a new mount serves correct bytes."""
    d = mounted
    bootseer("image", "convert", str(big_image(d["image"])), "--name", "big", *MIB_BLOCKS,
             store=d["store"],
             cache=d["cache"])
    # What a process killed mid-write can leave: a temporary and a truncated block.
    (d["cache"] / "blocks" / "tmp").mkdir(parents=True)
    (d["cache"] / "blocks" / "tmp" / "partial.1234").write_bytes(b"half a blo")
    bootseer("image", "mount", "big", str(d["mnt"]), store=d["store"], cache=d["cache"])
    pid = int(subprocess.run(["pgrep", "-f", f"runserver serve image big {d['mnt']}$"],
                             capture_output=True, text=True).stdout.split()[0])
    reader = subprocess.Popen(["dd", f"if={d['mnt']}/data/big.bin", "of=/dev/null", "bs=64k"],
                              stderr=subprocess.DEVNULL)
    time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    reader.wait(timeout=30)
    subprocess.run(["umount", str(d["mnt"])], check=True)
    cached = list((d["cache"] / "blocks" / "entries").glob("*/*"))
    if cached:  # damage one cached block the way a crash after rename could
        cached[0].write_bytes(cached[0].read_bytes()[:1000])
    bootseer("image", "mount", "big", str(d["mnt"]), store=d["store"], cache=d["cache"])
    assert (d["mnt"] / "data" / "big.bin").read_bytes() == BIG
    # What the killed server left is gone; the serving one may be writing a block now.
    left = [p.name for p in (d["cache"] / "blocks" / "tmp").iterdir()]
    assert [n for n in left if n.count(".") < 2 or
            not pid_alive(int(n.split(".")[-2]))] == [], left


def test_real_debian_python_image_starts_lazily_in_runc(dirs, tmp_path: Path) -> None:
    """debootstrap minbase + python3 (two layers): convert, then python3 -c in runc on an
    overlay over the lazy mount, fetching a small part of the image."""
    from bootseer_dev.image import build_image

    layout = build_image(with_python=True)  # cached after the first build (~35 s)
    bootseer("image", "convert", str(layout), "--name", "py", store=dirs["store"],
             cache=dirs["cache"])
    stats_file = tmp_path / "stats.json"
    run = bootseer("image", "run", "--stats", str(stats_file), "py", "--", "python3", "-c",
                   "import json, sys; print(6 * 7, sys.version_info[0])",
                   store=dirs["store"], cache=dirs["cache"])
    assert run.stdout.strip() == "42 3"
    stats = json.loads(stats_file.read_text())
    fraction = stats["bytes_fetched"] / stats["image_content_bytes"]
    assert 0 < fraction < 0.5, stats
    assert "fetched" in run.stderr

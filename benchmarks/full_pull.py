"""The baseline lazy images beat: pull a whole image as dockerd does, unpack it, then start.

Three commands, each a fresh process so that ``bench_image.py`` times spawn to exit:

    python benchmarks/full_pull.py push --store URL --layout DIR --name torch
    python benchmarks/full_pull.py pull --store URL --name torch --dest DIR -- ARGV...
    python benchmarks/full_pull.py run --rootfs DIR -- ARGV...

``push`` puts an OCI layout's blobs (gzip layers, config, manifest) into the store as they
are, under their digests, and names the manifest ``refs/registry/NAME``: what a registry
holds for the image. ``pull`` is ``docker run`` on a node that does not have the image:
resolve the name, fetch the manifest and config, download every layer blob, at most
``--concurrency`` at once (dockerd's ``max-concurrent-downloads`` default is 3), each
checked against its sha256 as it arrives, extract the layers in order into ``--dest`` as
soon as each has arrived (OCI whiteouts and opaque directories applied, the uncompressed
tar checked against the config's ``diff_id``, as dockerd does), then run ARGV in runc on a
fresh writable overlay over the result. ``run`` is the floor: the image is already
unpacked on local disk, only the overlay and the container are left to do.

The command's output is passed through and its exit code returned; ``--report FILE``
writes a JSON breakdown (seconds since the process started at each step, bytes).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

STARTED = time.perf_counter()

from bootseer.errors import IntegrityError  # noqa: E402
from bootseer_dev.image import overlay_mount, run_rootfs, unpack_layers  # noqa: E402

REF_PREFIX = "registry/"
CHUNK = 1 << 20


def since_start() -> float:
    return round(time.perf_counter() - STARTED, 3)


def open_blobs(url: str):
    from bootseer.store import BlobStore, open_store

    return BlobStore(open_store(url))


def push(args: argparse.Namespace) -> dict:
    """Store the layout's blobs as they are and point ``refs/registry/NAME`` at the manifest."""
    from bootseer.prefetch.image_source import open_image

    layout = Path(args.layout)
    image = open_image(layout)
    blobs = open_blobs(args.store)

    def put(digest: str) -> int:
        path = layout / "blobs" / "sha256" / digest.removeprefix("sha256:")
        with open(path, "rb") as f:
            return blobs.put(f, expect=digest).size

    layer_bytes = [put(layer.digest) for layer in image.layers]
    put(image.config_digest)
    assert image.manifest_digest is not None
    put(image.manifest_digest)
    blobs.set_ref(REF_PREFIX + args.name, image.manifest_digest,
                  {"config": image.config_digest, "layers": [x.digest for x in image.layers]})
    return {"manifest": image.manifest_digest, "layer_bytes": layer_bytes,
            "seconds": since_start()}


class _Hashing(io.RawIOBase):
    """Reads through ``source``, hashing what passes."""

    def __init__(self, source: BinaryIO) -> None:
        self.source, self.sha256, self.size = source, hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self.source.readinto(buffer)
        self.sha256.update(memoryview(buffer)[:n])
        self.size += n
        return n


def _decompress(raw: BinaryIO, media_type: str) -> BinaryIO:
    if media_type.endswith("+gzip") or media_type.endswith(".tar.gzip"):
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if media_type.endswith("+zstd"):
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


def pull(args: argparse.Namespace, report: dict) -> Path:
    """Download and unpack the image into ``args.dest``; return it."""
    blobs = open_blobs(args.store)
    manifest_digest = blobs.get_ref(REF_PREFIX + args.name).digest
    manifest = json.loads(blobs.get(manifest_digest))
    config = json.loads(blobs.get(manifest["config"]["digest"]))
    layers = manifest["layers"]
    diff_ids = config["rootfs"]["diff_ids"]
    report["manifest_s"] = since_start()
    dest = Path(args.dest).absolute()
    downloads = dest.parent / f".{dest.name}.download"
    downloads.mkdir(parents=True, exist_ok=True)
    report["layers"] = [{"digest": d["digest"], "bytes": d["size"]} for d in layers]

    def download(i: int, desc: dict) -> Path:
        path = downloads / desc["digest"].removeprefix("sha256:")
        whole, size = hashlib.sha256(), 0
        with open(path, "wb") as out:
            for chunk in blobs.iter_chunks(desc["digest"]):  # chunk digests checked too
                whole.update(chunk)
                size += len(chunk)
                out.write(chunk)
        if "sha256:" + whole.hexdigest() != desc["digest"] or size != desc["size"]:
            raise IntegrityError(f"layer {desc['digest']}: downloaded bytes do not match")
        report["layers"][i]["downloaded_s"] = since_start()
        return path

    with ThreadPoolExecutor(args.concurrency, thread_name_prefix="download") as pool:
        futures: list[Future[Path]] = [pool.submit(download, i, d) for i, d in enumerate(layers)]

        def streams() -> Iterator[tuple[str, BinaryIO]]:
            for i, (desc, future) in enumerate(zip(layers, futures)):
                path = future.result()  # extract in order, each as soon as it is here
                with open(path, "rb") as raw, _decompress(raw, desc["mediaType"]) as plain:
                    hashing = _Hashing(plain)
                    stream = io.BufferedReader(hashing, CHUNK)
                    yield f"{i + 1} ({desc['digest'][:19]})", stream
                    while stream.read(CHUNK):  # the tar reader stops at its end marker
                        pass
                if "sha256:" + hashing.sha256.hexdigest() != diff_ids[i]:
                    raise IntegrityError(f"layer {desc['digest']}: uncompressed tar does not "
                                         f"match diff_id {diff_ids[i]}")
                report["layers"][i]["extracted_s"] = since_start()
                report["layers"][i]["tar_bytes"] = hashing.size

        try:
            unpack_layers(streams(), dest)
        finally:
            for future in futures:
                future.cancel()
    report["downloaded_s"] = max(x["downloaded_s"] for x in report["layers"])
    report["unpacked_s"] = since_start()
    report["config"] = config.get("config") or {}
    return dest


def start(rootfs: Path, argv: list[str], image_config: dict, report: dict) -> int:
    """Run ``argv`` in runc on a fresh overlay over ``rootfs``; pass its output through."""
    env = dict(item.split("=", 1) for item in image_config.get("Env") or () if "=" in item)
    with tempfile.TemporaryDirectory(prefix=".overlay-", dir=rootfs.parent) as tmp, \
            overlay_mount(rootfs, Path(tmp) / "upper", Path(tmp) / "work",
                          Path(tmp) / "root") as root:
        report["container_start_s"] = since_start()
        proc = run_rootfs(root, argv, env=env, timeout=600, text=False,
                          cwd=image_config.get("WorkingDir") or "/")
    report["exited_s"] = since_start()
    sys.stdout.buffer.write(proc.stdout)
    sys.stderr.buffer.write(proc.stderr)
    return proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("push", help="store an OCI layout's blobs as a registry holds them")
    p.add_argument("--store", required=True)
    p.add_argument("--layout", required=True)
    p.add_argument("--name", required=True)
    for name in ("pull", "run"):
        p = sub.add_parser(name)
        if name == "pull":
            p.add_argument("--store", required=True)
            p.add_argument("--name", required=True)
            p.add_argument("--dest", required=True, help="a fresh directory to unpack into")
            p.add_argument("--concurrency", type=int, default=3,
                           help="layer downloads at once (dockerd's default: 3)")
        else:
            p.add_argument("--rootfs", required=True, type=Path)
        p.add_argument("--report", type=Path, help="write a JSON breakdown here")
        p.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.command == "push":
        print(json.dumps(push(args)))
        return
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        parser.error("give the command to run after --")
    report: dict = {"imported_s": since_start()}
    if args.command == "pull":
        rootfs = pull(args, report)
        image_config = report.pop("config")
    else:
        rootfs, image_config = args.rootfs.absolute(), {}
    rc = start(rootfs, argv, image_config, report)
    if args.report:
        args.report.write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(rc)


if __name__ == "__main__":
    main()

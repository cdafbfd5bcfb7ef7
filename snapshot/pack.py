"""Pack captured changes into shards and a manifest, and publish them.

Files and symlinks go, in tree order, into PAX tar streams cut every ``shard_size`` bytes
of content; each stream is zstd-compressed into one blob (``zstd -d | tar -t`` lists it).
Shards are independent, so they are built here and restored later in parallel. A file's
sha256 is computed from the very bytes that enter the tar, so the manifest describes what
was packed even if the file changed between the scan and the pack (a size change is an
error: the command is still writing).

Publish order is what makes readers safe: shards (each with its torrent, built from the
local spool it was compressed into, for nodes that fetch it from each other:
:mod:`bootseer.p2p.publish`), then the manifest blob, then the ref ``env/<key>`` last and
create-only. A reader that finds the ref finds everything it names;
of two nodes publishing one key, the first ref wins and the other's blobs are unreferenced
(identical content is shared anyway).
"""

from __future__ import annotations

import hashlib
import os
import socket
import tarfile
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import zstandard

from bootseer import __version__
from bootseer.errors import BootseerError
from bootseer.p2p import publish_torrent
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.manifest import (
    FIRST_SHARDS,
    REF_PREFIX,
    Deletion,
    Manifest,
    Shard,
    SnapEntry,
)
from bootseer.snapshot.scan import Tree, TreeDiff
from bootseer.store import BlobStore

_TAR_TYPE = {"file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE}


@dataclass(frozen=True)
class Capture:
    """What a command changed: per target, its tree after the command and the diff."""

    targets: tuple[str, ...]
    after: tuple[Tree, ...]
    diffs: tuple[TreeDiff, ...]


def plan_entries(capture: Capture) -> list[SnapEntry]:
    """Manifest entries without digests or shards; hard link groups found by inode."""
    entries = []
    for index, (tree, changes) in enumerate(zip(capture.after, capture.diffs)):
        leaders: dict[tuple[int, int], str] = {}
        for rel in changes.changed:
            node = tree[rel]
            kind, link = node.kind, node.link
            if kind == "file" and node.nlink > 1:
                leader = leaders.setdefault((node.dev, node.ino), rel)
                if leader != rel:
                    kind, link = "hardlink", leader
            entries.append(SnapEntry(index, rel, kind, node.mode, node.uid, node.gid,
                                     node.mtime_ns, node.size if node.kind == "file" else 0,
                                     link=link))
    return entries


def cut_shards(entries: list[SnapEntry], shard_size: int) -> list[list[int]]:
    """Indexes of the files and symlinks of each shard, about ``shard_size`` content each."""
    shards: list[list[int]] = [[]]
    filled = 0
    for i, entry in enumerate(entries):
        if entry.kind not in _TAR_TYPE:
            continue
        if shards[-1] and filled + entry.size > shard_size:
            shards.append([])
            filled = 0
        shards[-1].append(i)
        filled += entry.size
    return [s for s in shards if s]


class _HashingReader:
    """The file object tarfile copies from, hashing what it hands over."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.sha = fh, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        self.sha.update(data)
        return data


def _build_shard(blobs: BlobStore, entries: list[SnapEntry], paths: list[str], level: int,
                 on_progress: Callable[[int], None] | None) -> tuple[Shard, list[SnapEntry]]:
    done = []
    with tempfile.NamedTemporaryFile(prefix="bootseer-shard.") as spool:
        compressor = zstandard.ZstdCompressor(level=level)
        with compressor.stream_writer(spool, closefd=False) as zw, \
                tarfile.open(fileobj=zw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for entry, path in zip(entries, paths):
                info = tarfile.TarInfo(entry.member)
                info.type, info.mode = _TAR_TYPE[entry.kind], entry.mode
                # Whole seconds: a fraction makes tarfile write a PAX header before every
                # member, which each restore then reads (a restore takes the mtime from the
                # manifest, to the nanosecond). Without them a cold restore of the jupyter
                # preset (18k files) took 3.7 s of CPU, not 4.3 (file:// store, medians).
                info.uid, info.gid = entry.uid, entry.gid
                info.mtime = entry.mtime_ns // 1_000_000_000
                if entry.kind == "symlink":
                    info.linkname = entry.link or ""
                    tar.addfile(info)
                    done.append(entry)
                    continue
                info.size = entry.size
                with open(path, "rb") as fh:
                    reader = _HashingReader(fh)
                    try:
                        tar.addfile(info, reader)  # type: ignore[arg-type]
                    except OSError as exc:
                        raise BootseerError(f"{path} shrank while it was being snapshotted "
                                            f"({exc}); is the command still running?") from exc
                    if fh.read(1):
                        raise BootseerError(f"{path} grew while it was being snapshotted; "
                                            f"is the command still running?")
                done.append(entry._replace(digest="sha256:" + reader.sha.hexdigest()))
                if on_progress:
                    on_progress(entry.size)
        spool.seek(0)
        info = blobs.put(spool)
        spool.flush()
        publish_torrent(blobs.store, info.digest, Path(spool.name))  # nodes may share it
    return Shard(info.digest, info.size, sum(e.size for e in entries)), done


def build_manifest(blobs: BlobStore, capture: Capture, key: str, created: dict[str, Any], *,
                   options: SnapshotOptions,
                   on_progress: Callable[[int], None] | None = None) -> Manifest:
    """Pack the captured changes into shard blobs cut and compressed as ``options`` say;
    the manifest (not yet stored)."""
    entries = plan_entries(capture)
    plan = cut_shards(entries, options.shard_size)
    with ThreadPoolExecutor(max(1, options.concurrency)) as pool:
        futures = [pool.submit(
            _build_shard, blobs, [entries[i] for i in idxs],
            [os.path.join(capture.targets[entries[i].target], entries[i].path) for i in idxs],
            options.compression_level, on_progress) for idxs in plan]
        shards = []
        for number, (idxs, future) in enumerate(zip(plan, futures)):
            shard, packed = future.result()
            shards.append(shard)
            for i, entry in zip(idxs, packed):
                entries[i] = entry._replace(shard=number)
    files = {(e.target, e.path): e for e in entries if e.kind == "file"}
    entries = [e._replace(size=files[(e.target, e.link)].size,
                          digest=files[(e.target, e.link)].digest)
               if e.kind == "hardlink" else e for e in entries]
    deleted = tuple(Deletion(i, rel) for i, d in enumerate(capture.diffs) for rel in d.deleted)
    return Manifest(key, capture.targets, tuple(entries), deleted, tuple(shards), created)


def creation_info(argv: list[str], material: dict[str, Any] | None) -> dict[str, Any]:
    return {"time": time.time(), "host": socket.gethostname(), "argv": argv,
            "bootseer": __version__, "key_inputs": material}


def publish(blobs: BlobStore, manifest: Manifest) -> bool:
    """Store the manifest, then the ref, create-only; False when another publisher won."""
    data = manifest.encode()
    info = blobs.put(data)
    publish_torrent(blobs.store, info.digest, data)  # a job's nodes share it too
    meta = {"files": len(manifest.entries), "bytes": manifest.content_bytes,
            "shards": len(manifest.shards), "targets": list(manifest.targets),
            "host": manifest.created.get("host"),
            "first_shards": [manifest.shards[n].digest
                             for n in manifest.read_order()[:FIRST_SHARDS]]}
    try:
        blobs.set_ref(REF_PREFIX + manifest.key, info.digest, meta, overwrite=False)
    except FileExistsError:
        return False
    return True


def target_paths(paths: list[Path]) -> tuple[str, ...]:
    """Targets must not nest: one would capture and restore the other's entries twice."""
    targets = tuple(os.path.abspath(p) for p in paths)
    for a in targets:
        for b in targets:
            if a != b and (b + "/").startswith(a.rstrip("/") + "/"):
                raise BootseerError(f"target paths {a} and {b} nest; give only {a}")
    if len(set(targets)) != len(targets):
        raise BootseerError("a target path is given twice")
    return targets

"""Hot re-layout: copy an image's hot blocks, in hot-list order, into one contiguous pack.

A start reads its blocks scattered over the image's packs (in the order the converter met
their files), so prefetching them one by one floods the store with small reads. The hot
pack holds the same compressed bytes back to back, in the order the start needs them: a
prefetch of the whole hot list is then a handful of large sequential reads, and its first
pieces are the ones the start wants first.

The bytes are copied from the image's packs in windows (read in pack order, so neighbours
in a pack come in one read; written in hot order), each block checked against its digest
before it is copied: a hot pack never holds a block the image's own packs would not give.
Like every pack it is published under ``packs/<sha256 of its bytes>``, create-only, and
with a torrent (:mod:`bootseer.p2p.publish`): ``bootseer warm`` of a job with
peer-to-peer on fetches a hot pack whole, each node reading only its share from the store.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import BinaryIO

from bootseer.errors import IntegrityError
from bootseer.nodecache import NodeCache, NotCached
from bootseer.p2p import publish_torrent
from bootseer.prefetch.blockformat import PACK_PREFIX, Manifest
from bootseer.prefetch.blocksource import runs, verified
from bootseer.prefetch.hotlist import HotLayout
from bootseer.store import BlobStore

log = logging.getLogger(__name__)

#: Compressed bytes copied per window: bounds memory, keeps each source read large.
WINDOW_BYTES = 64 << 20


def write_hot_pack(blobs: BlobStore, manifest: Manifest, digests: list[str],
                   local: NodeCache | None = None) -> HotLayout:
    """Publish a pack of the blocks ``digests`` (in that order); return where each one is.

    With ``local`` (the node's block cache), the pack is also written there as it goes:
    its torrent is built from that copy (:func:`bootseer.p2p.publish_torrent`), and the
    copy is kept as a cache entry, for this node to seed when its job's nodes warm.
    """
    where = manifest.block_index
    order = [where[d] for d in dict.fromkeys(digests) if d in where]
    pieces: dict[str, tuple[int, int]] = {}
    pack_hash = hashlib.sha256()
    offset = 0
    with blobs.store.open_writer() as writer, _LocalCopy(local) as copy:
        for window in _windows(manifest, order):
            data = _read_blocks(blobs, manifest, window)
            for i in window:
                location = manifest.blocks[i]
                writer.write(data[i])
                copy.write(data[i])
                pack_hash.update(data[i])
                pieces[location.digest] = (offset, location.length)
                offset += location.length
        key = PACK_PREFIX + pack_hash.hexdigest()
        try:
            writer.commit(key, overwrite=False)
        except FileExistsError:  # the same blocks in the same order: the same pack
            pass
        copy.publish(blobs, pack_hash.hexdigest())
    log.info("hot pack %s: %d blocks, %d bytes", key, len(pieces), offset)
    return HotLayout(key, pieces)


class _LocalCopy:
    """The pack as it is written, in a temporary of the node's cache (or nowhere): its
    torrent's source, then the cache's entry. Anything failing here is logged, never the
    hot pack's publish."""

    def __init__(self, cache: NodeCache | None) -> None:
        self.cache = cache
        self.path: Path | None = None
        self._file: BinaryIO | None = None

    def __enter__(self) -> _LocalCopy:
        if self.cache is not None:
            try:
                self.path = self.cache.new_temporary("hotpack")
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, self.cache.mode)
                self._file = open(fd, "wb")
            except OSError as exc:
                log.warning("hot pack: no local copy (%s); it gets no torrent", exc)
        return self

    def write(self, data: bytes) -> None:
        if self._file is None:
            return
        try:
            self._file.write(data)
        except OSError as exc:  # a full disk: the pack is published all the same
            log.warning("hot pack: dropping its local copy (%s); it gets no torrent", exc)
            self._file.close()
            self._file = None

    def publish(self, blobs: BlobStore, hexd: str) -> None:
        """The pack is in the store: its torrent from the copy, the copy into the cache."""
        if self._file is None or self.cache is None or self.path is None:
            return
        self._file.close()
        publish_torrent(blobs.store, "sha256:" + hexd, self.path)
        try:
            self.cache.add_file(self.path, hexd)
        except (OSError, NotCached) as exc:
            log.warning("hot pack sha256:%s is not kept in %s: %s", hexd, self.cache.directory,
                        exc)

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def _windows(manifest: Manifest, order: list[int]) -> list[list[int]]:
    windows: list[list[int]] = [[]]
    size = 0
    for i in order:
        if size >= WINDOW_BYTES:
            windows.append([])
            size = 0
        windows[-1].append(i)
        size += manifest.blocks[i].length
    return [w for w in windows if w]


def _read_blocks(blobs: BlobStore, manifest: Manifest, window: list[int]) -> dict[int, bytes]:
    """The verified compressed bytes of each block in ``window``, read run by run."""
    out: dict[int, bytes] = {}
    for run in runs(manifest, window):
        raw = blobs.store.read_range(run.pack, run.start, run.end - run.start)
        for i, offset, length in run.pieces:
            piece = raw[offset - run.start : offset - run.start + length]
            if verified(piece, manifest.blocks[i]) is None:
                raise IntegrityError(f"block {manifest.blocks[i].digest} in {run.pack} does not "
                                     f"match its digest; not laying it out in a hot pack")
            out[i] = piece
    return out

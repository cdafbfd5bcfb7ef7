"""Hot re-layout: copy an image's hot blocks, in hot-list order, into one contiguous pack.

A start reads its blocks scattered over the image's packs (in the order the converter met
their files), so prefetching them one by one floods the store with small reads. The hot
pack holds the same compressed bytes back to back, in the order the start needs them: a
prefetch of the whole hot list is then a handful of large sequential reads, and its first
pieces are the ones the start wants first.

The bytes are copied from the image's packs in windows (read in pack order, so neighbours
in a pack come in one read; written in hot order), each block checked against its digest
before it is copied: a hot pack never holds a block the image's own packs would not give.
Like every pack it is published under ``packs/<sha256 of its bytes>``, create-only.
"""

from __future__ import annotations

import hashlib
import logging

from bootseer.errors import IntegrityError
from bootseer.prefetch.blockformat import PACK_PREFIX, Manifest
from bootseer.prefetch.blocksource import runs, verified
from bootseer.prefetch.hotlist import HotLayout
from bootseer.store import BlobStore

log = logging.getLogger(__name__)

#: Compressed bytes copied per window: bounds memory, keeps each source read large.
WINDOW_BYTES = 64 << 20


def write_hot_pack(blobs: BlobStore, manifest: Manifest, digests: list[str]) -> HotLayout:
    """Publish a pack of the blocks ``digests`` (in that order); return where each one is."""
    where = {b.digest: i for i, b in enumerate(manifest.blocks)}
    order = [where[d] for d in dict.fromkeys(digests) if d in where]
    pieces: dict[str, tuple[int, int]] = {}
    pack_hash = hashlib.sha256()
    offset = 0
    with blobs.store.open_writer() as writer:
        for window in _windows(manifest, order):
            data = _read_blocks(blobs, manifest, window)
            for i in window:
                location = manifest.blocks[i]
                writer.write(data[i])
                pack_hash.update(data[i])
                pieces[location.digest] = (offset, location.length)
                offset += location.length
        key = PACK_PREFIX + pack_hash.hexdigest()
        try:
            writer.commit(key, overwrite=False)
        except FileExistsError:  # the same blocks in the same order: the same pack
            pass
    log.info("hot pack %s: %d blocks, %d bytes", key, len(pieces), offset)
    return HotLayout(key, pieces)


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

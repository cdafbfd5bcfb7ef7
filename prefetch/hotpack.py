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

import zstandard

from bootseer.errors import IntegrityError
from bootseer.prefetch.blockformat import PACK_PREFIX, BlockLocation, Manifest
from bootseer.prefetch.hotlist import HotLayout
from bootseer.store import BlobStore

log = logging.getLogger(__name__)

#: Compressed bytes copied per window: bounds memory, keeps each source read large.
WINDOW_BYTES = 64 << 20


def write_hot_pack(blobs: BlobStore, manifest: Manifest, digests: list[str]) -> HotLayout:
    """Publish a pack of the blocks ``digests`` (in that order); return where each one is."""
    where = {b.digest: b for b in manifest.blocks}
    order = [where[d] for d in dict.fromkeys(digests) if d in where]
    pieces: dict[str, tuple[int, int]] = {}
    pack_hash = hashlib.sha256()
    offset = 0
    with blobs.store.open_writer() as writer:
        for window in _windows(order):
            data = _read_blocks(blobs, manifest, window)
            for location in window:
                writer.write(data[location.digest])
                pack_hash.update(data[location.digest])
                pieces[location.digest] = (offset, location.length)
                offset += location.length
        key = PACK_PREFIX + pack_hash.hexdigest()
        try:
            writer.commit(key, overwrite=False)
        except FileExistsError:  # the same blocks in the same order: the same pack
            pass
    log.info("hot pack %s: %d blocks, %d bytes", key, len(pieces), offset)
    return HotLayout(key, pieces)


def _windows(order: list[BlockLocation]) -> list[list[BlockLocation]]:
    windows: list[list[BlockLocation]] = [[]]
    size = 0
    for location in order:
        if size >= WINDOW_BYTES:
            windows.append([])
            size = 0
        windows[-1].append(location)
        size += location.length
    return [w for w in windows if w]


def _read_blocks(blobs: BlobStore, manifest: Manifest,
                 window: list[BlockLocation]) -> dict[str, bytes]:
    """The verified compressed bytes of each block in ``window``, read run by run."""
    out: dict[str, bytes] = {}
    ordered = sorted(window, key=lambda b: (b.pack, b.offset))
    runs: list[list[BlockLocation]] = []
    for location in ordered:
        prev = runs[-1][-1] if runs else None
        if prev is not None and prev.pack == location.pack and \
                prev.offset + prev.length == location.offset:
            runs[-1].append(location)
        else:
            runs.append([location])
    decompressor = zstandard.ZstdDecompressor()
    for run in runs:
        pack = manifest.packs[run[0].pack]
        start = run[0].offset
        raw = blobs.store.read_range(pack, start, run[-1].offset + run[-1].length - start)
        for location in run:
            piece = raw[location.offset - start : location.offset - start + location.length]
            try:
                data = decompressor.decompress(piece, max_output_size=location.size)
            except zstandard.ZstdError:
                data = b""
            if hashlib.sha256(data).hexdigest() != location.digest:
                raise IntegrityError(f"block {location.digest} in {pack} does not match its "
                                     f"digest; not laying it out in a hot pack")
            out[location.digest] = piece
    return out

"""An image's blocks from the store: one ranged read per run of neighbours, every block verified.

Blocks that sit back to back in a pack are a *run*; a run costs one ranged read, however
many blocks it holds (a pack keeps a file's blocks, and a directory's files, together).
Each block of the read is decompressed and checked against its digest before anyone sees
it. A block that fails the check, or whose read failed, is fetched once more from its
place in the image's own packs: a run may come from elsewhere (a hot pack), so a damaged
or missing hot pack costs time, not data. A block that fails again is an error of that
block alone (:class:`BlockIntegrityError` when it is corrupt in the store).

A source may have a ``peer_read``: the node agent's reads of a pack through the job's
peers (:mod:`bootseer.p2p.demand`); a run is asked of it first, and read from the store
when it cannot serve it (None, or an error). Its bytes are verified block by block like
the store's, and a block that fails is fetched again from the store.

The source knows nothing of caches or of who waits for a block: it hands each block out
as soon as it is verified, and the caller (:class:`~bootseer.prefetch.lazyimage.LazyImage`)
keeps it and wakes the readers. Its rules, :func:`runs` and :func:`verified`, serve
whoever else reads packs (:mod:`bootseer.prefetch.hotpack` lays blocks out with them).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import zstandard

from bootseer.errors import IntegrityError
from bootseer.prefetch.blockformat import BlockLocation, Manifest
from bootseer.store import Store

log = logging.getLogger(__name__)


PeerRead = Callable[[str, int, int], bytes | None]
"""``peer_read(pack, offset, length)``: the bytes through the node's peers, or None."""


class BlockIntegrityError(IntegrityError):
    """A block still did not match its digest after being fetched again."""


@dataclass
class FetchCounts:
    """What fetching from the store cost, counted separately for reads and for prefetch."""

    blocks_fetched: int = 0
    bytes_fetched: int = 0  # compressed bytes read from the store
    fetch_requests: int = 0  # ranged reads sent to the store
    peer_reads: int = 0  # ranges served through the node's peers instead
    peer_bytes: int = 0
    refetches: int = 0  # blocks fetched again after a failed digest check or read
    failed_blocks: int = 0  # blocks that could not be fetched (the read failed with EIO)


class Piece(NamedTuple):
    """A block to fetch from some pack: its manifest index and where its bytes are there."""

    index: int
    offset: int
    length: int  # compressed


@dataclass(frozen=True)
class Run:
    """Pieces back to back in ``pack``, in pack order: one ranged read."""

    pack: str
    pieces: list[Piece]

    @property
    def start(self) -> int:
        return self.pieces[0].offset

    @property
    def end(self) -> int:
        return self.pieces[-1].offset + self.pieces[-1].length

    @property
    def size(self) -> int:
        return self.end - self.start


def adjacent_runs(pieces: Iterable[Piece]) -> list[list[Piece]]:
    """Pieces of one pack, in the order given, cut wherever one does not start where the
    previous one ended."""
    runs: list[list[Piece]] = []
    for piece in pieces:
        if runs and runs[-1][-1].offset + runs[-1][-1].length == piece.offset:
            runs[-1].append(piece)
        else:
            runs.append([piece])
    return runs


def runs(manifest: Manifest, indexes: Iterable[int]) -> list[Run]:
    """The blocks at these manifest indexes, in the image's own packs, as runs."""
    table = manifest.blocks
    ordered = sorted(set(indexes), key=lambda i: (table[i].pack, table[i].offset))
    return [Run(manifest.packs[pack], run)
            for pack, group in itertools.groupby(ordered, key=lambda i: table[i].pack)
            for run in adjacent_runs(Piece(i, table[i].offset, table[i].length)
                                     for i in group)]


_decompressors = threading.local()  # a ZstdDecompressor is not thread-safe


def verified(piece: bytes | memoryview, location: BlockLocation) -> bytes | None:
    """The block's bytes if ``piece`` decompresses to them and they match the digest."""
    decompressor = getattr(_decompressors, "d", None)
    if decompressor is None:
        decompressor = _decompressors.d = zstandard.ZstdDecompressor()
    try:
        data = decompressor.decompress(piece, max_output_size=location.size)
    except zstandard.ZstdError:
        return None
    if len(data) != location.size or hashlib.sha256(data).hexdigest() != location.digest:
        return None
    return data


class BlockSource:
    def __init__(self, store: Store, manifest: Manifest, image_id: str) -> None:
        self.store, self.manifest, self.image_id = store, manifest, image_id
        self._lock = threading.Lock()  # for the counts: a FetchCounts is shared by threads
        self._local: dict[str, Path] = {}  # packs with a copy on this node
        self.peer_read: PeerRead | None = None

    def use_local(self, pack: str, path: Path) -> None:
        """Read ``pack`` from ``path``, a copy on this node (a hot pack a warm fetched
        whole), not from the store. Its blocks are verified as any others; a read that
        fails there (the copy was evicted) falls back to the image's own packs, as a
        failed read of any pack but a block's home does."""
        self._local[pack] = path

    def fetch(self, run: Run, stats: FetchCounts) -> Iterator[tuple[int, bytes | Exception]]:
        """Read ``run`` and yield (index, verified bytes or the error) for each block, in
        order, each as soon as it is ready; count the cost in ``stats``."""
        table = self.manifest.blocks
        start, end = run.start, run.end
        raw: memoryview | None = None
        failure: Exception | None = None
        local = self._local.get(run.pack)
        peers = None
        if local is None and self.peer_read is not None:
            peers = self._from_peers(run.pack, start, end - start)
        try:
            if local is not None:
                raw = memoryview(_pread(local, start, end - start))
            elif peers is not None:
                raw = memoryview(peers)
            else:
                raw = memoryview(self.store.read_range(run.pack, start, end - start))
        except Exception as exc:
            failure = exc
        if failure is None:
            if peers is not None:
                self._count(stats, peer_reads=1, peer_bytes=end - start)
            elif local is None:  # counted: what came from the store
                self._count(stats, fetch_requests=1, bytes_fetched=end - start)
        elif run.pack in self.manifest.packs:  # the blocks' home: nothing to fall back to
            self._count(stats, failed_blocks=len(run.pieces))
            for piece in run.pieces:
                yield piece.index, failure
            return
        else:
            log.warning("reading %d blocks from %s failed (%s); using the image's packs",
                        len(run.pieces), run.pack, failure)
        for index, offset, length in run.pieces:
            location = table[index]
            data = None
            if raw is not None:
                data = verified(raw[offset - start : offset - start + length], location)
            if data is None:
                try:
                    data = self._refetch(location, stats)
                except Exception as exc:
                    self._count(stats, failed_blocks=1)
                    yield index, exc
                    continue
            self._count(stats, blocks_fetched=1)
            yield index, data

    def _from_peers(self, pack: str, offset: int, length: int) -> bytes | None:
        """The range through ``peer_read``; None (read the store) if it cannot."""
        assert self.peer_read is not None
        try:
            data = self.peer_read(pack, offset, length)
        except Exception as exc:  # peers cost time, never a read
            log.debug("peer read of %s failed (%s); reading the store", pack, exc)
            return None
        return data if data is not None and len(data) == length else None

    def _refetch(self, location: BlockLocation, stats: FetchCounts) -> bytes:
        """The block from its place in the image's packs, after a failed check or read."""
        self._count(stats, refetches=1)
        pack = self.manifest.packs[location.pack]
        log.warning("block %s did not verify or could not be read; fetching it from %s",
                    location.digest, pack)
        data = verified(self.store.read_range(pack, location.offset, location.length), location)
        self._count(stats, fetch_requests=1, bytes_fetched=location.length)
        if data is None:
            raise BlockIntegrityError(
                f"image {self.image_id}: block {location.digest} (pack {pack}, bytes "
                f"{location.offset}-{location.offset + location.length}) is corrupt in the "
                f"store: it did not match its digest twice")
        return data

    def _count(self, stats: FetchCounts, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(stats, name, getattr(stats, name) + delta)


def _pread(path: Path, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of a local file (``EOFError`` if it is shorter)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    if len(data) != length:
        raise EOFError(f"{path}: {len(data)} bytes at {offset}, not {length}")
    return data

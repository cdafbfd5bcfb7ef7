"""A converted image, served lazily: metadata from the manifest, blocks fetched on demand.

This is the data layer of the lazy mount (the FUSE part, :mod:`prefetch.fuse`, only
translates). A read needs the blocks it overlaps; each comes from the local
:class:`BlockCache` or, if absent, from the store: missing blocks that sit next to each
other in a pack are fetched with one ranged read, then decompressed and checked against
their digest before anyone sees them. A block that fails the check is fetched once more;
if it fails again the read fails with :class:`BlockIntegrityError` (EIO through FUSE).
Concurrent readers of the same missing block wait for one fetch.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass

import zstandard

from bootseer.errors import IntegrityError
from bootseer.store import BlobStore
from bootseer.store.blobs import is_digest
from prefetch.blockcache import BlockCache
from prefetch.blockformat import IMAGE_REF_PREFIX, BlockLocation, FileEntry, Manifest
from prefetch.hotlist import Recorder
from prefetch.rootfs import Kind

log = logging.getLogger(__name__)


#: Read on a mount's root, this (unlisted) xattr gives the mount's LazyStats as JSON.
STATS_XATTR = "user.bootseer.stats"


class BlockIntegrityError(IntegrityError):
    """A block still did not match its digest after being fetched again."""


@dataclass
class LazyStats:
    blocks_fetched: int = 0
    bytes_fetched: int = 0  # compressed bytes read from the store
    fetch_requests: int = 0  # ranged reads sent to the store
    cache_hits: int = 0
    refetches: int = 0  # blocks fetched again after a failed digest check


def resolve_image(blobs: BlobStore, image: str) -> str:
    """An image id (``sha256:...``) as is, or the id the ref ``images/<image>`` names."""
    return image if is_digest(image) else blobs.get_ref(IMAGE_REF_PREFIX + image).digest


class LazyImage:
    def __init__(self, blobs: BlobStore, image: str, cache: BlockCache, *,
                 readahead_blocks: int = 3, recent_blocks: int = 16) -> None:
        self.blobs, self.cache = blobs, cache
        #: On a miss, also fetch up to this many following blocks of the same file: files
        #: are mostly read to the end, and their blocks sit next to each other in a pack,
        #: so they come in the same ranged read instead of one round trip each.
        self.readahead_blocks = readahead_blocks
        self.image_id = resolve_image(blobs, image)
        self.manifest = Manifest.decode(blobs.get(self.image_id))
        self.stats = LazyStats()
        #: While set, the first access of every block is noted (see prefetch.hotlist).
        self.recorder: Recorder | None = None
        self._inflight: dict[str, Future] = {}
        # FUSE reads 128 KiB at a time: the block being read stays in memory rather than
        # being read back (and re-verified) from the disk cache for every request.
        self._recent: OrderedDict[str, bytes] = OrderedDict()
        self._recent_blocks = recent_blocks
        self._lock = threading.Lock()
        self._decompressor = threading.local()

    # -- metadata -----------------------------------------------------------------------------

    def lookup(self, path: str) -> FileEntry | None:
        return self.manifest.by_path.get(path)

    def listdir(self, path: str) -> list[str]:
        return self.manifest.children.get(path, [])

    # -- content ------------------------------------------------------------------------------

    def read(self, entry: FileEntry, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes of a regular file (or hard link) at ``offset``."""
        if entry.kind not in (Kind.FILE, Kind.HARDLINK):
            raise IsADirectoryError(entry.path)
        end = min(entry.size, offset + size)
        if end <= offset:
            return b""
        bs = self.manifest.block_size
        first, last = offset // bs, (end - 1) // bs
        if self.recorder is not None:
            for i in entry.blocks[first : last + 1]:
                self.recorder.saw(self.manifest.blocks[i].digest, entry.path)
        ahead = list(entry.blocks[last + 1 : last + 1 + self.readahead_blocks])
        blocks = self.blocks(list(entry.blocks[first : last + 1]), also=ahead)
        data = b"".join(blocks)
        start = offset - first * bs
        return data[start : start + end - offset]

    def blocks(self, indexes: list[int], also: list[int] = ()) -> list[bytes]:
        """The uncompressed blocks at these manifest indexes, fetching what is missing.

        Blocks in ``also`` are fetched in the same go if they are neither cached nor on
        their way, but not returned (read-ahead).
        """
        table = self.manifest.blocks
        found: dict[int, bytes] = {}
        mine: list[int] = []  # blocks this call fetches
        waits: dict[int, Future] = {}
        for i in indexes:
            digest = table[i].digest
            cached = self._recent_get(digest)
            if cached is None:
                cached = self.cache.get(digest)
                if cached is not None:
                    self._recent_put(digest, cached)
            if cached is not None:
                found[i] = cached
                with self._lock:
                    self.stats.cache_hits += 1
                continue
            with self._lock:
                future = self._inflight.get(digest)
                if future is None:
                    self._inflight[digest] = Future()
                    mine.append(i)
                else:
                    waits[i] = future
        extra = []
        with self._lock:
            for i in also:
                digest = table[i].digest
                if digest not in self._inflight and digest not in self.cache:
                    self._inflight[digest] = Future()
                    extra.append(i)
        if mine or extra:
            self._fetch(mine + extra)
        for i in mine:
            found[i] = self._inflight_result(table[i].digest)
        for i in extra:
            try:
                self._inflight_result(table[i].digest)
            except Exception as exc:  # read-ahead nobody asked for yet: not this read's error
                log.debug("read-ahead of block %s failed: %s", table[i].digest, exc)
        for i, future in waits.items():
            found[i] = future.result()
        return [found[i] for i in indexes]

    def _recent_get(self, digest: str) -> bytes | None:
        with self._lock:
            data = self._recent.get(digest)
            if data is not None:
                self._recent.move_to_end(digest)
            return data

    def _recent_put(self, digest: str, data: bytes) -> None:
        with self._lock:
            self._recent[digest] = data
            self._recent.move_to_end(digest)
            while len(self._recent) > self._recent_blocks:
                self._recent.popitem(last=False)

    def _inflight_result(self, digest: str) -> bytes:
        with self._lock:
            future = self._inflight.pop(digest)
        return future.result()

    def _fetch(self, indexes: list[int]) -> None:
        """Fetch blocks (in runs of neighbours) and settle their in-flight futures."""
        table = self.manifest.blocks
        for run in _runs(sorted(set(indexes), key=lambda i: (table[i].pack, table[i].offset)),
                         table):
            try:
                blocks = self._fetch_run([table[i] for i in run])
            except BaseException as exc:
                for i in run:
                    self._settle(table[i].digest, exc=exc)
                continue
            for i, data in zip(run, blocks):
                if isinstance(data, BaseException):
                    self._settle(table[i].digest, exc=data)
                else:
                    self._settle(table[i].digest, data=data)

    def _settle(self, digest: str, *, data: bytes | None = None,
                exc: BaseException | None = None) -> None:
        with self._lock:
            future = self._inflight[digest]
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(data)

    def _fetch_run(self, run: list[BlockLocation]) -> list[bytes | BlockIntegrityError]:
        """One ranged read for the run; each block's bytes, or the error of that block."""
        pack = self.manifest.packs[run[0].pack]
        start, end = run[0].offset, run[-1].offset + run[-1].length
        raw = self.blobs.store.read_range(pack, start, end - start)
        with self._lock:
            self.stats.fetch_requests += 1
            self.stats.bytes_fetched += end - start
        out = []
        for location in run:
            piece = raw[location.offset - start : location.offset - start + location.length]
            data = self._decompress(piece, location)
            try:
                if data is None:
                    data = self._refetch(location)
            except BlockIntegrityError as exc:
                out.append(exc)
                continue
            self.cache.put(location.digest, data)
            self._recent_put(location.digest, data)
            out.append(data)
        with self._lock:
            self.stats.blocks_fetched += len(run)
        return out

    def _refetch(self, location: BlockLocation) -> bytes:
        with self._lock:
            self.stats.refetches += 1
        pack = self.manifest.packs[location.pack]
        log.warning("block %s from %s failed its digest check; fetching it again",
                    location.digest, pack)
        data = self._decompress(
            self.blobs.store.read_range(pack, location.offset, location.length), location)
        if data is None:
            raise BlockIntegrityError(
                f"image {self.image_id}: block {location.digest} (pack {pack}, bytes "
                f"{location.offset}-{location.offset + location.length}) is corrupt in the "
                f"store: it did not match its digest twice")
        return data

    def _decompress(self, piece: bytes, location: BlockLocation) -> bytes | None:
        """The block's bytes if they decompress and match the digest, else None."""
        decompressor = getattr(self._decompressor, "d", None)
        if decompressor is None:
            decompressor = self._decompressor.d = zstandard.ZstdDecompressor()
        try:
            data = decompressor.decompress(piece, max_output_size=location.size)
        except zstandard.ZstdError:
            return None
        if len(data) != location.size or hashlib.sha256(data).hexdigest() != location.digest:
            return None
        return data


def _runs(indexes: list[int], table: list[BlockLocation]) -> list[list[int]]:
    """Group block indexes (sorted by pack and offset) into runs that are adjacent in a pack."""
    runs: list[list[int]] = []
    for i in indexes:
        prev = runs[-1][-1] if runs else None
        if prev is not None and table[prev].pack == table[i].pack and \
                table[prev].offset + table[prev].length == table[i].offset:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs

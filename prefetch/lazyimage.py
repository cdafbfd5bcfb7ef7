"""A converted image, served lazily: metadata from the manifest, blocks fetched on demand.

This is the data layer of the lazy mount (the FUSE part, :mod:`bootseer.prefetch.fuse`, only
translates). A read needs the blocks it overlaps; each comes from the local
:class:`NodeCache` or, if absent, from the store: missing blocks that sit next to each
other in a pack are fetched with one ranged read, then decompressed and checked against
their digest before anyone sees them. A block that fails the check is fetched once more;
if it fails again the read fails with :class:`BlockIntegrityError` (EIO through FUSE).
Concurrent readers of the same missing block wait for one fetch.

A :class:`~bootseer.prefetch.prefetcher.Prefetcher` fills the same cache ahead of the
reads, from the image's hot list: it claims blocks through the same in-flight table, so a
read of a block being prefetched waits for that fetch instead of fetching it again, and it
holds back while reads are fetching blocks of their own (reads go first).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass

import zstandard

from bootseer.config import Config
from bootseer.errors import BootseerError, IntegrityError
from bootseer.nodecache import NodeCache, NotCached
from bootseer.prefetch.blockformat import (
    IMAGE_REF_PREFIX,
    MAX_MANIFEST_BYTES,
    BlockLocation,
    FileEntry,
    Manifest,
)
from bootseer.prefetch.hotlist import Recorder
from bootseer.prefetch.rootfs import Kind
from bootseer.store import BlobStore
from bootseer.store.blobs import is_digest

log = logging.getLogger(__name__)


class BlockIntegrityError(IntegrityError):
    """A block still did not match its digest after being fetched again."""


@dataclass
class FetchCounts:
    """What fetching from the store cost, counted separately for reads and for prefetch."""

    blocks_fetched: int = 0
    bytes_fetched: int = 0  # compressed bytes read from the store
    fetch_requests: int = 0  # ranged reads sent to the store
    refetches: int = 0  # blocks fetched again after a failed digest check or read
    failed_blocks: int = 0  # blocks that could not be fetched (the read failed with EIO)


@dataclass
class LazyStats(FetchCounts):
    """What reads cost (a miss and its read-ahead); the prefetcher counts its own."""

    cache_hits: int = 0
    prefetch_hits: int = 0  # blocks a read found in the cache because the prefetcher put them
    prefetch_waits: int = 0  # blocks a read waited for while the prefetcher fetched them


#: A block to fetch from some pack: (manifest index, offset, compressed length).
Piece = tuple[int, int, int]


def block_cache(config: Config) -> NodeCache:
    """The node's image blocks (``<cache_dir>/blocks``, ``image.cache_size``): root's
    alone, since they are the content of every tenant's images."""
    return NodeCache(config.cache_dir / "blocks", config.image.cache_size, mode=0o600)


def resolve_image(blobs: BlobStore, image: str) -> str:
    """An image id (``sha256:...``) as is, or the id the ref ``images/<image>`` names."""
    return image if is_digest(image) else blobs.get_ref(IMAGE_REF_PREFIX + image).digest


def load_manifest(blobs: BlobStore, image_id: str, cache: NodeCache) -> Manifest:
    """The image's manifest, from the node's cache when it is there (it is content-addressed
    like a block, so the cache verifies it the same way), else from the store."""
    digest = image_id.removeprefix("sha256:")
    data = cache.get(digest)
    if data is None:
        data = blobs.get(image_id, MAX_MANIFEST_BYTES)  # verified against its digest
        try:
            cache.put(digest, data)
        except (OSError, NotCached) as exc:
            log.warning("could not cache the manifest of %s: %s", image_id, exc)
    return Manifest.decode(data)


class LazyImage:
    def __init__(self, blobs: BlobStore, image: str, cache: NodeCache, *,
                 readahead_blocks: int = 3, recent_blocks: int = 32,
                 prefetch_memory: int = 512 << 20) -> None:
        self.blobs, self.cache = blobs, cache
        #: On a miss, also fetch up to this many following blocks of the same file: files
        #: are mostly read to the end, and their blocks sit next to each other in a pack,
        #: so they come in the same ranged read instead of one round trip each.
        self.readahead_blocks = readahead_blocks
        self.image_id = resolve_image(blobs, image)
        self.manifest = load_manifest(blobs, self.image_id, cache)
        self.stats = LazyStats()
        #: While set, the first access of every block is noted (see bootseer.prefetch.hotlist).
        self.recorder: Recorder | None = None
        self._inflight: dict[str, Future] = {}
        self._prefetched: set[str] = set()  # put by the prefetcher, not yet read
        # ... and, up to prefetch_memory bytes, their verified bytes: the first read of a
        # prefetched block then costs neither a disk read nor a second digest check.
        self._prefetched_data: OrderedDict[str, bytes] = OrderedDict()
        self._prefetched_bytes = 0
        self._prefetch_memory = prefetch_memory
        #: Reads fetching from the store right now; the prefetcher yields to them.
        self.demand_fetches = 0
        self.demand_changed = threading.Condition()
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
        # Copy out only the requested bytes: joining whole blocks first would allocate (and
        # fault in) megabytes for every 128 KiB FUSE read.
        start = offset - first * bs
        if len(blocks) == 1:
            return blocks[0][start : start + end - offset]
        pieces = [memoryview(b) for b in blocks]
        pieces[0] = pieces[0][start:]
        pieces[-1] = pieces[-1][: end - last * bs]
        return b"".join(pieces)

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
            while True:  # twice at most, unless the block comes and goes between the checks
                cached = self._cached(digest)
                if cached is not None:
                    found[i] = cached
                    with self._lock:
                        self.stats.cache_hits += 1
                        if digest in self._prefetched:
                            self._prefetched.discard(digest)
                            self.stats.prefetch_hits += 1
                    break
                with self._lock:
                    future = self._inflight.get(digest)
                    if future is not None:
                        waits[i] = future
                        if getattr(future, "prefetch", False):
                            self.stats.prefetch_waits += 1
                            self._prefetched.discard(digest)
                        break
                    if digest not in self.cache:  # else a fetch just finished: read it
                        self._inflight[digest] = Future()
                        mine.append(i)
                        break
        extra = []
        with self._lock:
            for i in also if mine else ():  # read ahead on a miss only
                digest = table[i].digest
                if digest not in self._inflight and digest not in self.cache:
                    self._inflight[digest] = Future()
                    extra.append(i)
        if mine or extra:
            with self.demand_changed:
                self.demand_fetches += 1
            try:
                self._fetch(mine + extra)
            finally:
                with self.demand_changed:
                    self.demand_fetches -= 1
                    self.demand_changed.notify_all()
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

    def _cached(self, digest: str) -> bytes | None:
        """The block from memory or the disk cache, or None."""
        data = self._recent_get(digest)
        if data is None:
            with self._lock:
                data = self._prefetched_data.pop(digest, None)
                if data is not None:
                    self._prefetched_bytes -= len(data)
            if data is not None:
                self._recent_put(digest, data)
                return data
            data = self.cache.get(digest)
            if data is not None:
                self._recent_put(digest, data)
        return data

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
            pieces = [(i, table[i].offset, table[i].length) for i in run]
            self.fetch_pieces(self.manifest.packs[table[run[0]].pack], pieces, self.stats)

    def wait_for(self, digests: list[str], timeout: float = 300.0) -> None:
        """Wait until no fetch of these blocks is in flight (another reader's or
        prefetcher's): a warm sharing this image is done only when its blocks are."""
        with self._lock:
            pending = [self._inflight[d] for d in digests if d in self._inflight]
        for future in pending:
            try:
                future.exception(timeout=timeout)
            except futures.TimeoutError:
                log.warning("a fetch of image %s did not end within %.0f s", self.image_id,
                            timeout)
                return

    # -- what the prefetcher uses -------------------------------------------------------------

    def claim(self, index: int) -> bool:
        """Take on fetching block ``index`` for the prefetcher: False if it is already local
        or on its way. A claimed block must be settled by :meth:`fetch_pieces`."""
        digest = self.manifest.blocks[index].digest
        with self._lock:
            if digest in self._inflight or digest in self._recent or \
                    digest in self._prefetched_data or digest in self.cache:
                return False
            future: Future = Future()
            future.prefetch = True  # type: ignore[attr-defined]
            self._inflight[digest] = future
            return True

    def fetch_pieces(self, pack: str, pieces: list[Piece], stats: FetchCounts,
                     *, prefetch: bool = False) -> int:
        """Fetch claimed blocks that sit next to each other in ``pack`` with one ranged read,
        verify them, cache them and settle their futures; return the bytes read.

        A block that does not verify (or a read that fails) is fetched again from its place
        in the image's own packs, so a damaged or missing hot pack costs time, not data.
        """
        table = self.manifest.blocks
        unsettled = {i for i, _, _ in pieces}
        try:
            return self._fetch_pieces(pack, pieces, stats, prefetch, unsettled)
        finally:  # whatever went wrong, nobody may be left waiting on a block
            for i in unsettled:
                self._settle(table[i].digest,
                             exc=BootseerError(f"fetching block {table[i].digest} failed"))

    def _fetch_pieces(self, pack: str, pieces: list[Piece], stats: FetchCounts,
                      prefetch: bool, unsettled: set[int]) -> int:
        table = self.manifest.blocks
        start, end = pieces[0][1], pieces[-1][1] + pieces[-1][2]
        try:
            raw = self.blobs.store.read_range(pack, start, end - start)
        except Exception as exc:
            if pack in self.manifest.packs:  # already the block's home: nothing to fall back to
                for i, _, _ in pieces:
                    unsettled.discard(i)
                    self._settle(table[i].digest, exc=exc)
                with self._lock:
                    stats.failed_blocks += len(pieces)
                return 0
            log.warning("reading %d blocks from %s failed (%s); using the image's packs",
                        len(pieces), pack, exc)
            raw = None
        else:
            with self._lock:
                stats.fetch_requests += 1
                stats.bytes_fetched += end - start
        for i, offset, length in pieces:
            location = table[i]
            data = None
            if raw is not None:
                data = self._decompress(raw[offset - start : offset - start + length], location)
            try:
                if data is None:
                    data = self._refetch(location, stats)
            except Exception as exc:
                unsettled.discard(i)
                self._settle(location.digest, exc=exc)
                with self._lock:
                    stats.failed_blocks += 1
                continue
            try:
                self.cache.put(location.digest, data)
            except (OSError, NotCached) as exc:  # a full disk: serve the block, uncached
                log.warning("could not cache block %s: %s", location.digest, exc)
            if not prefetch:  # prefetched blocks must not push out the ones being read
                self._recent_put(location.digest, data)
            with self._lock:
                stats.blocks_fetched += 1
                if prefetch:
                    self._prefetched.add(location.digest)
                    self._prefetched_data[location.digest] = data
                    self._prefetched_bytes += len(data)
                    while self._prefetched_bytes > self._prefetch_memory:
                        _, old = self._prefetched_data.popitem(last=False)  # still on disk
                        self._prefetched_bytes -= len(old)
            unsettled.discard(i)
            self._settle(location.digest, data=data)
        return end - start if raw is not None else 0

    def _settle(self, digest: str, *, data: bytes | None = None,
                exc: BaseException | None = None) -> None:
        with self._lock:
            future = self._inflight[digest]
            if getattr(future, "prefetch", False):
                # Nobody may be waiting: forget it now, or it would stay "in flight" forever.
                del self._inflight[digest]
        if exc is not None:
            future.set_exception(exc)
            if getattr(future, "prefetch", False):
                future.exception()  # retrieved: no "never retrieved" noise
        else:
            future.set_result(data)

    def _refetch(self, location: BlockLocation, stats: FetchCounts) -> bytes:
        """The block from its place in the image's packs, after a failed check or read."""
        with self._lock:
            stats.refetches += 1
        pack = self.manifest.packs[location.pack]
        log.warning("block %s did not verify or could not be read; fetching it from %s",
                    location.digest, pack)
        data = self._decompress(
            self.blobs.store.read_range(pack, location.offset, location.length), location)
        with self._lock:
            stats.fetch_requests += 1
            stats.bytes_fetched += location.length
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

"""A converted image, served lazily: metadata from the manifest, blocks fetched on demand.

This is the data layer of the lazy mount (the FUSE part, :mod:`bootseer.prefetch.fuse`, only
translates). :class:`LazyImage` composes the parts, each a module of its own:

* a read needs the blocks it overlaps, and looks for each one in order: the
  :class:`~bootseer.prefetch.memorytier.MemoryTier` (the blocks being read, and prefetched
  ones not read yet), the node's :class:`NodeCache` on disk, then
* the :class:`~bootseer.prefetch.inflight.InFlight` table: a block someone is fetching is
  waited for; else the read claims it, with up to ``readahead_blocks`` following blocks of
  the file that are not local either;
* the :class:`~bootseer.prefetch.blocksource.BlockSource` fetches what was claimed, one
  ranged read per run of neighbours, each block verified (a corrupt one is fetched once
  more, then fails with :class:`~bootseer.prefetch.blocksource.BlockIntegrityError`: EIO
  through FUSE); each block is kept (disk cache, memory) before its claim is settled and
  its waiters wake.

A :class:`~bootseer.prefetch.prefetcher.Prefetcher` fills the same caches ahead of the
reads, from the image's hot list: it claims blocks in the same in-flight table
(:meth:`LazyImage.claim`, :meth:`LazyImage.fetch_pieces`), so a read of a block being
prefetched waits for that fetch instead of fetching it again, and it holds back while
reads are fetching blocks of their own (``demand_fetches``: reads go first).

Statistics (:class:`LazyStats`) count what reads cost; while :attr:`LazyImage.recorder`
is set, the first access of every block is noted for the hot list.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from bootseer.errors import BootseerError
from bootseer.nodecache import NodeCache, NotCached
from bootseer.prefetch.blockformat import IMAGE_REF_PREFIX, MAX_MANIFEST_BYTES, FileEntry, Manifest
from bootseer.prefetch.blocksource import BlockSource, FetchCounts, Piece, Run, runs
from bootseer.prefetch.hotlist import Recorder
from bootseer.prefetch.inflight import InFlight
from bootseer.prefetch.memorytier import MemoryTier
from bootseer.prefetch.rootfs import Kind
from bootseer.store import BlobStore
from bootseer.store.blobs import is_digest

log = logging.getLogger(__name__)

#: Bytes of fetched blocks that may wait, in memory and readable, for the disk cache
#: writer; beyond it, a fetch writes its own blocks before it goes on.
WRITE_BEHIND_BYTES = 256 << 20
#: The writer's niceness. The disk cache is for the next start: its writes (a new file per
#: block: 1.1-1.4 ms of system CPU each on these machines' journal-less ext4, where
#: creating an inode scans past the recently deleted ones) yield the CPU to the start
#: being served, and to the fetches it waits for (bench-image: a prefetch that wrote each
#: request's blocks before taking the next ran at a third of its link).
WRITER_NICE = 10


@dataclass
class LazyStats(FetchCounts):
    """What reads cost (a miss and its read-ahead); the prefetcher counts its own."""

    cache_hits: int = 0
    prefetch_hits: int = 0  # blocks a read found in the cache because the prefetcher put them
    prefetch_waits: int = 0  # blocks a read waited for while the prefetcher fetched them


def resolve_image(blobs: BlobStore, image: str) -> str:
    """An image id (``sha256:...``) as is, or the id the ref ``images/<image>`` names."""
    return image if is_digest(image) else blobs.get_ref(IMAGE_REF_PREFIX + image).digest


@dataclass(frozen=True)
class ManifestLoad:
    """What loading an image's manifest cost a mount: a cost that grows with the image's
    file count, paid before the mount serves anything."""

    bytes: int  # compressed, as stored
    entries: int
    cached: bool  # found in the node's cache (no store read)
    fetch_s: float
    decode_s: float


def load_manifest(blobs: BlobStore, image_id: str, cache: NodeCache) -> Manifest:
    """The image's manifest, from the node's cache when it is there (it is content-addressed
    like a block, so the cache verifies it the same way), else from the store."""
    return load_manifest_timed(blobs, image_id, cache)[0]


def load_manifest_timed(blobs: BlobStore, image_id: str,
                        cache: NodeCache) -> tuple[Manifest, ManifestLoad]:
    """:func:`load_manifest`, and what it cost."""
    started = time.perf_counter()
    digest = image_id.removeprefix("sha256:")
    cached = digest in cache
    data = cache.get_or_fetch(digest, lambda: blobs.get(image_id, MAX_MANIFEST_BYTES))
    fetched = time.perf_counter()
    manifest = Manifest.decode(data)
    decoded = time.perf_counter()
    return manifest, ManifestLoad(len(data), len(manifest.entries), cached,
                                  round(fetched - started, 4), round(decoded - fetched, 4))


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
        self.manifest, self.manifest_load = load_manifest_timed(blobs, self.image_id, cache)
        self.source = BlockSource(blobs.store, self.manifest, self.image_id)
        self.memory = MemoryTier(recent_blocks, prefetch_memory)
        self.inflight = InFlight(self.is_local)
        self.stats = LazyStats()
        #: While set, the first access of every block is noted (see bootseer.prefetch.hotlist).
        self.recorder: Recorder | None = None
        #: While set, called with every block fetched, as it verifies (digest, bytes).
        self.on_fetched: Callable[[str, bytes], None] | None = None
        #: Reads fetching from the store right now; the prefetcher yields to them.
        self.demand_fetches = 0
        self.demand_changed = threading.Condition()
        # Blocks the prefetcher put and no read has asked for yet (a read of one is a
        # prefetch hit); at most the image's blocks.
        self._prefetched: set[str] = set()
        self._stats_lock = threading.Lock()
        # Blocks fetched and not yet written to the disk cache. Without memory for
        # prefetched blocks (the agent's warms have none), such a block is neither in flight
        # nor local: a warm sharing this image must neither fetch it again nor end before it
        # is written, or it counts the block missing (test_security, 16 warms at once).
        self._unsaved: set[str] = set()
        self._saved = threading.Condition()
        # Fetched blocks the writer has yet to add to the disk cache: read from here until
        # then (a block read once leaves the memory tier; it must not be fetched again).
        self._pending: dict[str, bytes] = {}
        self._pending_bytes = 0
        self._writer: ThreadPoolExecutor | None = None

    @property
    def recording(self) -> bool:
        """A recording is under way: every read must reach :meth:`read` to be seen."""
        return self.recorder is not None and not self.recorder.stopped

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

    def blocks(self, indexes: list[int], also: Iterable[int] = ()) -> list[bytes]:
        """The uncompressed blocks at these manifest indexes, fetching what is missing.

        Blocks in ``also`` are fetched in the same go if they are neither local nor on
        their way, but not returned (read-ahead).
        """
        table = self.manifest.blocks
        found: dict[int, bytes] = {}
        mine: dict[int, Future[bytes]] = {}  # blocks this call fetches
        waits: dict[int, Future[bytes]] = {}
        for i in indexes:
            digest = table[i].digest
            while True:  # twice at most, unless the block comes and goes between the looks
                data = self._local(digest)
                if data is not None:
                    found[i] = data
                    self._count_hit(digest)
                    break
                fetch = self.inflight.join(digest)
                if fetch is not None:
                    waits[i] = fetch.future
                    if fetch.prefetch:
                        self._count_prefetch_wait(digest)
                    break
                fetch = self.inflight.claim(digest)
                if fetch is not None:
                    mine[i] = fetch.future
                    break
        extra: dict[int, Future[bytes]] = {}
        for i in also if mine else ():  # read ahead on a miss only
            fetch = self.inflight.claim(table[i].digest)
            if fetch is not None:
                extra[i] = fetch.future
        if mine or extra:
            with self.demand_changed:
                self.demand_fetches += 1
            try:
                self._fetch(runs(self.manifest, [*mine, *extra]), self.stats, prefetch=False)
            finally:
                with self.demand_changed:
                    self.demand_fetches -= 1
                    self.demand_changed.notify_all()
        for i, future in extra.items():  # read-ahead nobody asked for yet: not this read's error
            if (error := future.exception()) is not None:
                log.debug("read-ahead of block %s failed: %s", table[i].digest, error)
        for i, future in (mine | waits).items():
            found[i] = future.result()
        return [found[i] for i in indexes]

    def wait_for(self, digests: list[str], timeout: float = 300.0) -> None:
        """Wait until no fetch of these blocks is in flight (another reader's or
        prefetcher's) or still being written to the disk cache: a warm sharing this image
        is done only when its blocks are."""
        deadline = time.monotonic() + timeout
        done = self.inflight.wait(digests, timeout)
        with self._saved:
            done = self._saved.wait_for(lambda: self._unsaved.isdisjoint(digests),
                                        max(0.0, deadline - time.monotonic())) and done
        if not done:
            log.warning("a fetch of image %s did not end within %.0f s", self.image_id,
                        timeout)

    # -- what the prefetcher uses -------------------------------------------------------------

    def claim(self, index: int) -> bool:
        """Take on fetching block ``index`` for the prefetcher: False if it is already local
        or on its way. A claimed block must be settled by :meth:`fetch_pieces`."""
        digest = self.manifest.blocks[index].digest
        with self._saved:
            return digest not in self._unsaved and \
                self.inflight.claim(digest, prefetch=True) is not None

    def fetch_pieces(self, pack: str, pieces: list[Piece], stats: FetchCounts) -> None:
        """Fetch claimed blocks that sit back to back in ``pack`` with one ranged read (a
        block that does not verify comes from the image's own packs), keep them in the disk
        cache and in memory for their first read, and settle their claims."""
        self._fetch([Run(pack, pieces)], stats, prefetch=True)

    # -- the parts together -------------------------------------------------------------------

    def peek(self, digest: str) -> bytes | None:
        """The block if it is on the node (memory, else the disk cache: verified), else
        None; unlike a read, it fetches nothing and leaves the memory tier as it was."""
        data = self.memory.peek(digest)
        if data is None:
            data = self._pending.get(digest)
        return data if data is not None else self.cache.get(digest)

    def is_local(self, digest: str) -> bool:
        """Whether the block is on the node (memory, on its way to the disk cache, or in
        it)."""
        return digest in self.memory or digest in self._pending or digest in self.cache

    def flush(self, timeout: float = 300.0) -> bool:
        """Wait until every block fetched so far is in the disk cache (or could not be
        added); True if that happened within ``timeout``."""
        with self._saved:
            return self._saved.wait_for(lambda: not self._pending, timeout)

    def _local(self, digest: str) -> bytes | None:
        """The block from memory or the disk cache (then kept in memory), or None."""
        data = self.memory.get(digest)
        if data is None:
            data = self._pending.get(digest)
        if data is None:
            data = self.cache.get(digest)
            if data is not None:
                self.memory.put_read(digest, data)
        return data

    def _fetch(self, runs: list[Run], stats: FetchCounts, *, prefetch: bool) -> None:
        """Fetch claimed blocks run by run; keep each in memory and settle its claim as it
        comes, then add the run's blocks to the disk cache in one go (those that came, also
        when the run failed part way).

        Whatever goes wrong, every claim is settled: nobody may be left waiting on a block.
        """
        table = self.manifest.blocks
        unsettled = {piece.index for run in runs for piece in run.pieces}
        try:
            for run in runs:
                fetched: list[tuple[str, bytes]] = []
                try:
                    for index, result in self.source.fetch(run, stats):
                        digest = table[index].digest
                        if isinstance(result, Exception):
                            self.inflight.fail(digest, result)
                        else:
                            self._remember(digest, result, prefetch)
                            with self._saved:  # unsaved before it leaves the table
                                self._unsaved.add(digest)
                                self.inflight.complete(digest, result)
                            fetched.append((digest, result))
                            if self.on_fetched is not None:
                                self.on_fetched(digest, result)
                        unsettled.discard(index)
                finally:
                    self._write_behind(fetched)
        finally:
            for index in unsettled:
                digest = table[index].digest
                self.inflight.fail(digest, BootseerError(f"fetching block {digest} failed"))

    def _remember(self, digest: str, data: bytes, prefetch: bool) -> None:
        """Keep a block in memory: until its first read if prefetched, else as just read
        (it is local from here on, before the disk cache has it)."""
        if prefetch:
            self.memory.put_prefetched(digest, data)
            with self._stats_lock:
                self._prefetched.add(digest)
        else:
            self.memory.put_read(digest, data)

    def _write_behind(self, blocks: list[tuple[str, bytes]]) -> None:
        """Have the writer add ``blocks`` to the disk cache, so that the fetch (a read
        waiting, the prefetch's next request) goes on at once; or, past
        :data:`WRITE_BEHIND_BYTES` waiting, add them here."""
        if not blocks:
            return
        size = sum(len(data) for _, data in blocks)
        with self._saved:
            if self._pending_bytes + size <= WRITE_BEHIND_BYTES:
                for digest, data in blocks:
                    self._pending[digest] = data
                self._pending_bytes += size
                if self._writer is None:
                    self._writer = ThreadPoolExecutor(1, thread_name_prefix="cache-writer",
                                                      initializer=_be_nice)
                self._writer.submit(self._cache, blocks).add_done_callback(_log_failure)
                return
        self._cache(blocks)

    def _cache(self, blocks: list[tuple[str, bytes]]) -> None:
        try:
            self.cache.put_many(blocks)
        except (OSError, NotCached) as exc:  # a full disk: serve the blocks, uncached
            log.warning("could not cache %d blocks: %s", len(blocks), exc)
        finally:
            with self._saved:
                self._unsaved.difference_update(digest for digest, _ in blocks)
                for digest, _ in blocks:
                    data = self._pending.pop(digest, None)
                    if data is not None:
                        self._pending_bytes -= len(data)
                self._saved.notify_all()

    def _count_hit(self, digest: str) -> None:
        with self._stats_lock:
            self.stats.cache_hits += 1
            if digest in self._prefetched:
                self._prefetched.discard(digest)
                self.stats.prefetch_hits += 1

    def _count_prefetch_wait(self, digest: str) -> None:
        with self._stats_lock:
            self.stats.prefetch_waits += 1
            self._prefetched.discard(digest)


def _be_nice() -> None:
    """(The disk cache writer's first act) lower this thread's priority: on Linux,
    niceness is a thread's own."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
    except OSError as exc:  # never refused for a lower priority; if it is, write at par
        log.debug("the cache writer keeps its priority: %s", exc)


def _log_failure(written: Future[None]) -> None:
    if (error := written.exception()) is not None:  # the writer's: nobody else hears of it
        log.error("adding blocks to the disk cache failed", exc_info=error)

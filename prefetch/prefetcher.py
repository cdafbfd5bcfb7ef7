"""Prefetch: fetch an image's hot list into the local block cache, early, in the background.

The hot list says which blocks a start reads and in which order. The prefetcher walks it
in that order and turns it into *requests*: runs of blocks that sit next to each other in
one pack (the hot pack, when the list has one, else the image's own packs). The first
request is small (:data:`FIRST_REQUEST`) and each next one may be twice as large, up to
:attr:`PrefetchConfig.request_size`: the blocks the start needs first arrive after a short
read, the bulk comes in large ones. :attr:`PrefetchConfig.concurrency` requests are in
flight at once, issued in list order.

It shares the lazy image's in-flight table (:meth:`LazyImage.claim`, see
:mod:`bootseer.prefetch.inflight`): a block a read is
already fetching is skipped, and a read of a block the prefetcher is fetching waits for
that fetch, so nothing is fetched twice. Reads go first: while any read is fetching
blocks of its own, only one prefetch request is in flight. A hot list that no longer
matches the image (it was rebuilt) only loses the blocks that changed — they were dropped
when the list was loaded — and a hot pack that cannot be read falls back, block by block,
to the image's packs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from bootseer.prefetch.blocksource import FetchCounts, Piece, Run, adjacent_runs
from bootseer.prefetch.config import PrefetchConfig
from bootseer.prefetch.hotlist import HotList
from bootseer.prefetch.lazyimage import LazyImage

log = logging.getLogger(__name__)

#: Bytes of the first request; the limit doubles with each request up to request_size.
FIRST_REQUEST = 1 << 20


@dataclass
class PrefetchStats(FetchCounts):
    hot_blocks: int = 0  # blocks of the hot list that the image has
    hot_bytes: int = 0  # their compressed size: what a prefetch from nothing reads
    already_local: int = 0  # hot blocks cached, or being fetched by a read, when their turn came
    in_whole_files: int = 0  # hot blocks not fetched: the kernel reads their file whole
    hot_pack: bool = False  # requests came from the hot pack (else from the image's packs)
    done: bool = False
    seconds: float = 0.0  # from start to the last request


def plan(image: LazyImage, hot: HotList, request_size: int) -> list[Run]:
    """The hot list as ranged reads, in list order."""
    index = image.manifest.block_index
    layout = hot.layout
    requests: list[Run] = []
    limit = min(FIRST_REQUEST, request_size)
    for block in hot.blocks:
        i = index.get(block.digest)
        if i is None:
            continue
        if layout is not None and block.digest in layout.pieces:
            pack = layout.pack
            offset, length = layout.pieces[block.digest]
        else:
            location = image.manifest.blocks[i]
            pack, offset, length = image.manifest.packs[location.pack], location.offset, \
                location.length
        last = requests[-1] if requests else None
        if last is not None and last.pack == pack and last.end == offset and \
                last.size + length <= limit:
            last.pieces.append(Piece(i, offset, length))
        else:
            if requests:
                limit = min(limit * 2, request_size)
            requests.append(Run(pack, [Piece(i, offset, length)]))
    return requests


class Prefetcher:
    def __init__(self, image: LazyImage, hot: HotList, *,
                 config: PrefetchConfig | None = None,
                 on_progress: Callable[[int], None] | None = None,
                 before_fetch: Callable[[], None] | None = None,
                 read_whole: Callable[[str], bool] | None = None) -> None:
        """``read_whole(path)``: whether the kernel reads that file from its whole copy on
        the node (a root named by its metadata image), so that no read of its blocks ever
        reaches the server: a hot block first read for such a file is skipped, unchecked.
        On a node where ``warm`` kept the hot files whole, that is every hot block, and
        checking each against the disk cache (a cold inode each, under the image's lock)
        was most of a warmed start's server CPU."""
        config = config or PrefetchConfig()
        self.image, self.hot, self.concurrency = image, hot, config.concurrency
        self.requests = plan(image, hot, config.request_size)
        self.on_progress = on_progress
        self.before_fetch = before_fetch  # may block: e.g. until more urgent fetches are done
        self.stats = PrefetchStats(
            hot_blocks=sum(len(r.pieces) for r in self.requests),
            hot_bytes=sum(r.size for r in self.requests),
            hot_pack=hot.layout is not None and any(r.pack == hot.layout.pack
                                                    for r in self.requests))
        self.read_whole = read_whole
        self._paths = {index: block.path for block in hot.blocks
                       if (index := image.manifest.block_index.get(block.digest)) is not None
                       } if read_whole is not None else {}
        self._whole: dict[str, bool] = {}  # read_whole's answers, by path
        self._next = 0
        self._active = 0  # requests in flight
        self._live = 0  # worker threads still running
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = 0.0

    @property
    def digests(self) -> list[str]:
        table = self.image.manifest.blocks
        return [table[p.index].digest for r in self.requests for p in r.pieces]

    def start(self) -> Prefetcher:
        """Prefetch in background threads; returns at once."""
        self._started = time.monotonic()
        self._live = min(self.concurrency, len(self.requests)) or 1
        for n in range(self._live):
            thread = threading.Thread(target=self._work, name=f"prefetch-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the prefetch to finish, its blocks in the disk cache; True if it did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self.image.flush(300.0 if deadline is None else
                                max(0.0, deadline - time.monotonic())) and self.stats.done

    def stop(self) -> None:
        """Issue no more requests (those in flight complete)."""
        self._stopped.set()
        with self.image.demand_changed:
            self.image.demand_changed.notify_all()

    def _take(self) -> Run | None:
        with self._lock:
            if self._stopped.is_set() or self._next >= len(self.requests):
                return None
            request = self.requests[self._next]
            self._next += 1
            return request

    def _work(self) -> None:
        try:
            while (request := self._take()) is not None:
                self._yield_to_reads()
                try:
                    self._fetch(request)
                finally:
                    with self.image.demand_changed:
                        self._active -= 1
                        self.image.demand_changed.notify_all()
                if self.on_progress:
                    self.on_progress(request.size)
        except Exception:  # a prefetch is advice: log it, never take the mount down
            log.exception("prefetch of image %s stopped", self.image.image_id)
        finally:
            with self._lock:
                self._live -= 1
                if self._live == 0:
                    self.stats.done = self._next >= len(self.requests)
                    self.stats.seconds = round(time.monotonic() - self._started, 3)

    def _yield_to_reads(self) -> None:
        """While reads are fetching blocks of their own, keep one request in flight at most."""
        cond = self.image.demand_changed
        with cond:
            while self.image.demand_fetches > 0 and self._active >= 1 and \
                    not self._stopped.is_set():
                cond.wait(0.05)
            self._active += 1

    def _fetch(self, request: Run) -> None:
        if self.before_fetch:  # before claiming: a read must never wait on a held-back block
            self.before_fetch()
        wanted = [p for p in request.pieces if not self._in_whole_file(p.index)]
        claimed = [p for p in wanted if self.image.claim(p.index)]
        with self._lock:
            self.stats.in_whole_files += len(request.pieces) - len(wanted)
            self.stats.already_local += len(wanted) - len(claimed)
        for run in adjacent_runs(claimed):
            self.image.fetch_pieces(request.pack, run, self.stats)

    def _in_whole_file(self, index: int) -> bool:
        path = self._paths.get(index)  # (none without read_whole)
        if path is None:
            return False
        whole = self._whole.get(path)
        if whole is None:  # two threads may both ask: the answer is the same
            whole = self._whole[path] = self.read_whole(path)
        return whole

"""The striped reader: one object, read as parallel stripe fetches with read-ahead.

A read ``[offset, offset+length)`` needs the stripes it overlaps (*demand* stripes) and,
per the :class:`ReadWindow`, the stripes in the window after it (*read-ahead*). Both are
fetched by ranged reads on a shared, bounded thread pool; demand stripes are submitted
first. Fetched stripes wait in the reader's buffer; stripes behind the read position are
dropped, and a seek cancels read-ahead that has not started.

Stripe memory comes from one pool per process (:mod:`bootseer.stripedfs.memory`), capped across
all readers by ``max_memory``: read-ahead stops where the pool is short, and a read takes
back the read-ahead no read is using (:meth:`StripedReader.shed`). A stripe is read
straight into a pooled buffer (``Store.read_range_into``), because fresh multi-MiB
allocations cost a page fault per 4 KiB, which on a virtual machine is enough to make the
reader CPU-bound.

A reader may have a ``peer_read`` (a checkpoint mount's, for a job whose nodes share their
staged copies: :meth:`bootseer.p2p.demand.DemandReads.read_file` through the node
agent): each stripe is asked of it first, and read from the store when it answers None,
fails or answers short (peers cost time, never a read). Its bytes were checked against
the job's piece hashes from Bootseer's store by the agent.

A stripe fetch retries transient errors with backoff; a fetch that still fails becomes a
:class:`StripeReadError` naming the object and the byte range, raised by the read that
needs the stripe (a failed read-ahead nobody needs is never raised). A read never returns
short or wrong data: it returns what was asked, or ``EOF`` clamps it, or it raises.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from bootseer.errors import BootseerError, InvalidRangeError
from bootseer.store import Store
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.layout import Stripe, StripeLayout
from bootseer.stripedfs.memory import shared_memory
from bootseer.stripedfs.observer import FirstByte, ReadObserver
from bootseer.stripedfs.window import ReadWindow

log = logging.getLogger(__name__)

#: ``peer_read(offset, length)``: one object's bytes through the node's peers, or None.
PeerRead = Callable[[int, int], "bytes | None"]


class StripeReadError(BootseerError, OSError):
    """A stripe could not be read after every retry."""


@dataclass
class ReaderStats:
    """Counters of one reader (fetched bytes include read-ahead nobody read)."""

    reads: int = 0
    bytes_read: int = 0
    stripes_fetched: int = 0
    bytes_fetched: int = 0
    stripe_hits: int = 0  # a read found its stripe already fetched or in flight
    retries: int = 0
    seeks: int = 0
    fetch_seconds: float = 0.0
    peer_stripes: int = 0  # stripes the node's peers served (``peer_read``)
    peer_bytes: int = 0


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def shared_pool(workers: int) -> ThreadPoolExecutor:
    """One fetch pool per process and size, created on first use (after any fork)."""
    with _pools_lock:
        pool = _pools.get(workers)
        if pool is None:
            pool = _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="stripe")
        return pool


@dataclass
class _Pending:
    """A stripe being fetched or fetched into ``buffer``; the buffer returns to the pool
    once the stripe has left the read buffer (``dropped``), no read is copying from it
    (``users``) and the fetch is over (done or cancelled)."""

    stripe: Stripe
    buffer: bytearray = field(repr=False)
    future: Future = field(repr=False)
    users: int = 0
    dropped: bool = False
    released: bool = False


class PendingRange:
    """A range being fetched straight into the buffer ``result()`` returns.

    Each stripe of the range, cut to the range, is one task on the reader's fetch pool
    that reads into its own slice of that buffer: no pooled buffer, no copy. The buffer
    is the caller's answer anyway (a safetensors shard's tensors are views of it), and
    what is in flight is bounded by the pool's ``max_concurrent_fetches``. Ranges queue on
    the pool in the order they were submitted, so a caller loading two files at once gets
    the first's stripes first and the second's as the first's run out, never a share of
    one range's memory (callers bound what they submit: DCP's ``max_bytes_in_flight``).
    Call ``result()`` or ``cancel()``.
    """

    def __init__(self, reader: StripedReader, offset: int, end: int) -> None:
        self.offset, self.length = offset, max(0, end - offset)
        self._reader = reader
        self._out = bytearray(self.length)
        view = memoryview(self._out)
        self._futures: list[Future] = []
        for stripe in reader.layout.stripes(offset, end):
            lo, hi = max(offset, stripe.start), min(end, stripe.end)
            self._futures.append(reader._pool.submit(
                reader._fetch_into, Stripe(lo, hi - lo), view[lo - offset : hi - offset]))

    def result(self) -> bytearray:
        try:
            for future in self._futures:
                future.result()
        finally:
            self.cancel()
        self._reader._first_byte()
        return self._out

    def cancel(self) -> None:
        """Stop the stripes that have not started (those under way finish into the
        buffer, which nobody reads)."""
        for future in self._futures:
            future.cancel()


class StripedReader:
    """Random and sequential reads of one store object through parallel stripe fetches."""

    def __init__(
        self,
        store: Store,
        key: str,
        *,
        config: StripeConfig | None = None,
        size: int | None = None,
        block_size: int | None = None,
        observer: ReadObserver | None = None,
        peer_read: PeerRead | None = None,
    ) -> None:
        self.store, self.key, self.peer_read = store, key, peer_read
        self.config = config or StripeConfig()
        self.size = store.stat(key).size if size is None else size
        if block_size is None:
            block_size = store.block_size(key)
        self.layout = StripeLayout(self.size, self.config.stripe_size, block_size)
        self.window = ReadWindow(self.config)
        self.stats = ReaderStats()
        self._pool = shared_pool(self.config.max_concurrent_fetches)
        self.memory = shared_memory(self.config.stripe_size, self.config.max_memory)
        self._buffer: dict[int, _Pending] = {}  # stripe start -> fetch
        # Reentrant: a future that is already done (or is cancelled) runs its done callback
        # at once, in the thread that holds the lock.
        self._lock = threading.RLock()
        self._closed = False
        self._first_byte = FirstByte(observer, self.name)
        self.memory.register(self)

    @property
    def name(self) -> str:
        return f"{self.store.url.rstrip('/')}/{self.key}"

    # -- reading ------------------------------------------------------------------------------

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset``: fewer only at the end of the object."""
        parts: list[bytes] = []
        self._read(offset, length, lambda _pos, piece: parts.append(bytes(piece)))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readinto(self, offset: int, buffer: bytearray | memoryview) -> int:
        """Fill ``buffer`` from ``offset``; returns the byte count (short only at EOF)."""
        view = memoryview(buffer).cast("B")

        def sink(pos: int, piece: memoryview) -> None:
            view[pos - offset : pos - offset + len(piece)] = piece

        return self._read(offset, len(view), sink)

    def _read(self, offset: int, length: int, sink: Callable[[int, memoryview], None]) -> int:
        if offset < 0:
            raise InvalidRangeError(f"{self.name}: negative offset {offset}")
        end = min(self.size, offset + length)
        if end <= offset:
            return 0
        # A read takes memory for all its stripes at once: a large one goes in pieces a
        # fraction of the cap each, so it never needs more than the cap holds.
        piece = self.config.stripe_size * max(1, self.memory.capacity // 4)
        if end - offset > piece:
            for start in range(offset, end, piece):
                self._read(start, min(piece, end - start), sink)
            return end - offset
        demand = list(self.layout.stripes(offset, end))
        with self._lock:
            if self._closed:
                raise ValueError(f"{self.name}: read from a closed reader")
            ahead = self.window.advance(offset, end - offset)
            self.stats.seeks = self.window.seeks
            # Reads a little behind this one still count as sequential (FUSE serves a
            # file's requests on several threads, out of order): their stripes stay.
            behind = self.config.max_backward_seek_distance
            self._drop_outside(offset - behind, end + ahead)
            missing = sum(1 for stripe in demand if self._present(stripe) is None)
        pending = self._claim(demand, missing)
        with self._lock:
            self._schedule_read_ahead(end, ahead)
        try:
            for item in pending:
                data, own = self._result(item)
                try:
                    lo, hi = max(offset, item.stripe.start), min(end, item.stripe.end)
                    sink(lo, memoryview(data)[lo - item.stripe.start : hi - item.stripe.start])
                finally:
                    if own:
                        self.memory.give(data)
        except BaseException:
            with self._lock:
                self.window.reset()
                for item in pending:  # a failed stripe must be fetched afresh next time
                    if item.future.done() and not item.future.cancelled() and \
                            item.future.exception() is not None:
                        self._drop(item)
                self._unuse(pending)
            raise
        with self._lock:
            self._unuse(pending)
            self.stats.reads += 1
            self.stats.bytes_read += end - offset
            self._drop_before((end if end < self.size else offset) - behind)
        self._first_byte()
        return end - offset

    def _claim(self, demand: list[Stripe], missing: int) -> list[_Pending]:
        """The demand stripes of a read, each started if it is not there yet, and marked
        in use. Memory for the missing ones is taken all at once, or none, and without
        holding the lock, so shedding (which only try-locks) can reach this reader too;
        if a concurrent read dropped some meanwhile, it is given back and taken again
        for the new count (never holding some while waiting for more)."""
        while True:
            buffers = self.memory.take(missing) if missing else []
            with self._lock:
                missing = sum(1 for stripe in demand if self._present(stripe) is None)
                if missing <= len(buffers):
                    pending = []
                    for stripe in demand:
                        item = self._present(stripe)
                        if item is not None:
                            self.stats.stripe_hits += 1
                        else:
                            item = self._start(stripe, buffers.pop())
                        item.users += 1
                        pending.append(item)
                    break
            for buffer in buffers:
                self.memory.give(buffer)
        for unused in buffers:  # another read started some of them meanwhile
            self.memory.give(unused)
        return pending

    def submit_range(self, offset: int, length: int) -> PendingRange:
        """Start fetching exactly ``[offset, offset+length)``, every stripe in parallel.

        For callers that know their ranges up front (safetensors tensors, DCP items): no
        read-ahead, no window, no pooled memory: the stripes land in the buffer returned
        (see :class:`PendingRange`).
        """
        return PendingRange(self, offset, min(self.size, offset + length))

    def fetch(self, offset: int, length: int) -> bytearray:
        """``submit_range(offset, length).result()``: parallel, no read-ahead."""
        return self.submit_range(offset, length).result()

    def chunks(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        """``[start, end)`` as (offset, length) pieces for :meth:`read_chunk_into`: its
        stripes, cut to the range (each one ranged read, served by one DataNode)."""
        for stripe in self.layout.stripes(start, end):
            lo, hi = max(start, stripe.start), min(end, stripe.end)
            yield lo, hi - lo

    def read_chunk_into(self, offset: int, view: memoryview) -> None:
        """Exactly ``len(view)`` bytes at ``offset`` into ``view``, in the calling thread:
        one piece :meth:`chunks` gave (peers first, if any; retried; no read-ahead, no
        stripe memory). For loaders that run their own workers and own the memory."""
        self._fetch_into(Stripe(offset, len(view)), view)
        self._first_byte()

    def shed(self) -> int:
        """Give back the buffers of fetched stripes no read is using (they are fetched
        again if wanted); nothing if the reader is busy right now (never waits)."""
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            idle = [item for item in self._buffer.values()
                    if item.users == 0 and item.future.done()]
            for item in idle:
                self._drop(item)
            return len(idle)
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for item in list(self._buffer.values()):
                item.future.cancel()
                self._drop(item)

    def __enter__(self) -> StripedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the buffer (called with the lock held) -----------------------------------------------

    def _present(self, stripe: Stripe) -> _Pending | None:
        item = self._buffer.get(stripe.start)
        return item if item is not None and not item.future.cancelled() else None

    def _start(self, stripe: Stripe, buffer: bytearray) -> _Pending:
        """Fetch ``stripe`` into ``buffer`` and keep it in the read buffer."""
        stale = self._buffer.get(stripe.start)
        if stale is not None:
            self._drop(stale)
        item = _Pending(stripe, buffer, self._pool.submit(self._fetch, stripe, buffer))
        item.future.add_done_callback(lambda _f, item=item: self._on_done(item))
        self._buffer[stripe.start] = item
        return item

    def _schedule_read_ahead(self, start: int, ahead: int) -> None:
        for stripe in self.layout.stripes(start, start + ahead):
            if self._present(stripe) is not None:
                continue
            buffer = self.memory.try_take()
            if buffer is None:  # the process's stripe memory is short: read-ahead waits
                break
            self._start(stripe, buffer)

    def _drop_outside(self, start: int, end: int) -> None:
        """A seek: forget stripes that the new position and window do not cover."""
        for item in list(self._buffer.values()):
            if item.stripe.end <= start or item.stripe.start >= end:
                if item.users == 0:  # a concurrent read's stripe finishes for it
                    item.future.cancel()
                self._drop(item)

    def _drop_before(self, position: int) -> None:
        for item in list(self._buffer.values()):
            if item.stripe.end <= position:
                self._drop(item)

    def _drop(self, item: _Pending) -> None:
        if self._buffer.get(item.stripe.start) is item:
            del self._buffer[item.stripe.start]
        item.dropped = True
        self._release(item)

    def _unuse(self, items: list[_Pending]) -> None:
        for item in items:
            item.users -= 1
            self._release(item)

    def _release(self, item: _Pending) -> None:
        if item.dropped and item.users == 0 and item.future.done() and not item.released:
            item.released = True
            self.memory.give(item.buffer)

    def _on_done(self, item: _Pending) -> None:
        with self._lock:
            self._release(item)

    # -- fetching (on the pool) ---------------------------------------------------------------

    def _result(self, item: _Pending) -> tuple[bytearray, bool]:
        """The stripe's bytes, and whether the caller owns (and must give back) them."""
        try:
            return item.future.result(), False
        except CancelledError:  # cancelled by a concurrent seek: fetch it ourselves
            return self._fetch_new(item.stripe), True

    def _fetch_new(self, stripe: Stripe) -> bytearray:
        """The stripe's bytes in a buffer taken from the pool now (the caller gives it
        back)."""
        (buffer,) = self.memory.take(1)
        try:
            return self._fetch(stripe, buffer)
        except BaseException:
            self.memory.give(buffer)
            raise

    def _fetch(self, stripe: Stripe, buffer: bytearray) -> bytearray:
        """The stripe's bytes, at the start of ``buffer``."""
        self._fetch_into(stripe, memoryview(buffer)[: stripe.length])
        return buffer

    def _fetch_into(self, stripe: Stripe, view: memoryview) -> None:
        if self.peer_read is not None and self._from_peers(stripe, view):
            return
        cfg = self.config
        delay = cfg.retry_initial_delay
        for attempt in range(1, cfg.max_attempts + 1):
            started = time.monotonic()
            try:
                self.store.read_range_into(self.key, stripe.start, view)
            except (FileNotFoundError, InvalidRangeError) as exc:
                raise StripeReadError(f"{self.name}: bytes {stripe.start}-{stripe.end}: "
                                      f"{exc}") from exc
            except Exception as exc:  # transient until proven otherwise: retry
                if attempt == cfg.max_attempts:
                    raise StripeReadError(
                        f"{self.name}: reading bytes {stripe.start}-{stripe.end} failed after "
                        f"{attempt} attempts: {exc}"
                    ) from exc
                log.info("%s: bytes %d-%d: %s; retrying in %.2fs", self.name, stripe.start,
                         stripe.end, exc, delay)
                with self._lock:
                    self.stats.retries += 1
                time.sleep(delay)
                delay *= 2
                continue
            with self._lock:
                self.stats.stripes_fetched += 1
                self.stats.bytes_fetched += stripe.length
                self.stats.fetch_seconds += time.monotonic() - started
            return

    def _from_peers(self, stripe: Stripe, view: memoryview) -> bool:
        """Whether ``peer_read`` filled ``view`` with the stripe (False: read the store)."""
        assert self.peer_read is not None
        started = time.monotonic()
        try:
            data = self.peer_read(stripe.start, stripe.length)
        except Exception as exc:  # peers cost time, never a read
            log.debug("%s: bytes %d-%d through peers failed (%s); reading the store",
                      self.name, stripe.start, stripe.end, exc)
            return False
        if data is None or len(data) != stripe.length:
            return False
        view[:] = data
        with self._lock:
            self.stats.peer_stripes += 1
            self.stats.peer_bytes += stripe.length
            self.stats.stripes_fetched += 1
            self.stats.bytes_fetched += stripe.length
            self.stats.fetch_seconds += time.monotonic() - started
        return True

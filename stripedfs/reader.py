"""The striped reader: one object, read as parallel stripe fetches with read-ahead.

A read ``[offset, offset+length)`` needs the stripes it overlaps (*demand* stripes) and,
per the :class:`ReadWindow`, the stripes in the window after it (*read-ahead*). Both are
fetched by ranged reads on a shared, bounded thread pool; demand stripes are submitted
first. Fetched stripes wait in a buffer capped by ``max_buffer_bytes``; stripes behind the
read position are dropped, and a seek cancels read-ahead that has not started.

Stripe memory is recycled (:class:`StripeBuffers`): a stripe is read straight into a
reused buffer (``Store.read_range_into``), because fresh multi-MiB allocations cost a page
fault per 4 KiB, which on a virtual machine is enough to make the reader CPU-bound.

A stripe fetch retries transient errors with backoff; a fetch that still fails becomes a
:class:`StripeReadError` naming the object and the byte range, raised by the read that
needs the stripe (a failed read-ahead nobody needs is never raised). A read never returns
short or wrong data: it returns what was asked, or ``EOF`` clamps it, or it raises.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from bootseer.errors import BootseerError, InvalidRangeError
from bootseer.ready import mark_phase
from bootseer.store import Store
from stripedfs.config import StripeConfig
from stripedfs.layout import Stripe, StripeLayout
from stripedfs.window import ReadWindow

log = logging.getLogger(__name__)


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


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def shared_pool(workers: int) -> ThreadPoolExecutor:
    """One fetch pool per process and size, created on first use (after any fork)."""
    with _pools_lock:
        pool = _pools.get(workers)
        if pool is None:
            pool = _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="stripe")
        return pool


class StripeBuffers:
    """A free list of stripe-sized buffers, so steady-state reads allocate nothing."""

    def __init__(self, stripe_size: int, keep: int) -> None:
        self.stripe_size, self.keep = stripe_size, keep
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self) -> bytearray:
        with self._lock:
            if self._free:
                return self._free.pop()
        return bytearray(self.stripe_size)

    def give(self, buffer: bytearray) -> None:
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buffer)


_buffers: dict[int, StripeBuffers] = {}


def shared_buffers(config: StripeConfig) -> StripeBuffers:
    keep = config.max_buffer_bytes // config.stripe_size + config.max_concurrent_fetches
    with _pools_lock:
        buffers = _buffers.get(config.stripe_size)
        if buffers is None:
            buffers = _buffers[config.stripe_size] = StripeBuffers(config.stripe_size, keep)
        return buffers


@dataclass
class _Pending:
    """A stripe being fetched or fetched; its buffer returns to the free list once it has
    left the read buffer (``dropped``) and no read is copying from it (``users``)."""

    stripe: Stripe
    future: Future = field(repr=False)
    users: int = 0
    dropped: bool = False
    released: bool = False


@dataclass
class PendingRange:
    """A range whose stripes are being fetched; ``result()`` waits and assembles them."""

    offset: int
    length: int
    parts: list[tuple[Stripe, Future]] = field(repr=False)
    give_back: Callable[[bytearray], None] = field(repr=False)

    def result(self) -> bytearray:
        out = bytearray(self.length)
        for stripe, future in self.parts:
            data = future.result()
            lo = max(self.offset, stripe.start)
            hi = min(self.offset + self.length, stripe.end)
            out[lo - self.offset : hi - self.offset] = \
                memoryview(data)[lo - stripe.start : hi - stripe.start]
            self.give_back(data)
        mark_phase("checkpoint_first_byte")
        return out

    def cancel(self) -> None:
        for _, future in self.parts:
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
    ) -> None:
        self.store, self.key = store, key
        self.config = config or StripeConfig()
        self.size = store.stat(key).size if size is None else size
        if block_size is None:
            block_size = store.block_size(key)
        self.layout = StripeLayout(self.size, self.config.stripe_size, block_size)
        self.window = ReadWindow(self.config)
        self.stats = ReaderStats()
        self._pool = shared_pool(self.config.max_concurrent_fetches)
        self._buffers = shared_buffers(self.config)
        self._buffer: dict[int, _Pending] = {}  # stripe start -> fetch
        # Reentrant: a future that is already done (or is cancelled) runs its done callback
        # at once, in the thread that holds the lock.
        self._lock = threading.RLock()
        self._closed = False

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
        demand = list(self.layout.stripes(offset, end))
        with self._lock:
            if self._closed:
                raise ValueError(f"{self.name}: read from a closed reader")
            ahead = self.window.advance(offset, end - offset)
            self.stats.seeks = self.window.seeks
            self._drop_outside(offset, end + ahead)
            pending = [self._ensure(stripe, demand=True) for stripe in demand]
            for item in pending:
                item.users += 1
            self._schedule_read_ahead(end, ahead)
        try:
            for item in pending:
                data = self._result(item)
                lo, hi = max(offset, item.stripe.start), min(end, item.stripe.end)
                sink(lo, memoryview(data)[lo - item.stripe.start : hi - item.stripe.start])
        except BaseException:
            with self._lock:
                self.window.reset()
                for item in pending:  # a failed stripe must be fetched afresh next time
                    if item.future.done() and item.future.exception() is not None:
                        self._drop(item)
                self._unuse(pending)
            raise
        with self._lock:
            self._unuse(pending)
            self.stats.reads += 1
            first = self.stats.reads == 1
            self.stats.bytes_read += end - offset
            self._drop_before(end if end < self.size else offset)
        if first:  # once per reader, not on every read of the hot path
            mark_phase("checkpoint_first_byte")
        return end - offset

    def submit_range(self, offset: int, length: int) -> PendingRange:
        """Start fetching exactly ``[offset, offset+length)``, every stripe in parallel.

        For callers that know their ranges up front (safetensors tensors, DCP items): no
        read-ahead, no window, nothing kept after the bytes are handed over.
        """
        end = min(self.size, offset + length)
        parts = [(s, self._pool.submit(self._fetch, s)) for s in self.layout.stripes(offset, end)]
        return PendingRange(offset, max(0, end - offset), parts, self._buffers.give)

    def fetch(self, offset: int, length: int) -> bytearray:
        """``submit_range(offset, length).result()``: parallel, no read-ahead."""
        return self.submit_range(offset, length).result()

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

    def _ensure(self, stripe: Stripe, demand: bool) -> _Pending:
        item = self._buffer.get(stripe.start)
        if item is not None and not item.future.cancelled():
            if demand:
                self.stats.stripe_hits += 1
            return item
        item = _Pending(stripe, self._pool.submit(self._fetch, stripe))
        item.future.add_done_callback(lambda _f, item=item: self._on_done(item))
        self._buffer[stripe.start] = item
        return item

    def _schedule_read_ahead(self, start: int, ahead: int) -> None:
        budget = self.config.max_buffer_bytes - sum(p.stripe.length for p in self._buffer.values())
        for stripe in self.layout.stripes(start, start + ahead):
            if stripe.start in self._buffer:
                continue
            if budget < stripe.length:
                break
            self._ensure(stripe, demand=False)
            budget -= stripe.length

    def _drop_outside(self, start: int, end: int) -> None:
        """A seek: forget stripes that the new position and window do not cover."""
        for item in list(self._buffer.values()):
            if item.stripe.end <= start or item.stripe.start >= end:
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
            if not item.future.cancelled() and item.future.exception() is None:
                self._buffers.give(item.future.result())

    def _on_done(self, item: _Pending) -> None:
        with self._lock:
            self._release(item)

    # -- fetching (on the pool) ---------------------------------------------------------------

    def _result(self, item: _Pending) -> bytearray:
        try:
            return item.future.result()
        except CancelledError:  # cancelled by a concurrent seek: fetch it ourselves
            return self._fetch(item.stripe)

    def _fetch(self, stripe: Stripe) -> bytearray:
        """The stripe's bytes, at the start of a buffer from the free list."""
        buffer = self._buffers.take()
        try:
            self._fetch_into(stripe, memoryview(buffer)[: stripe.length])
        except BaseException:
            self._buffers.give(buffer)
            raise
        return buffer

    def _fetch_into(self, stripe: Stripe, view: memoryview) -> None:
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

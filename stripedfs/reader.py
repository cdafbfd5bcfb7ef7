"""The striped reader: one object, read as parallel stripe fetches with read-ahead.

A read ``[offset, offset+length)`` needs the stripes it overlaps (*demand* stripes) and,
per the :class:`ReadWindow`, the stripes in the window after it (*read-ahead*). Both are
fetched by ranged reads on a shared, bounded thread pool; demand stripes are submitted
first. Fetched stripes wait in a buffer capped by ``max_buffer_bytes``; stripes behind the
read position are dropped, and a seek cancels read-ahead that has not started.

A stripe fetch retries transient errors with backoff; a fetch that still fails becomes a
:class:`StripeReadError` naming the object and the byte range, raised by the read that
needs the stripe (a failed read-ahead nobody needs is never raised). A read never returns
short or wrong data: it returns what was asked, or ``EOF`` clamps it, or it raises.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from bootseer.errors import BootseerError, InvalidRangeError
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


@dataclass
class _Pending:
    stripe: Stripe
    future: Future = field(repr=False)


@dataclass
class PendingRange:
    """A range whose stripes are being fetched; ``result()`` waits and assembles them."""

    offset: int
    length: int
    parts: list[tuple[Stripe, Future]] = field(repr=False)

    def result(self) -> bytearray:
        out = bytearray(self.length)
        for stripe, future in self.parts:
            data = future.result()
            lo = max(self.offset, stripe.start)
            hi = min(self.offset + self.length, stripe.end)
            out[lo - self.offset : hi - self.offset] = data[lo - stripe.start : hi - stripe.start]
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
        self._buffer: dict[int, _Pending] = {}  # stripe start -> fetch
        self._lock = threading.Lock()
        self._closed = False

    @property
    def name(self) -> str:
        return f"{self.store.url.rstrip('/')}/{self.key}"

    # -- reading ------------------------------------------------------------------------------

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset``: fewer only at the end of the object."""
        buffer = bytearray(max(0, min(length, self.size - offset)))
        n = self.readinto(offset, buffer)
        return bytes(buffer[:n])

    def readinto(self, offset: int, buffer: bytearray | memoryview) -> int:
        """Fill ``buffer`` from ``offset``; returns the byte count (short only at EOF)."""
        if offset < 0:
            raise InvalidRangeError(f"{self.name}: negative offset {offset}")
        end = min(self.size, offset + len(buffer))
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
            self._schedule_read_ahead(end, ahead)
        view = memoryview(buffer)
        try:
            for item in pending:
                data = self._result(item)
                lo, hi = max(offset, item.stripe.start), min(end, item.stripe.end)
                view[lo - offset : hi - offset] = data[lo - item.stripe.start : hi - item.stripe.start]
        except BaseException:
            with self._lock:
                self.window.reset()
                for item in pending:  # a failed stripe must be fetched afresh next time
                    if item.future.done() and item.future.exception() is not None:
                        self._buffer.pop(item.stripe.start, None)
            raise
        with self._lock:
            self.stats.reads += 1
            self.stats.bytes_read += end - offset
            self._drop_before(end if end < self.size else offset)
        return end - offset

    def submit_range(self, offset: int, length: int) -> PendingRange:
        """Start fetching exactly ``[offset, offset+length)``, every stripe in parallel.

        For callers that know their ranges up front (safetensors tensors, DCP items): no
        read-ahead, no window, nothing kept after the bytes are handed over.
        """
        end = min(self.size, offset + length)
        stripes = list(self.layout.stripes(offset, end))
        futures = [self._pool.submit(self._fetch, stripe) for stripe in stripes]
        return PendingRange(offset, max(0, end - offset), list(zip(stripes, futures)))

    def fetch(self, offset: int, length: int) -> bytearray:
        """``submit_range(offset, length).result()``: parallel, no read-ahead."""
        return self.submit_range(offset, length).result()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for item in self._buffer.values():
                item.future.cancel()
            self._buffer.clear()

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
        for key, item in list(self._buffer.items()):
            if item.stripe.end <= start or item.stripe.start >= end:
                item.future.cancel()
                del self._buffer[key]

    def _drop_before(self, position: int) -> None:
        for key, item in list(self._buffer.items()):
            if item.stripe.end <= position:
                del self._buffer[key]

    # -- fetching (on the pool) ---------------------------------------------------------------

    def _result(self, item: _Pending) -> bytes:
        try:
            return item.future.result()
        except CancelledError:  # cancelled by a concurrent seek: fetch it ourselves
            return self._fetch(item.stripe)

    def _fetch(self, stripe: Stripe) -> bytes:
        cfg = self.config
        delay = cfg.retry_initial_delay
        for attempt in range(1, cfg.max_attempts + 1):
            started = time.monotonic()
            try:
                data = self.store.read_range(self.key, stripe.start, stripe.length)
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
                self.stats.bytes_fetched += len(data)
                self.stats.fetch_seconds += time.monotonic() - started
            return data
        raise AssertionError("unreachable")

"""Stripe memory: every stripe buffer of a process, within one cap across all its readers.

A checkpoint mount's FUSE server is a root process outside the container's cgroup, and
each open file has its own reader and read-ahead window. A cap per file would let a
container that opens a hundred files pin a hundred times the cap there, so the cap is
per process (``max_memory``), and every reader draws its buffers from this one pool:

* **read-ahead** takes a buffer only if one is free without waiting
  (:meth:`StripeMemory.try_take`), and never the last few (:attr:`reserve`), which are
  kept for reads;
* **a read** takes the buffers its missing stripes need all at once, or none
  (:meth:`StripeMemory.take`). While the pool is empty it asks the readers to give back
  read-ahead that has arrived and that no read is using (a reader does so only if it is
  not busy: no lock is ever waited for), then waits for a buffer to come back. A read
  never holds buffers while it waits for more, so reads cannot deadlock one another; a
  read that gets no memory within ``timeout`` fails (EIO through FUSE) rather than hang.

Buffers are recycled, never freed (a fresh multi-MiB allocation costs a page fault per
4 KiB, which on a virtual machine makes the reader CPU-bound), so the process holds at
most ``capacity`` stripes of them. The tensor loader draws its pinned staging buffers
from a pool of its own (:func:`shared_memory` with ``allocate``): pinning is dearer still.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from bootseer.errors import BootseerError

#: Seconds between two rounds of asking readers for their idle read-ahead.
_SHED_INTERVAL = 0.05


class MemoryExhausted(BootseerError, OSError):
    """A read found no stripe memory within its timeout: every buffer is in use."""


class Shedder(Protocol):
    def shed(self) -> int:
        """Give back idle read-ahead buffers (never blocking); how many went back."""


class StripeMemory:
    """A pool of ``stripe_size`` buffers holding at most ``limit`` bytes in all, made by
    ``allocate(stripe_size)`` (bytearrays by default)."""

    def __init__(self, stripe_size: int, limit: int,
                 allocate: Callable[[int], Any] = bytearray) -> None:
        self.stripe_size = stripe_size
        self._allocate = allocate
        self.capacity = max(2, limit // stripe_size)  # buffers
        #: Buffers read-ahead never takes: reads get them even while read-ahead is busy.
        self.reserve = max(2, self.capacity // 8)
        self.allocated = 0
        self.peak = 0  # the most buffers ever allocated at once
        self.shed_buffers = 0  # read-ahead given back for reads
        self._free: list[Any] = []
        self._changed = threading.Condition()
        self._readers: weakref.WeakSet[Shedder] = weakref.WeakSet()

    @property
    def limit(self) -> int:
        return self.capacity * self.stripe_size

    def register(self, reader: Shedder) -> None:
        """``reader`` holds read-ahead it can give back when reads need memory."""
        with self._changed:
            self._readers.add(reader)

    def try_take(self) -> bytearray | None:
        """A buffer for read-ahead, or None if that would eat into the reserve."""
        with self._changed:
            if len(self._free) + self.capacity - self.allocated <= self.reserve:
                return None
            return self._take_locked(1)[0]

    def take(self, n: int, timeout: float = 60.0) -> list[bytearray]:
        """``n`` buffers for a read, all at once, waiting for them if needed."""
        if n > self.capacity:
            raise MemoryExhausted(f"a read needs {n} stripes; the memory cap holds "
                                  f"{self.capacity}")
        deadline = time.monotonic() + timeout
        while True:
            with self._changed:
                if len(self._free) + self.capacity - self.allocated >= n:
                    return self._take_locked(n)
            if self._shed() == 0:
                with self._changed:
                    if len(self._free) + self.capacity - self.allocated < n:
                        self._changed.wait(_SHED_INTERVAL)
            if time.monotonic() > deadline:
                raise MemoryExhausted(
                    f"no stripe memory for {timeout:.0f} s: all {self.limit >> 20} MiB "
                    f"(max_memory; checkpoint.mount_memory for a mount) are in use by reads")

    def give(self, buffer: bytearray) -> None:
        with self._changed:
            self._free.append(buffer)
            self._changed.notify()

    def _take_locked(self, n: int) -> list[bytearray]:
        out = [self._free.pop() for _ in range(min(n, len(self._free)))]
        while len(out) < n:
            out.append(self._allocate(self.stripe_size))
            self.allocated += 1
        self.peak = max(self.peak, self.allocated)
        return out

    def _shed(self) -> int:
        with self._changed:
            readers = list(self._readers)
        given = 0
        for reader in readers:
            given += reader.shed()
        if given:
            with self._changed:
                self.shed_buffers += given
        return given


_pools: dict[tuple[int, int, str], StripeMemory] = {}
_pools_lock = threading.Lock()


def shared_memory(stripe_size: int, limit: int, *, kind: str = "bytes",
                  allocate: Callable[[int], Any] = bytearray) -> StripeMemory:
    """The process's pool of ``kind`` buffers for this stripe size and cap (one per
    configuration and kind; ``allocate`` makes the first pool of a kind)."""
    with _pools_lock:
        pool = _pools.get((stripe_size, limit, kind))
        if pool is None:
            pool = _pools[(stripe_size, limit, kind)] = StripeMemory(stripe_size, limit,
                                                                      allocate)
        return pool

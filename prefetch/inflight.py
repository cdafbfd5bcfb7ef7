"""Blocks being fetched right now: one fetch per block, however many threads want it.

A reader that misses a block either *joins* the fetch in flight (and waits for its
outcome) or *claims* the block (becomes its fetcher). A claimant settles its claim exactly
once, :meth:`InFlight.complete` with the bytes or :meth:`InFlight.fail` with the error.
Settling wakes every waiter with that outcome and removes the entry, so:

* a failure reaches every waiter, and the next reader claims the block afresh (a retry);
* the table holds only fetches in progress: its size is bounded by the fetches running
  (readers' threads and their read-ahead, prefetch requests), never by the image; the
  bytes stay with the owner and the waiters, not here.

A block is claimed only if it is neither in flight nor local (``is_local``, asked under the
table's lock). A fetcher keeps a block locally before it settles the claim, so a fetch that
ends between a reader's look at its caches and its claim is never repeated.

Each entry says whether the prefetcher claimed it: a reader that waits on a prefetch is
counted as such.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fetch:
    """One block's fetch in flight: its outcome, once settled, is ``future``'s."""

    prefetch: bool = False
    future: Future[bytes] = field(default_factory=Future, compare=False)


class InFlight:
    def __init__(self, is_local: Callable[[str], bool] = lambda digest: False) -> None:
        self.is_local = is_local
        self._fetches: dict[str, Fetch] = {}
        self._lock = threading.Lock()

    def join(self, digest: str) -> Fetch | None:
        """The fetch of ``digest`` in flight, or None."""
        with self._lock:
            return self._fetches.get(digest)

    def claim(self, digest: str, *, prefetch: bool = False) -> Fetch | None:
        """Become the fetcher of ``digest``: None if it is in flight or local already."""
        with self._lock:
            if digest in self._fetches or self.is_local(digest):
                return None
            fetch = self._fetches[digest] = Fetch(prefetch)
            return fetch

    def complete(self, digest: str, data: bytes) -> None:
        """Settle the claim on ``digest`` with its bytes: every waiter gets them."""
        self._pop(digest).future.set_result(data)

    def fail(self, digest: str, error: BaseException) -> None:
        """Settle the claim on ``digest`` with an error: every waiter raises it, and the
        block may be claimed again."""
        self._pop(digest).future.set_exception(error)

    def wait(self, digests: Iterable[str], timeout: float | None = None) -> bool:
        """Wait until none of these blocks is in flight; False if ``timeout`` ran out first."""
        with self._lock:
            pending = [self._fetches[d].future for d in digests if d in self._fetches]
        return not futures.wait(pending, timeout).not_done

    def __len__(self) -> int:
        with self._lock:
            return len(self._fetches)

    def _pop(self, digest: str) -> Fetch:
        with self._lock:
            try:
                return self._fetches.pop(digest)
            except KeyError:
                raise KeyError(f"block {digest} is not claimed: a claim is settled once, "
                               f"by its claimant") from None

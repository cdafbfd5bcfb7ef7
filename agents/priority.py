"""Who fetches first on a node: demand reads, then containers starting, then warm requests.

The agent serves three kinds of fetches over one network link. A container blocked on a
read it needs now (*demand*) must not queue behind a container's start-up prefetch
(*starting*), and neither may queue behind a ``bootseer warm`` staging a job that has not
landed yet (*warm*). The gate does one thing: work declares what it is doing with
:meth:`PriorityGate.hold`, and lower-priority work calls :meth:`PriorityGate.wait_turn`
before each ranged fetch it issues, which blocks while anything more urgent is held.

Waiting happens between requests, never inside one: a request already on the wire
completes, so a preempted warm costs at most one request's time of the link, and the warm
resumes where it stopped once the urgent work is done.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from enum import IntEnum


class Priority(IntEnum):
    """Lower is more urgent."""

    DEMAND = 0  # a read is waiting for these bytes
    STARTING = 1  # a container is starting now: its hot-block prefetch
    WARM = 2  # staging for a job that has not started yet (``bootseer warm``)


class PriorityGate:
    """Counts activity per priority; lets lower-priority work wait for a quiet link."""

    def __init__(self) -> None:
        self._held = {p: 0 for p in Priority}
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def hold(self, priority: Priority) -> Iterator[None]:
        """Declare activity at ``priority`` for the duration of the block.

        Holds are counted, so they may nest and overlap across threads; the priority is
        free again when the last of them ends.
        """
        with self._changed:
            self._held[priority] += 1
        try:
            yield
        finally:
            with self._changed:
                self._held[priority] -= 1
                self._changed.notify_all()

    def wait_turn(self, priority: Priority, timeout: float | None = None) -> bool:
        """Block while any activity more urgent than ``priority`` is held.

        True when it is this priority's turn; False if ``timeout`` seconds passed first
        (the caller decides whether to fetch anyway or give up).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while self._busier_than(priority):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def busy(self) -> dict[Priority, int]:
        """Activities held now, per priority (for metrics and ``/v1/health``)."""
        with self._changed:
            return dict(self._held)

    def _busier_than(self, priority: Priority) -> bool:
        return any(self._held[p] for p in Priority if p < priority)

"""The read-ahead window: grows while reads are sequential, resets on a seek.

One small component with one job, kept apart from fetching and FUSE so it can be tested
on its own: the reader asks it, for each read, how many bytes past the read to fetch.
"""

from __future__ import annotations

from dataclasses import dataclass

from bootseer.stripedfs.config import StripeConfig


@dataclass
class ReadWindow:
    config: StripeConfig
    size: int = 0
    next_offset: int | None = None  # where a sequential reader reads next
    sequential_reads: int = 0
    seeks: int = 0

    def __post_init__(self) -> None:
        self.size = self.config.initial_read_window

    def advance(self, offset: int, length: int) -> int:
        """Record a read of ``[offset, offset+length)``; return the read-ahead in bytes."""
        cfg = self.config
        expected = self.next_offset
        end = offset + length
        if expected is None:
            self.next_offset = end
        elif expected - cfg.max_backward_seek_distance <= offset <= (
            expected + cfg.max_forward_seek_distance
        ):
            self.sequential_reads += 1
            self.size = min(cfg.max_read_window, self.size * cfg.sequential_window_multiplier)
            self.next_offset = max(end, expected)  # a late, out-of-order read moves nothing
        else:
            self.seeks += 1
            self.size = cfg.initial_read_window
            self.next_offset = end
        return self.size

    def reset(self) -> None:
        """After an error: start small again, as after a seek."""
        self.size = self.config.initial_read_window
        self.next_offset = None

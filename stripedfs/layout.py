"""Where stripes start and end: fixed-size pieces that never cross an HDFS block boundary.

A stripe that crossed a block boundary would be served by two DataNodes one after the
other inside one request; aligned stripes each come from one DataNode, so parallel
stripes spread over the DataNodes that hold the file's blocks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Stripe:
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class StripeLayout:
    size: int
    stripe_size: int
    block_size: int | None = None  # None: the backend has no blocks (local files)

    def stripe_at(self, offset: int) -> Stripe:
        """The stripe containing ``offset`` (which must be inside the file)."""
        if not 0 <= offset < self.size:
            raise ValueError(f"offset {offset} outside a file of {self.size} bytes")
        block_start, block_end = 0, self.size
        if self.block_size:
            block_start = offset - offset % self.block_size
            block_end = min(self.size, block_start + self.block_size)
        start = block_start + (offset - block_start) // self.stripe_size * self.stripe_size
        return Stripe(start, min(start + self.stripe_size, block_end) - start)

    def stripes(self, start: int, end: int) -> Iterator[Stripe]:
        """Stripes overlapping ``[start, end)``, in order, clamped to the file."""
        offset, end = max(0, start), min(end, self.size)
        while offset < end:
            stripe = self.stripe_at(offset)
            yield stripe
            offset = stripe.end

"""A checkpoint file on this node's own file system, read with the striped reader's methods.

Two kinds of checkpoint bytes are local: a copy ``bootseer warm --checkpoint`` staged
(:mod:`bootseer.stripedfs.checkpoint_cache`) and an object of a ``file://`` store. Both are
read through one descriptor, opened once, with large positional reads (``preadv``, which
releases the GIL, so the loader's workers read in parallel): no open, ``fstat`` or thread
hand-off per stripe, no read-ahead window and no stripe memory, because the page cache
already is all of those. Every loader takes this reader or the striped one without
knowing which.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from bootseer.errors import InvalidRangeError
from bootseer.stripedfs.observer import FirstByte, ReadObserver

#: Bytes per positional read of a loader's chunk: large enough that a read's fixed cost
#: (a syscall, a Python call, a device copy launch) is small next to its copy, small
#: enough that a file's chunks spread over every worker (the hand-written loaders that
#: reach a GPU node's memory bandwidth use 16-32 MiB).
LOCAL_CHUNK = 16 << 20


class LocalFileReader:
    """The file open at ``fd`` (``size`` bytes; this reader closes it), named ``name``."""

    def __init__(self, fd: int, size: int, name: str, *,
                 observer: ReadObserver | None = None) -> None:
        self._fd, self.size, self.name = fd, size, name
        self._first_byte = FirstByte(observer, name)

    def readinto(self, offset: int, buffer: bytearray | memoryview) -> int:
        """Fill ``buffer`` from ``offset``; returns the byte count (short only at EOF)."""
        view = memoryview(buffer).cast("B")[: max(0, self.size - offset)]
        if not view:
            return 0
        self.read_chunk_into(offset, view)
        return len(view)

    def read_chunk_into(self, offset: int, view: memoryview) -> None:
        """Exactly ``len(view)`` bytes at ``offset`` into ``view``; an error if the file
        ends before (it was truncated under the reader)."""
        done = 0
        while done < len(view):
            n = os.preadv(self._fd, [view[done:]], offset + done)
            if n == 0:
                raise InvalidRangeError(f"{self.name} ends at {offset + done} bytes, not "
                                        f"{self.size}: it changed while it was read")
            done += n
        self._first_byte()

    def chunks(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        """``[start, end)`` as (offset, length) reads of :data:`LOCAL_CHUNK` at most."""
        end = min(end, self.size)
        for offset in range(max(0, start), end, LOCAL_CHUNK):
            yield offset, min(LOCAL_CHUNK, end - offset)

    def read(self, offset: int, length: int) -> bytes:
        return bytes(self.fetch(offset, length))

    def fetch(self, offset: int, length: int) -> bytearray:
        buffer = bytearray(max(0, min(length, self.size - offset)))
        self.readinto(offset, buffer)
        return buffer

    def submit_range(self, offset: int, length: int) -> LocalRange:
        """The striped reader's ``submit_range``: read when the result is asked for (local
        reads need no head start, and nothing is held in memory before that)."""
        return LocalRange(self, offset, length)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LocalFileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class LocalRange:
    """A range of a local file: :class:`bootseer.stripedfs.reader.PendingRange`'s
    counterpart."""

    reader: LocalFileReader
    offset: int
    length: int

    def result(self) -> bytearray:
        return self.reader.fetch(self.offset, self.length)

    def cancel(self) -> None:
        """Nothing was started."""

"""Asking the kernel to read parts of a file into its page cache ahead of their readers,
in pieces it reads whole.

``POSIX_FADV_WILLNEED`` (like ``readahead(2)``) reads at most the file's read-ahead
window of the range it is given: ``force_page_cache_ra`` caps a call at the larger of the
device's ``read_ahead_kb`` and its largest request (``max_sectors_kb``). A 100 MB range
asked for in one call is read for its first 8 MB on these machines, the rest silently
not at all. So each range is asked for in pieces of that window, found once per device in
sysfs; where it cannot be found (no block device), in pieces of the kernel's default
window, 128 KiB."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path

#: The kernel's default read-ahead window (``VM_READAHEAD_PAGES``).
DEFAULT_WINDOW = 128 << 10


def will_need(fd: int, ranges: Iterable[tuple[int, int]]) -> None:
    """Have the kernel start reading ``ranges`` (offset, length) of ``fd`` into its page
    cache (asynchronous: nothing is waited for but the reads' submission)."""
    window = device_window(os.fstat(fd).st_dev)
    for offset, length in ranges:
        end = offset + length
        while offset < end:
            piece = min(window, end - offset)
            os.posix_fadvise(fd, offset, piece, os.POSIX_FADV_WILLNEED)
            offset += piece


@functools.cache
def device_window(device: int) -> int:
    """The most one ``POSIX_FADV_WILLNEED`` reads on block device ``device`` (a
    partition's limits are its disk's)."""
    try:
        disk = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}").resolve(strict=True)
        if not (disk / "queue").is_dir():  # a partition: the directory below its disk's
            disk = disk.parent
        kib = max(int((disk / "queue" / "read_ahead_kb").read_text()),
                  int((disk / "queue" / "max_sectors_kb").read_text()))
    except (OSError, ValueError):
        return DEFAULT_WINDOW
    return max(DEFAULT_WINDOW, kib << 10)

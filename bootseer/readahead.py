"""Asking the kernel to read parts of a file into its page cache ahead of their readers,
in pieces it reads whole.

``POSIX_FADV_WILLNEED`` (like ``readahead(2)``) reads at most the file's read-ahead
window of the range it is given: ``force_page_cache_ra`` caps a call at the larger of the
device's ``read_ahead_kb`` and its largest request (``max_sectors_kb``). A 100 MB range
asked for in one call is read for its first 8 MB on these machines, the rest silently
not at all. So each range is asked for in pieces of that window, found once per device in
sysfs; where it cannot be found (no block device), in pieces of the kernel's default
window, 128 KiB.

Reads asked for well ahead of need can queue behind the reads someone waits for
(:func:`behind_others`): a warmed start's read-ahead of every whole file's hot blocks at
once (260 MB on the CPU preset) otherwise filled the disk's queue just as the agent mounted
the container's root over the image's metadata image, and the mount waited for it
(bench-image, CPU preset, 3 runs: mount 0.74 s against 0.25 s with the read-ahead behind
it)."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

#: The kernel's default read-ahead window (``VM_READAHEAD_PAGES``).
DEFAULT_WINDOW = 128 << 10
#: ``ioprio_set(2)``'s number; the call has no wrapper in Python or glibc.
SYS_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}.get(platform.machine())
IOPRIO_WHO_PROCESS = 1  # with id 0: the calling thread alone
IOPRIO_CLASS_IDLE = 3
IOPRIO_CLASS_SHIFT = 13


def behind_others() -> None:
    """Queue this thread's disk reads behind everyone else's (``IOPRIO_CLASS_IDLE``): for
    a thread whose reads are ahead of need, never what a start waits for. The block
    schedulers that order by priority (mq-deadline, BFQ) serve them when the disk has
    nothing else to do (mq-deadline still within seconds: its aging); one that does not
    (``none``, usual on NVMe) serves them as before."""
    if SYS_IOPRIO_SET is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_IOPRIO_SET, IOPRIO_WHO_PROCESS, 0,
                    IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT) != 0:  # not expected: lowering
        log.debug("read-ahead keeps its I/O priority: %s", os.strerror(ctypes.get_errno()))


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

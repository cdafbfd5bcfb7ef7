"""What of a file is in the page cache, and how to make it leave: for tests of what the
kernel is asked to read ahead."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path


def resident_pages(path: Path) -> list[bool]:
    """Whether each page of ``path`` is in the page cache (mincore; mapping reads nothing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        vec = (ctypes.c_ubyte * pages)()
        try:
            assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0
        finally:
            libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
    finally:
        os.close(fd)
    return [bool(page & 1) for page in vec]


def resident_mib(path: Path) -> list[bool]:
    """Whether each MiB of ``path`` is wholly in the page cache."""
    pages, per_mib = resident_pages(path), (1 << 20) // mmap.PAGESIZE
    return [all(pages[i:i + per_mib]) for i in range(0, len(pages), per_mib)]


def drop_cached(path: Path) -> None:
    """Write ``path`` back and drop its pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages stay cached
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert not any(resident_pages(path)), f"{path} stayed in the page cache"


def io_class(tid: int) -> int:
    """The I/O priority class of thread ``tid`` (``ioprio_get``: 0 none set, 2 best
    effort, 3 idle)."""
    from bootseer.readahead import IOPRIO_CLASS_SHIFT, IOPRIO_WHO_PROCESS

    number = {"x86_64": 252, "aarch64": 31}[os.uname().machine]
    libc = ctypes.CDLL(None, use_errno=True)
    value = libc.syscall(number, IOPRIO_WHO_PROCESS, tid)
    assert value >= 0, os.strerror(ctypes.get_errno())
    return value >> IOPRIO_CLASS_SHIFT

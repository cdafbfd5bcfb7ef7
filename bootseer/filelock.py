"""An exclusive ``flock`` on a file, so concurrent processes do not build the same thing twice."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from bootseer.errors import BootseerError


@contextlib.contextmanager
def file_lock(path: Path, timeout: float | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` for the ``with`` block.

    The file is created 0600 and opened without following a symlink: only its owner can
    open it, so nobody else can take the lock and hold it for ever (``flock`` needs only
    an open file, even a read-only one). With ``timeout``, waiting longer than that many
    seconds raises :class:`BootseerError` instead of waiting on.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if time.monotonic() > deadline:  # type: ignore[operator]
                    raise BootseerError(f"{path} stayed locked by another process for "
                                        f"{timeout:.0f} s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)

"""State that only the user who wrote it may change: files of theirs, 0600, in a 0700
directory of theirs, never through a symbolic link.

Some state must not be anyone else's to write, because acting on it later uses this
user's rights: a fan-out record (:mod:`bootseer.agents.fanout`) is undone with the
scheduler's HDFS identity, which may change every tenant's files. The store is no place
for it (every node agent and whoever else can write the store could forge one), nor is
any directory another user can write. So such state lives in the user's state directory
(``$XDG_STATE_HOME/bootseer``, else ``~/.local/state/bootseer``; root's too, since the
state is the invoking user's, not the node's), and every access checks it: the
directory is opened ``O_NOFOLLOW`` and must be this user's and closed to others, and
each file is opened relative to it, ``O_NOFOLLOW``, and must be a regular file of this
user's that no one else may read or write. Anything else is refused with
:class:`UnsafeStateError`, saying what to fix.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import platformdirs

from bootseer.errors import BootseerError, SizeLimitError


class UnsafeStateError(BootseerError):
    """A state directory or file that someone else could have written: not used."""


def state_dir(kind: str) -> Path:
    """Where this user keeps state of ``kind`` (one directory each)."""
    return Path(platformdirs.user_state_dir("bootseer")) / kind


def read(directory: Path, name: str, limit: int) -> bytes | None:
    """The file ``name`` in ``directory`` (None if there is none), at most ``limit``
    bytes."""
    with _opened(directory, create=False) as fd:
        if fd is None:
            return None
        try:
            file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                           dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UnsafeStateError(f"{directory / name}: cannot open it ({exc.strerror}); "
                                   f"it must be a plain file, not a link") from None
        with open(file, "rb") as f:
            info = os.fstat(f.fileno())
            _check(info, directory / name, directory=False)
            if info.st_size > limit:
                raise SizeLimitError(f"{directory / name}: {info.st_size} bytes, more than "
                                     f"the {limit} it may have")
            return f.read(info.st_size)


def write(directory: Path, name: str, data: bytes) -> None:
    """Replace the file ``name`` in ``directory`` with ``data``, whole (a temporary of
    this process's, renamed), mode 0600; the directory is made 0700 if missing."""
    with _opened(directory, create=True) as fd:
        assert fd is not None
        tmp = f".{name}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):  # a killed writer's: made anew, 0600
            os.unlink(tmp, dir_fd=fd)
        file = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                       os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            with open(file, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=fd)
            raise


def remove(directory: Path, name: str) -> None:
    """Remove the file ``name`` from ``directory``, if it is there."""
    with _opened(directory, create=False) as fd, contextlib.suppress(FileNotFoundError):
        if fd is not None:
            os.unlink(name, dir_fd=fd)


@contextlib.contextmanager
def _opened(directory: Path, *, create: bool) -> Iterator[int | None]:
    """``directory`` opened and checked (None if it does not exist and ``create`` is
    false)."""
    if create:
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if create:
            raise
        fd = None
    except OSError as exc:
        raise UnsafeStateError(f"{directory}: cannot open it ({exc.strerror}); it must be "
                               f"a directory, not a link") from None
    if fd is None:
        yield None
        return
    try:
        _check(os.fstat(fd), directory, directory=True)
        yield fd
    finally:
        os.close(fd)


def _check(info: os.stat_result, path: Path, *, directory: bool) -> None:
    """``info`` is of a directory (or a regular file) of this user's, closed to others."""
    kind, mode = (stat.S_ISDIR, 0o700) if directory else (stat.S_ISREG, 0o600)
    if not kind(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise UnsafeStateError(
            f"{path} must be a {'directory' if directory else 'plain file'} of this user's "
            f"(uid {os.geteuid()}) that no one else may use: chown {os.geteuid()} {path} "
            f"&& chmod {mode:04o} {path}, or remove it")

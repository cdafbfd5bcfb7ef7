"""``file://`` — the embedded store: a directory on local disk.

Objects are plain files under the root, so operators can inspect them with ordinary tools.
A write goes to ``<root>/.tmp/<random>.<pid>`` on the same file system, is fsync'ed, and is
published with one ``rename`` (or ``link`` for create-only), which POSIX makes atomic.
All-zero chunks become holes, so a multi-GB sparse file stays sparse in the store.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from stat import S_ISREG
from urllib.parse import unquote, urlsplit

from bootseer.errors import InvalidRangeError
from bootseer.store.base import (
    TEMP_PREFIX,
    ObjectInfo,
    ObjectWriter,
    Store,
    check_key,
    check_prefix,
)
from bootseer.zeros import is_zero

log = logging.getLogger(__name__)

_ZERO_CHECK = 64 << 10  # holes are punched in units of this many zero bytes


def path_from_url(url: str) -> Path:
    """``file:///a/b`` or a plain path → ``Path('/a/b')``; ``~`` is expanded."""
    parts = urlsplit(url)
    if parts.scheme not in ("", "file"):
        raise ValueError(f"not a local store URL: {url}")
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"file:// URL with a host is not supported: {url}")
    return Path(os.path.expanduser(unquote(parts.path))).absolute()


class LocalStore(Store):
    """A store in a local directory (created on first use)."""

    protocols = ("file",)

    def __init__(self, url: str, *, fsync: bool = True) -> None:
        self.root = path_from_url(url)
        super().__init__(self.root.as_uri())
        self.fsync = fsync
        self._tmp = self.root / TEMP_PREFIX

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        st = os.stat(path)
        if not S_ISREG(st.st_mode):
            raise FileNotFoundError(errno.ENOENT, "not an object", str(path))
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def _read_range(self, key: str, offset: int, length: int) -> bytes:
        fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        try:
            parts = []
            while length:
                chunk = os.pread(fd, length, offset)
                if not chunk:
                    break
                parts.append(chunk)
                offset += len(chunk)
                length -= len(chunk)
            return b"".join(parts)
        finally:
            os.close(fd)

    def read_range_into(self, key: str, offset: int, buffer: memoryview) -> None:
        fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        try:
            done = 0
            while done < len(buffer):
                n = os.preadv(fd, [buffer[done:]], offset + done)
                if n == 0:
                    raise InvalidRangeError(f"{key}: range {offset}+{len(buffer)} is past the "
                                            f"end of the object ({os.fstat(fd).st_size} bytes)")
                done += n
        finally:
            os.close(fd)

    def open_writer(self) -> ObjectWriter:
        self._tmp.mkdir(parents=True, exist_ok=True)
        return _LocalWriter(self, self._tmp / f"{secrets.token_hex(8)}.{os.getpid()}")

    def delete(self, key: str) -> None:
        os.unlink(self._path(key))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        directory, _, stem = prefix.rpartition("/")
        start = self.root / directory if directory else self.root
        yield from self._walk(start, directory, stem)

    def _walk(self, path: Path, key_dir: str, stem: str) -> Iterator[ObjectInfo]:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if not entry.name.startswith(stem) or (not key_dir and entry.name == TEMP_PREFIX):
                continue
            key = f"{key_dir}/{entry.name}" if key_dir else entry.name
            if entry.is_dir(follow_symlinks=False):
                yield from self._walk(Path(entry.path), key, "")
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                yield ObjectInfo(key, st.st_size, st.st_mtime)

    def sweep_temporaries(self, older_than: float = 3600.0) -> int:
        removed = 0
        cutoff = time.time() - older_than
        for entry in os.scandir(self._tmp) if self._tmp.is_dir() else ():
            pid = entry.name.rpartition(".")[2]
            alive = pid.isdigit() and pid_alive(int(pid))
            if entry.stat().st_mtime <= cutoff and not alive:
                os.unlink(entry.path)
                removed += 1
        return removed


class _LocalWriter(ObjectWriter):
    def __init__(self, store: LocalStore, tmp: Path) -> None:
        super().__init__()
        self._store, self._tmp = store, tmp
        self._fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        for start in range(0, len(view), _ZERO_CHECK):
            piece = view[start : start + _ZERO_CHECK]
            if is_zero(piece):
                self.size += len(piece)  # leave a hole; ftruncate at commit sets the size
                continue
            written = 0
            while written < len(piece):
                written += os.pwrite(self._fd, piece[written:], self.size + written)
            self.size += len(piece)

    def commit(self, key: str, *, overwrite: bool = True) -> ObjectInfo:
        dest = self._store._path(key)
        try:
            os.ftruncate(self._fd, self.size)
            if self._store.fsync:
                os.fsync(self._fd)
            os.close(self._fd)
            self.closed = True
            dest.parent.mkdir(parents=True, exist_ok=True)
            if overwrite:
                os.replace(self._tmp, dest)
            else:
                os.link(self._tmp, dest)  # fails with EEXIST if another writer published first
                os.unlink(self._tmp)
        except BaseException:
            self.abort()
            raise
        if self._store.fsync:
            _fsync_dir(dest.parent)
        return self._store.stat(key)

    def abort(self) -> None:
        if not self.closed:
            os.close(self._fd)
            self.closed = True
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass



def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a stale temporary's writer is gone when not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

"""``file://`` — the embedded store: a directory on local disk.

Objects are plain files under the root, so operators can inspect them with ordinary tools.
Below the root, reads never follow a symlink: every path component is opened with
``O_NOFOLLOW`` from the one above it. A checkpoint directory is often writable by the jobs
that save into it, and the agent reads it as root: a symlink planted there must not lead
it to ``/etc/shadow``.
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
    Access,
    ObjectInfo,
    ObjectWriter,
    Perm,
    Progress,
    Store,
    check_key,
    check_prefix,
    readable_bits,
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

    def _open(self, key: str) -> int:
        """A descriptor of the object ``key``, reached without following any symlink
        below the root (``ELOOP`` or ``ENOENT`` otherwise)."""
        *dirs, name = check_key(key).split("/")
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in dirs:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW |
                                os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = child
            target = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=fd)
        finally:
            os.close(fd)
        if not S_ISREG(os.fstat(target).st_mode):  # a FIFO, a device: not an object
            os.close(target)
            raise FileNotFoundError(errno.ENOENT, "not an object", str(self.root / key))
        return target

    def open_local(self, key: str) -> int:
        return self._open(key)

    def _fstat(self, key: str) -> os.stat_result:
        fd = self._open(key)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def stat(self, key: str) -> ObjectInfo:
        st = self._fstat(key)
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def access(self, key: str) -> Access:
        st = self._fstat(key)
        real = Path(os.path.realpath(self.root)) / key
        parents = [Perm(p.st_uid, p.st_gid, p.st_mode) for p in map(os.stat, real.parents)]
        return Access(st.st_uid, st.st_gid,
                      readable_bits(Perm(st.st_uid, st.st_gid, st.st_mode), parents))

    def _read_range(self, key: str, offset: int, length: int) -> bytes:
        fd = self._open(key)
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

    def read_range_into(self, key: str, offset: int, buffer: memoryview, *,
                        progress: Progress | None = None) -> None:
        fd = self._open(key)
        try:
            done = 0
            while done < len(buffer):
                n = os.preadv(fd, [buffer[done:]], offset + done)
                if n == 0:
                    raise InvalidRangeError(f"{key}: range {offset}+{len(buffer)} is past the "
                                            f"end of the object ({os.fstat(fd).st_size} bytes)")
                done += n
                if progress is not None:
                    progress(done)
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
        try:
            fd = self._open_dir(directory)
        except (FileNotFoundError, NotADirectoryError, OSError):
            return  # absent, not a directory, or a symlink: nothing listed below it
        yield from self._walk(fd, directory, stem)

    def _open_dir(self, directory: str) -> int:
        """A descriptor of the directory ``directory`` ("" for the root), no symlinks."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        for part in directory.split("/") if directory else ():
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW |
                                os.O_CLOEXEC, dir_fd=fd)
            finally:
                os.close(fd)
            fd = child
        return fd

    def _walk(self, fd: int, key_dir: str, stem: str) -> Iterator[ObjectInfo]:
        """Objects below the directory open as ``fd`` (closed here), descending by
        descriptor: a directory swapped for a symlink meanwhile is not followed."""
        try:
            entries = sorted(os.scandir(fd), key=lambda e: e.name)
            for entry in entries:
                if not entry.name.startswith(stem) or (not key_dir and entry.name == TEMP_PREFIX):
                    continue
                key = f"{key_dir}/{entry.name}" if key_dir else entry.name
                if entry.is_dir(follow_symlinks=False):
                    try:
                        child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY |
                                        os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    except OSError:
                        continue  # gone, or replaced by a symlink, since it was listed
                    yield from self._walk(child, key, "")
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    yield ObjectInfo(key, st.st_size, st.st_mtime)
        finally:
            os.close(fd)

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
            # What was published, from the file itself: another writer may replace or
            # remove the key as soon as it is renamed, and stat-ing it then would fail
            # (or describe their object) though this commit succeeded.
            published = os.fstat(self._fd)
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
        return ObjectInfo(key, published.st_size, published.st_mtime)

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
    """Whether process ``pid`` runs (a stale temporary's writer is gone when not). A
    zombie is dead: it writes nothing more, and where nothing reaps it (a container
    without an init) it would otherwise keep its leftovers for good."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc here: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

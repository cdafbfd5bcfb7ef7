"""What the two HDFS backends share: paths, temporaries and the publish protocol.

HDFS renames atomically, so:

* create-only publish (blobs, ``overwrite=False``) is one ``rename``; HDFS refuses it when
  the destination exists, which makes racing writers of the same blob safe;
* overwriting publish (references) is one ``rename`` with ``OVERWRITE`` (``rename2``) where
  the backend reaches it (:attr:`HadoopStyleStore.renames_over`: ``hdfs://``): a reader
  finds the old object or the new one, never none. WebHDFS 2.7 does not offer it, so
  there the old object is deleted, then the new one renamed in: a reader in that instant
  finds no object (``FileNotFoundError``), never a partial one. Either way, when two
  writers overwrite at once, the one whose rename lands last is the result.

A backend implements the few file-system primitives below (``_fs_*``); the :class:`Store`
methods are built from them here once.
"""

from __future__ import annotations

import logging
import os
import posixpath
import secrets
import socket
import time
from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from bootseer.store.base import (
    TEMP_PREFIX,
    Access,
    ObjectInfo,
    ObjectWriter,
    Perm,
    Store,
    check_key,
    check_prefix,
    readable_bits,
)

log = logging.getLogger(__name__)


class OutputFile(Protocol):
    """A file being written; ``close`` returns once HDFS has acknowledged every byte."""

    def write(self, data: bytes | memoryview) -> object: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class PathInfo:
    path: str
    size: int
    mtime: float
    is_dir: bool
    block_size: int | None = None


#: HDFS's own ceiling (``dfs.replication.max``, default 512).
MAX_REPLICAS = 512


class HadoopStyleStore(Store):
    """A :class:`Store` rooted at a directory of a Hadoop-compatible file system."""

    default_port: int = 0
    #: Whether ``_fs_rename`` can replace an existing destination atomically.
    renames_over: bool = False

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if not parts.hostname:
            raise ValueError(f"{url}: an HDFS store URL needs a host, e.g. "
                             f"{parts.scheme}://namenode:{self.default_port}/bootseer")
        self.host = parts.hostname
        self.port = parts.port or self.default_port
        self.root = posixpath.normpath(parts.path or "/")
        super().__init__(f"{parts.scheme}://{self.host}:{self.port}{self.root}")

    # -- primitives a backend provides --------------------------------------------------------

    @abstractmethod
    def _fs_info(self, path: str) -> PathInfo | None:
        """Status of ``path``, or None if it does not exist."""

    @abstractmethod
    def _fs_perm(self, path: str) -> Perm | None:
        """Owner and group names and permission bits of ``path``, None if it is absent."""

    @abstractmethod
    def _fs_read(self, path: str, offset: int, length: int) -> bytes:
        """A positional read; fewer bytes only at the end of the file."""

    @abstractmethod
    def _fs_create(self, path: str) -> OutputFile:
        """Create ``path`` for streaming writes (replication and block size applied)."""

    @abstractmethod
    def _fs_rename(self, src: str, dst: str, *, overwrite: bool = False) -> bool:
        """HDFS rename; False (not an exception) when the destination exists. ``overwrite``
        (only where :attr:`renames_over`): replace it, atomically."""

    @abstractmethod
    def _fs_delete(self, path: str) -> bool:
        """Delete a file; False if it did not exist."""

    @abstractmethod
    def _fs_mkdirs(self, path: str) -> None:
        """Create a directory and its parents."""

    @abstractmethod
    def _fs_walk(self, path: str) -> Iterator[PathInfo]:
        """Every file below ``path``, recursively (nothing if ``path`` does not exist)."""

    @abstractmethod
    def _fs_replication(self, path: str) -> int | None:
        """The replication factor of file ``path``; None if it does not exist."""

    @abstractmethod
    def _fs_set_replication(self, path: str, replicas: int) -> bool:
        """Set the replication factor of file ``path``; False if it does not exist."""

    # -- the Store surface --------------------------------------------------------------------

    def _path(self, key: str) -> str:
        return posixpath.join(self.root, check_key(key))

    def stat(self, key: str) -> ObjectInfo:
        info = self._fs_info(self._path(key))
        if info is None or info.is_dir:
            raise FileNotFoundError(f"no object {key!r} in the store {self.url}")
        return ObjectInfo(key, info.size, info.mtime)

    def replication(self, key: str) -> int | None:
        replicas = self._fs_replication(self._path(key))
        if replicas is None:
            raise FileNotFoundError(f"no object {key!r} in the store {self.url}")
        return replicas

    def set_replication(self, key: str, replicas: int) -> bool:
        if not 1 <= replicas <= MAX_REPLICAS:
            raise ValueError(f"replication {replicas}: give 1 to {MAX_REPLICAS}")
        if not self._fs_set_replication(self._path(key), replicas):
            raise FileNotFoundError(f"no object {key!r} in the store {self.url}")
        return True

    def access(self, key: str) -> Access:
        """HDFS's own permissions (owner, group, mode, and search permission on every
        directory above), its user and group names mapped to this node's accounts by name,
        as HDFS's simple authentication maps them; a name with no account here gets no
        bits."""
        path = self._path(key)
        target = self._fs_perm(path)
        if target is None:
            raise FileNotFoundError(f"no object {key!r} in the store {self.url}")
        parents = []
        for parent in _parents(path):
            perm = self._fs_perm(parent)
            if perm is None:
                raise FileNotFoundError(f"no object {key!r} in the store {self.url}")
            parents.append(perm)
        mode = readable_bits(target, parents)
        uid, gid = _local_uid(str(target.owner)), _local_gid(str(target.group))
        if uid is None:
            mode &= ~0o400
        if gid is None:
            mode &= ~0o040
        return Access(uid, gid, mode)

    def _read_range(self, key: str, offset: int, length: int) -> bytes:
        return self._fs_read(self._path(key), offset, length)

    def block_size(self, key: str) -> int | None:
        info = self._fs_info(self._path(key))
        if info is None or info.is_dir:
            raise FileNotFoundError(f"no object {key!r} in the store {self.url}")
        return info.block_size

    def open_writer(self) -> ObjectWriter:
        tmp_dir = posixpath.join(self.root, TEMP_PREFIX)
        name = f"{secrets.token_hex(8)}.{socket.gethostname()}.{os.getpid()}"
        return _PublishingWriter(self, posixpath.join(tmp_dir, name))

    def delete(self, key: str) -> None:
        if not self._fs_delete(self._path(key)):
            raise FileNotFoundError(f"no object {key!r} in the store {self.url}")

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        directory = prefix.rpartition("/")[0]
        start = posixpath.join(self.root, directory) if directory else self.root
        found = []
        for info in self._fs_walk(start):
            key = posixpath.relpath(info.path, self.root)
            if key.startswith(prefix) and not key.startswith(TEMP_PREFIX + "/"):
                found.append(ObjectInfo(key, info.size, info.mtime))
        yield from sorted(found, key=lambda i: i.key)

    def sweep_temporaries(self, older_than: float = 3600.0) -> int:
        """Remove temporaries older than ``older_than`` seconds.

        Writers on other hosts cannot be asked whether they are alive, so age alone
        decides: keep ``older_than`` above the longest write (and the HDFS lease, 1 h).
        """
        cutoff = time.time() - older_than
        removed = 0
        for info in self._fs_walk(posixpath.join(self.root, TEMP_PREFIX)):
            if info.mtime <= cutoff and self._fs_delete(info.path):
                removed += 1
        return removed

    def _publish(self, tmp: str, key: str, overwrite: bool, size: int) -> ObjectInfo:
        dest = self._path(key)
        self._fs_mkdirs(posixpath.dirname(dest))
        if overwrite and self.renames_over:
            if not self._fs_rename(tmp, dest, overwrite=True):
                self._fs_delete(tmp)
                raise OSError(f"{self.url}: could not publish {key!r} (rename failed)")
            return ObjectInfo(key, size, time.time())
        if overwrite:
            self._fs_delete(dest)
        if not self._fs_rename(tmp, dest):
            self._fs_delete(tmp)
            if self._fs_info(dest) is None:
                raise OSError(f"{self.url}: could not publish {key!r} (rename failed)")
            if not overwrite:
                raise FileExistsError(f"object {key!r} already exists in the store {self.url}")
            # Another writer published between our delete and our rename: their write
            # is simply the later one, as if ours had landed just before it.
            log.debug("concurrent overwrite of %s: the other writer's object stays", key)
        # Not a stat: with overwrite, a concurrent writer may already be replacing it.
        return ObjectInfo(key, size, time.time())


class _PublishingWriter(ObjectWriter):
    """Streams through the backend's writer to a temporary path, then renames it."""

    def __init__(self, store: HadoopStyleStore, tmp: str) -> None:
        super().__init__()
        self._store, self._tmp = store, tmp
        self._file: OutputFile | None = store._fs_create(tmp)

    def write(self, data: bytes | memoryview) -> None:
        assert self._file is not None, "write after commit or abort"
        self._file.write(data)
        self.size += len(data)

    def commit(self, key: str, *, overwrite: bool = True) -> ObjectInfo:
        check_key(key)
        try:
            assert self._file is not None, "commit after commit or abort"
            self._file.close()  # every byte acknowledged by the DataNodes
            self._file = None
            self.closed = True
            return self._store._publish(self._tmp, key, overwrite, self.size)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        self.closed = True
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except Exception:
                log.debug("closing the abandoned temporary %s failed", self._tmp, exc_info=True)
        try:
            self._store._fs_delete(self._tmp)
        except Exception:  # best effort: sweep_temporaries removes what is left
            log.warning("could not remove temporary %s", self._tmp, exc_info=True)


def _parents(path: str) -> list[str]:
    """``/a/b/c`` -> ``["/", "/a", "/a/b"]``."""
    out, parent = [], posixpath.dirname(path)
    while True:
        out.append(parent)
        if parent == "/":
            return out[::-1]
        parent = posixpath.dirname(parent)


def _local_uid(name: str) -> int | None:
    import pwd

    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def _local_gid(name: str) -> int | None:
    import grp

    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None

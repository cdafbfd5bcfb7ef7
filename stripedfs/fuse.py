"""The read-only FUSE mount of a checkpoint directory: a thin layer over the data layer.

Every call is translated, nothing more: a path the :class:`StoreTree` does not know is
``ENOENT``, any write is ``EROFS``, and a read that fails in the striped reader is logged
and becomes ``EIO`` (a process never gets short or wrong bytes). Each open file handle has
its own :class:`StripedReader`, so eight ranks reading eight shards each get their own
read-ahead window; all share the process's bounded fetch pool and its one memory cap
(``checkpoint.mount_memory``), however many files are open.

Files show the owner, group and read bits the store gives them (:meth:`Store.access`),
narrowed by ``mode`` (``checkpoint.mount_mode``); where the store cannot say, ``mode``
itself, owned by root. The kernel enforces them (``default_permissions``). The mount is
``nosuid,nodev``.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import stat
import threading
from pathlib import Path

from fuse import FUSE, FuseOSError, Operations  # fusepy

from bootseer.store import Store
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.reader import StripedReader
from bootseer.stripedfs.tree import StoreTree

log = logging.getLogger(__name__)


class StripedOperations(Operations):
    def __init__(self, store: Store, config: StripeConfig | None = None,
                 metadata_ttl: float = 30.0, mode: int = 0o444) -> None:
        self.store, self.config = store, config or StripeConfig()
        self.tree = StoreTree(store, ttl=metadata_ttl)
        self.file_mode = mode & 0o444
        self.dir_mode = self.file_mode | (self.file_mode >> 2)  # search where readable
        self._readers: dict[int, StripedReader] = {}
        self._handles = itertools.count(1)
        self._lock = threading.Lock()

    def getattr(self, path: str, fh: int | None = None) -> dict:
        entry = self.tree.lookup(path)
        if entry is None:
            raise FuseOSError(errno.ENOENT)
        uid = gid = 0
        if entry.is_dir:
            mode = stat.S_IFDIR | self.dir_mode
        else:
            access = self.tree.access(path)
            bits = self.file_mode if access is None else access.mode & self.file_mode
            if access is not None:
                uid, gid = access.uid or 0, access.gid or 0
            mode = stat.S_IFREG | bits
        return {"st_mode": mode, "st_nlink": 2 if entry.is_dir else 1, "st_size": entry.size,
                "st_mtime": entry.mtime, "st_ctime": entry.mtime, "st_atime": entry.mtime,
                "st_uid": uid, "st_gid": gid}

    def readdir(self, path: str, fh: int) -> list[str]:
        names = self.tree.listdir(path)
        if names is None:
            raise FuseOSError(errno.ENOTDIR if self.tree.lookup(path) else errno.ENOENT)
        return [".", "..", *names]

    def open(self, path: str, flags: int) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC):
            raise FuseOSError(errno.EROFS)
        entry = self.tree.lookup(path)
        if entry is None or entry.is_dir:
            raise FuseOSError(errno.ENOENT if entry is None else errno.EISDIR)
        try:
            reader = StripedReader(self.store, self.tree.key(path), config=self.config,
                                   size=entry.size)
        except FileNotFoundError:
            raise FuseOSError(errno.ENOENT) from None
        with self._lock:
            fh = next(self._handles)
            self._readers[fh] = reader
        return fh

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        reader = self._readers.get(fh)
        if reader is None:
            raise FuseOSError(errno.EBADF)
        try:
            return reader.read(offset, size)
        except Exception as exc:
            log.error("read of %s at %d (+%d) failed: %s", path, offset, size, exc)
            raise FuseOSError(errno.EIO) from exc

    def release(self, path: str, fh: int) -> int:
        with self._lock:
            reader = self._readers.pop(fh, None)
        if reader is not None:
            reader.close()
        return 0

    def statfs(self, path: str) -> dict:
        return {"f_bsize": 1 << 20, "f_namemax": 255}


def mount(store: Store, mountpoint: Path, *, direct_io: bool, config: StripeConfig | None = None,
          metadata_ttl: float = 30.0, mode: int = 0o444) -> None:
    """Serve ``store`` at ``mountpoint`` until unmounted or SIGTERM/SIGINT (foreground)."""
    ops = StripedOperations(store, config, metadata_ttl, mode)
    options = {"foreground": True, "ro": True, "fsname": _fsname(store.url),
               "subtype": "bootseer", "default_permissions": True, "nosuid": True,
               "nodev": True}
    if os.geteuid() == 0:
        options["allow_other"] = True
    if direct_io:
        options["direct_io"] = True
    FUSE(ops, str(mountpoint), nothreads=False, **options)


def _fsname(url: str) -> str:
    """The mount's source name, as libfuse's option list can carry it: a comma or a
    backslash in a URL would otherwise end the option and start another (``,suid``)."""
    return "bootseer:" + "".join("_" if c in ",\\=" or not c.isprintable() else c
                                 for c in url)

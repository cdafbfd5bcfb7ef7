"""The read-only FUSE mount of a checkpoint directory: a thin layer over the data layer.

Every call is translated, nothing more: a path the :class:`StoreTree` does not know is
``ENOENT``, any write is ``EROFS``, and a read that fails in the striped reader is logged
and becomes ``EIO`` (a process never gets short or wrong bytes). Each open file handle has
its own :class:`StripedReader`, so eight ranks reading eight shards each get their own
read-ahead window; all share the process's bounded fetch pool.
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
from stripedfs.config import StripeConfig
from stripedfs.reader import StripedReader
from stripedfs.tree import StoreTree

log = logging.getLogger(__name__)


class StripedOperations(Operations):
    def __init__(self, store: Store, config: StripeConfig | None = None,
                 metadata_ttl: float = 30.0) -> None:
        self.store, self.config = store, config or StripeConfig()
        self.tree = StoreTree(store, ttl=metadata_ttl)
        self._readers: dict[int, StripedReader] = {}
        self._handles = itertools.count(1)
        self._lock = threading.Lock()
        self._uid, self._gid = os.getuid(), os.getgid()

    def getattr(self, path: str, fh: int | None = None) -> dict:
        entry = self.tree.lookup(path)
        if entry is None:
            raise FuseOSError(errno.ENOENT)
        mode = (stat.S_IFDIR | 0o555) if entry.is_dir else (stat.S_IFREG | 0o444)
        return {"st_mode": mode, "st_nlink": 2 if entry.is_dir else 1, "st_size": entry.size,
                "st_mtime": entry.mtime, "st_ctime": entry.mtime, "st_atime": entry.mtime,
                "st_uid": self._uid, "st_gid": self._gid}

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
          metadata_ttl: float = 30.0) -> None:
    """Serve ``store`` at ``mountpoint`` until unmounted or SIGTERM/SIGINT (foreground)."""
    ops = StripedOperations(store, config, metadata_ttl)
    options = {"foreground": True, "ro": True, "fsname": f"bootseer:{store.url}",
               "subtype": "bootseer", "default_permissions": True}
    if os.geteuid() == 0:
        options["allow_other"] = True
    if direct_io:
        options["direct_io"] = True
    FUSE(ops, str(mountpoint), nothreads=False, **options)

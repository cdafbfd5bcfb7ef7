"""The read-only FUSE mount of a lazy image: a thin translation of :class:`LazyImage`.

Inode numbers come from the manifest (``use_ino``), so hard links share an inode and
``st_nlink`` matches the image; device nodes carry their device numbers; xattrs are the
image's. A path the manifest does not have is ``ENOENT``, a missing xattr ``ENODATA``, any
write ``EROFS``, and a read that fails (store unreachable, block corrupt twice) is logged
and becomes ``EIO``.

Requests the kernel stops sending once told ``ENOSYS`` are answered so: ``flush`` (nothing
is ever written) and, for an image without any xattr, ``getxattr`` — overlayfs otherwise
probes ``trusted.overlay.*`` on every lookup, thousands of round trips per start.

The content never changes, so the kernel may keep its pages across opens
(``kernel_cache``) and read ahead in large steps (``max_readahead``): fewer round trips
through this Python server.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

from fuse import FUSE, FuseOSError, Operations  # fusepy

from bootseer.prefetch.blockformat import FileEntry
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.prefetcher import Prefetcher
from bootseer.prefetch.recording import Recording
from bootseer.prefetch.rootfs import Kind

log = logging.getLogger(__name__)

_TYPE = {Kind.FILE: stat.S_IFREG, Kind.HARDLINK: stat.S_IFREG, Kind.DIR: stat.S_IFDIR,
         Kind.SYMLINK: stat.S_IFLNK, Kind.CHAR: stat.S_IFCHR, Kind.BLOCK: stat.S_IFBLK,
         Kind.FIFO: stat.S_IFIFO}


class LazyImageOperations(Operations):
    def __init__(self, image: LazyImage, prefetcher: Prefetcher | None = None,
                 recording: Recording | None = None) -> None:
        self.image, self.prefetcher, self.recording = image, prefetcher, recording
        self.has_xattrs = any(e.xattrs for e in image.manifest.entries)

    def _entry(self, path: str) -> FileEntry:
        entry = self.image.lookup(path)
        if entry is None:
            raise FuseOSError(errno.ENOENT)
        return entry

    def getattr(self, path: str, fh: int | None = None) -> dict:
        e = self._entry(path)
        attrs = {"st_mode": _TYPE[e.kind] | e.mode, "st_ino": e.ino, "st_nlink": e.nlink,
                 "st_uid": e.uid, "st_gid": e.gid, "st_size": e.size, "st_mtime": e.mtime,
                 "st_ctime": e.mtime, "st_atime": e.mtime, "st_blocks": (e.size + 511) // 512}
        if e.kind in (Kind.CHAR, Kind.BLOCK):
            attrs["st_rdev"] = os.makedev(e.devmajor, e.devminor)
        return attrs

    def readdir(self, path: str, fh: int) -> list[str]:
        if self._entry(path).kind != Kind.DIR:
            raise FuseOSError(errno.ENOTDIR)
        return [".", "..", *self.image.listdir(path)]

    def readlink(self, path: str) -> str:
        entry = self._entry(path)
        if entry.kind != Kind.SYMLINK or entry.link_target is None:
            raise FuseOSError(errno.EINVAL)
        return entry.link_target

    def open(self, path: str, flags: int) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC):
            raise FuseOSError(errno.EROFS)
        self._entry(path)
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        entry = self._entry(path)
        try:
            return self.image.read(entry, offset, size)
        except Exception as exc:
            log.error("read of %s at %d (+%d) failed: %s", path, offset, size, exc)
            raise FuseOSError(errno.EIO) from exc

    def flush(self, path: str, fh: int) -> None:
        raise FuseOSError(errno.ENOSYS)

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        if not self.has_xattrs:
            raise FuseOSError(errno.ENOSYS)
        value = self._entry(path).xattrs.get(name)
        if value is None:
            raise FuseOSError(errno.ENODATA)
        return value

    def listxattr(self, path: str) -> list[str]:
        return list(self._entry(path).xattrs)

    def statfs(self, path: str) -> dict:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}


def mount(image: LazyImage, mountpoint: Path, *, prefetcher: Prefetcher | None = None,
          recording: Recording | None = None) -> None:
    """Serve ``image`` at ``mountpoint`` until unmounted or SIGTERM/SIGINT (foreground)."""
    options = {"foreground": True, "ro": True, "use_ino": True, "fsname": "bootseer-image",
               "subtype": "bootseer", "default_permissions": True, "kernel_cache": True,
               "nosuid": True, "nodev": True,
               "max_readahead": 1 << 20, "entry_timeout": 3600, "attr_timeout": 3600,
               "negative_timeout": 3600}
    if os.geteuid() == 0:
        options["allow_other"] = True
    FUSE(LazyImageOperations(image, prefetcher, recording), str(mountpoint), nothreads=False,
         **options)

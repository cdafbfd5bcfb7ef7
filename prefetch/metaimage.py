"""An image's names and attributes as a kernel file system, its data from the whole files.

Served through FUSE, a warmed start still sends the mount's server one request per name it
looks up and per file it opens (a torch start: ~4,400), and that, not the bytes, is what
kept it slower than the same start on local disk. The kernel can answer all of them
itself, the way composefs does: the image's tree is written once per node as an EROFS
image of *metadata only* (an entry of the whole files' cache, ``<cache_dir>/files``),
every regular file with content a sparse stub that carries the overlay xattrs
``metacopy`` and ``redirect=/<key[:2]>/<key>``, its whole-file key
(:mod:`bootseer.prefetch.wholefiles`).
The container's root is then an overlay over the EROFS mount whose *data-only* lower
layers are, in order, the node's whole files (read by the kernel, in place) and the
mount's FUSE connection serving the same keys (:class:`KeyTree`): a file not whole on the
node is still read lazily, block by block, by the server.

* **Who builds it.** ``bootseer warm`` (as root, through the agent), after making files
  whole, if :func:`unsupported` finds the kernel and ``mkfs.erofs`` able to. It depends on
  the manifest alone (keys name content, not what is on the node), so it is built once
  per image and never goes stale; files evicted later are found in the FUSE layer instead.
  It counts against the cache's size limit like a whole file (~450 bytes a file of the
  image), and is evicted like one.
* **What it holds.** Names, modes, owners, times, links, devices and the image's xattrs,
  except any ``trusted.*`` one: an image must not be able to name a redirect (another
  file's bytes) or any other overlay directive of its own. A file whose blocks do not add
  up (:meth:`WholeFiles.key` says None) has no key to redirect to, so an image with one
  gets no metadata image and is served through FUSE as before. Paths are checked
  (absolute, no ``.``/``..``/empty part, a directory's children only under a directory
  this build made), so a hostile manifest cannot write outside the build directory.
* **Trust.** The image and the whole files are root's alone; the container reaches them
  only through the overlay, which escapes any ``trusted.overlay.*`` xattr written through
  it (Linux 6.7), so a container cannot forge a redirect in its writable layer either.
* **Not while recording.** Reads the kernel serves never reach the server, so a start
  that records its hot blocks is served through FUSE throughout.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bootseer.errors import BootseerError
from bootseer.fuse.tree import ROOT, Node, PushPages
from bootseer.mounts import unmount
from bootseer.nodecache import NodeCache, NotCached, whole_files_beside
from bootseer.prefetch.blockformat import FileEntry
from bootseer.prefetch.imagetree import ImageTree
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.rootfs import Kind
from bootseer.prefetch.wholefiles import WholeFiles
from bootseer.readahead import will_need

log = logging.getLogger(__name__)

MKFS = "mkfs.erofs"
#: How the stubs' (sparse, never read) bytes are stored: compressed in 1 MiB clusters,
#: each file's tail packed into its inode. erofs-utils 1.5 writes a file's last partial
#: chunk even when it is a hole, so 4 KiB-chunked stubs cost ~4 KiB a file (the torch
#: image: 24 MB, built in 6.3 s); these cost ~450 bytes (12 MB for its 27,905 files, 1.4 s).
STUB_OPTIONS = ("-zlz4", "-C1048576", "-Eztailpacking")
METACOPY = "trusted.overlay.metacopy"
REDIRECT = "trusted.overlay.redirect"
MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
_TAG = b"bootseer-metadata-image/1\0"


def redirect(key: str) -> str:
    """Where a file of content ``key`` is in each data layer (the whole files' layout)."""
    return f"/{key[:2]}/{key}"


class MetaImage:
    """The metadata image of image ``image_id``: an entry of the whole files' cache
    ``files``, counted against its one size limit and evicted like any other (least
    recently mounted first; a start after that is served through FUSE, and the next warm
    builds it again). Named by a key over the image id, as whole files are named by a key
    over their blocks, so it is never taken for one."""

    def __init__(self, files: NodeCache, image_id: str) -> None:
        self.files, self.image_id = files, image_id
        files.check_digest(image_id.removeprefix("sha256:"))
        self.key = hashlib.sha256(_TAG + image_id.encode()).hexdigest()
        self.path = files.path(self.key)

    @classmethod
    def of(cls, image: LazyImage) -> MetaImage:
        return cls(whole_files_beside(image.cache), image.image_id)

    @property
    def data_dir(self) -> Path:
        """The whole files' directory: the first data-only layer."""
        return self.files.directory / "entries"

    def exists(self) -> bool:
        return self.path.is_file()

    def use(self) -> bool:
        """Whether it exists, marked used if so: the server that chooses to serve by key
        makes it the cache's last to evict before the agent mounts it."""
        try:
            os.close(self.files.open_unverified(self.key))  # the cache's mark of a use
        except FileNotFoundError:
            return False
        return True

    def build(self, whole: WholeFiles) -> bool:
        """Write the image (if it is not there yet); False if this image cannot have one
        (a regular file without a key: see the module docstring)."""
        if self.exists():
            return True
        entries = whole.image.manifest.entries
        keys = {}
        for entry in entries:
            if entry.kind is Kind.FILE and entry.size > 0:
                key = whole.key(entry)
                if key is None:
                    log.info("image %s: %s has no whole-file key; no metadata image",
                             self.image_id, entry.path)
                    return False
                keys[entry.path] = key
        out = self.files.new_temporary(self.key)  # a dead builder's is swept by the cache
        with tempfile.TemporaryDirectory(dir=_scratch(), prefix="bootseer-meta-") as tree:
            _write_tree(Path(tree), entries, keys)
            try:
                proc = subprocess.run([MKFS, "--quiet", "--preserve-mtime", *STUB_OPTIONS,
                                       str(out), tree], capture_output=True, text=True,
                                      stdin=subprocess.DEVNULL)
                if proc.returncode != 0:
                    raise BootseerError(f"{MKFS} failed for image {self.image_id}: "
                                        f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
                out.chmod(0o600)
                self.files.add_file(out, self.key)
            except NotCached as exc:  # no room: served through FUSE, as without one
                log.warning("image %s: no room for its metadata image: %s", self.image_id,
                            exc)
                return False
            finally:
                out.unlink(missing_ok=True)
        return True

    def mount(self, target: Path) -> None:
        """Mount it at ``target`` (read-only), its blocks asked of the disk at once first.

        The image is every name and attribute of the tree the start looks up (some
        10 MB). Left to the lookups, a start's first thousands of them each wait for one
        small read of it (the page cache is cold after a reboot or an eviction); asked
        for whole, it is one read the kernel makes in large requests, ahead of them
        (:func:`bootseer.readahead.will_need`: asynchronous)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            will_need(fd, [(0, os.fstat(fd).st_size)])
        finally:
            os.close(fd)
        mount_erofs(self.path, target)


def _scratch() -> str | None:
    """Where the stub tree is written: memory (``/dev/shm``) if there is some, where its
    ~30,000 creations take a quarter of the time they take on a journaled disk; it is
    gone once the image is built."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else None


def _write_tree(root: Path, entries: Iterable[FileEntry], keys: dict[str, str]) -> None:
    """The image's tree as stubs under ``root``: real directories, links and devices,
    regular files sparse at their size with their redirect."""
    dirs: set[str] = {"/"}
    files: set[str] = set()
    stamps: list[tuple[str, FileEntry]] = []
    # Parents before children; hard links last, since the file a link names may lie
    # deeper than the link (git's helpers in /usr/lib/git-core are links to /usr/bin/git).
    order = sorted(entries, key=lambda e: (e.kind is Kind.HARDLINK, e.path.count("/"), e.path))
    for entry in order:
        path = entry.path
        if path == "/":
            stamps.append((str(root), entry))
            continue
        parent, _, name = path.rpartition("/")
        if not path.startswith("/") or name in ("", ".", "..") or (parent or "/") not in dirs \
                or any(part in ("", ".", "..") for part in path[1:].split("/")):
            raise BootseerError(f"manifest path {path!r} is not a clean path under a "
                                "directory of the image")
        target = f"{root}{path}"
        if entry.kind is Kind.DIR:
            os.mkdir(target, 0o700)
            dirs.add(path)
        elif entry.kind is Kind.FILE:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                if entry.size > 0:
                    os.ftruncate(fd, entry.size)
                    os.setxattr(fd, METACOPY, b"")
                    os.setxattr(fd, REDIRECT, redirect(keys[path]).encode())
            finally:
                os.close(fd)
            files.add(path)
        elif entry.kind is Kind.HARDLINK:
            source = entry.link_target or ""
            if source not in files:
                raise BootseerError(f"hard link {path!r} names no file of the image")
            os.link(f"{root}{source}", target, follow_symlinks=False)
            continue  # the inode's attributes are its file's
        elif entry.kind is Kind.SYMLINK:
            os.symlink(entry.link_target or "", target)
        elif entry.kind is Kind.FIFO:
            os.mkfifo(target, 0o600)
        else:  # CHAR, BLOCK
            kind = stat.S_IFCHR if entry.kind is Kind.CHAR else stat.S_IFBLK
            os.mknod(target, kind | 0o600, os.makedev(entry.devmajor, entry.devminor))
        stamps.append((target, entry))
    for target, entry in reversed(stamps):  # children before parents: a dir's mtime holds
        for name, value in entry.xattrs.items():
            if not name.startswith("trusted."):
                os.setxattr(target, name, value, follow_symlinks=False)
        os.chown(target, entry.uid, entry.gid, follow_symlinks=False)
        if entry.kind is not Kind.SYMLINK:
            os.chmod(target, entry.mode & 0o7777)
        ns = int(entry.mtime * 1e9)
        os.utime(target, ns=(ns, ns), follow_symlinks=False)


class KeyTree(ImageTree):
    """The image's files named by key (``/<key[:2]>/<key>``), for the overlay's data-only
    layer: everything else of the image (names, attributes) the kernel has from the
    metadata image. The 256 prefix directories are nodes numbered above the image's."""

    def __init__(self, image: LazyImage, hot: Iterable[str] = (), *,
                 hot_files: Iterable[str] = (), **options: Any) -> None:
        """``hot_files``: paths of the files the hot list's blocks were read from (the
        files ``warm`` keeps whole); the rest as :class:`ImageTree`'s."""
        super().__init__(image, hot, **options)
        self.hot_files = tuple(hot_files)
        self._base = max(self.indexes) + 1
        self._by_key: dict[str, FileEntry] | None = None

    def _keys(self) -> dict[str, FileEntry]:
        if self._by_key is None:
            by_key = {}
            for entry in self.image.manifest.entries:
                if entry.kind is Kind.FILE and entry.size > 0:
                    key = self.whole.key(entry)
                    if key is not None:
                        by_key.setdefault(key, entry)
            self._by_key = by_key
        return self._by_key

    def node(self, ino: int) -> Node | None:
        if self._base <= ino < self._base + 256:
            return Node(ino=ino, mode=stat.S_IFDIR | 0o555, size=0, mtime=0, nlink=2,
                        uid=0, gid=0, rdev=0)
        return super().node(ino)

    def lookup(self, parent: int, name: str) -> Node | None:
        if parent == ROOT:
            return self.node(self._base + int(name, 16)) if _is_prefix(name) else None
        if not self._base <= parent < self._base + 256:
            return None
        entry = self._keys().get(name)
        if entry is None or name[:2] != f"{parent - self._base:02x}":
            return None
        return self._node_of(entry)

    def readdir(self, ino: int) -> list[tuple[str, Node]]:
        node = self.node(ino)
        if node is None or not node.is_dir():
            raise OSError(errno.ENOTDIR, "not a directory")
        return [(".", node), ("..", node)]  # looked up by name only, never listed

    def readlink(self, ino: int) -> bytes:
        raise OSError(errno.EINVAL, "not a symbolic link")

    def use_pusher(self, push: PushPages) -> None:
        self._start_warmer(push, all_at_once=not self.image.recording)
        if self.warmer is not None and not self.image.recording:
            threading.Thread(target=self._read_ahead_whole, name="read-ahead",
                             daemon=True).start()

    def _read_ahead_whole(self) -> None:
        """The kernel opens whole files without this server hearing of it, so their hot
        blocks are read ahead at once, not when each is looked up (files not whole are
        still warmed when the overlay looks them up here)."""
        assert self.warmer is not None
        by_path = self.image.manifest.by_path
        for path in self.hot_files:
            entry = by_path.get(path)
            if entry is not None and entry.kind is Kind.FILE and self.whole.has(path):
                self.warmer.looked_up(entry)

    def _read_ahead(self, entry: FileEntry, ranges: list[tuple[int, int]]) -> bool:
        return not self.image.recording and self.whole.read_ahead(entry, ranges)


def _is_prefix(name: str) -> bool:
    return len(name) == 2 and all(c in "0123456789abcdef" for c in name)


@functools.cache
def unsupported() -> str | None:
    """Why this node cannot serve metadata images (None if it can): ``mkfs.erofs``, root,
    an EROFS mount of a file (Linux 6.12) and an overlay with a data-only layer (6.5),
    tried once on a tiny image."""
    if shutil.which(MKFS) is None:
        return f"{MKFS} is not installed (Debian: erofs-utils)"
    if os.geteuid() != 0:
        return "needs root"
    with tempfile.TemporaryDirectory(prefix="bootseer-erofs-probe-") as work:
        base = Path(work)
        tree, data, meta, top = base / "tree", base / "data" / "ab", base / "meta", base / "top"
        for path in (tree, data, meta, top):
            path.mkdir(parents=True)
        (data / "abcd").write_bytes(b"ok")
        with open(tree / "f", "wb") as f:
            f.truncate(2)
            os.setxattr(f.fileno(), METACOPY, b"")
            os.setxattr(f.fileno(), REDIRECT, b"/ab/abcd")
        proc = subprocess.run([MKFS, "--quiet", *STUB_OPTIONS,
                               str(base / "m.erofs"), str(tree)], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            return f"{MKFS} failed: {proc.stderr.strip()}"
        try:
            mount_erofs(base / "m.erofs", meta)
        except BootseerError as exc:
            return str(exc)
        try:
            proc = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                                   f"ro,metacopy=on,redirect_dir=on,"
                                   f"lowerdir={meta}::{base / 'data'}", str(top)],
                                  capture_output=True, text=True, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                return f"no overlay with data-only layers: {proc.stderr.strip()}"
            try:
                if (top / "f").read_bytes() != b"ok":
                    return "an overlay's data-only layer read wrong"
            finally:
                unmount(top)
        finally:
            unmount(meta)
    return None


def mount_erofs(image: Path, target: Path) -> None:
    """Mount the EROFS ``image`` (a file: no loop device) read-only at ``target``."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(os.fsencode(image), os.fsencode(target), b"erofs",
                  ctypes.c_ulong(MS_RDONLY | MS_NOSUID | MS_NODEV), b"") != 0:
        err = ctypes.get_errno()
        raise BootseerError(f"mounting the metadata image {image} at {target} failed: "
                            f"{os.strerror(err)} (needs Linux 6.12's EROFS on files)")


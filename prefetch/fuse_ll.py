"""The lazy image served by our own FUSE protocol server on /dev/fuse, so it survives its server.

:mod:`bootseer.prefetch.fuse` goes through libfuse, whose connection dies with the process and which
cannot serve a connection it has not seen ``FUSE_INIT`` on. The kernel does not need
either: a FUSE connection lives as long as *any* file refers to it, and a new file can be
attached to it with ``FUSE_DEV_IOC_CLONE``, getting a request queue of its own. So:

* whoever mounts (the node agent) opens ``/dev/fuse`` and mounts with ``fd=N``
  (:func:`mount_fd`), and keeps that file open for the life of the mount;
* each server process clones it and serves its clone (:func:`serve`). When a server dies,
  the kernel ends the requests it had read but not answered with ``ECONNABORTED``; the ones
  still queued wait for the next server, which clones the agent's file again and answers
  them. The first server answers ``FUSE_INIT`` and saves what it agreed with the kernel
  (:class:`Negotiated`) to a file; a later one reads it back, since no INIT comes again.

Takeover needs no memory of the old server because nothing here has state: node ids are
the manifest's inode numbers (the root's is 1, which is ``FUSE_ROOT_ID``; hard links share
theirs), file handles are 0, and lookups are not counted (FORGET is ignored).

The protocol side mirrors :mod:`bootseer.prefetch.fuse`: inode numbers, devices, symlinks, xattrs
and link counts from the manifest; ``ENOENT`` for a missing path (cached by the kernel as
a negative entry), ``ENODATA`` for a missing xattr, ``EROFS`` for anything that writes,
``EIO`` (logged) for a read that fails; FLUSH, and GETXATTR on an image without xattrs,
are ``ENOSYS`` so the kernel stops asking. The content never changes, so entries and
attributes are valid for a day, opens cost no round trip where the kernel allows it (see
:meth:`_Server.agree`; else they answer ``FOPEN_KEEP_CACHE``), so cached pages outlive
them, directory listings and symlink targets are cached by the kernel, and reads may be up
to :data:`MAX_PAGES` pages. A :class:`~bootseer.prefetch.prefetcher.Prefetcher` and a
:class:`~bootseer.prefetch.recording.Recording` work through the image (its cache, its recorder),
as with :mod:`bootseer.prefetch.fuse`.

Speed matters, since every request costs a trip through this Python process: the structs
are compiled once, answers about metadata are packed once per node and reused, and a
request is read into a per-thread buffer rather than a new one.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import logging
import math
import os
import stat
import struct
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

from bootseer.errors import BootseerError
from bootseer.prefetch import fuse_proto as p
from bootseer.prefetch.blockformat import FileEntry
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.prefetcher import Prefetcher
from bootseer.prefetch.recording import Recording
from bootseer.prefetch.rootfs import Kind

log = logging.getLogger(__name__)

#: Seconds the kernel may trust an entry, an attribute or a missing name: the image is
#: immutable, so only memory pressure should drop them.
TIMEOUT = 86400
#: Reader threads: enough to overlap a few block fetches from the store while cached reads
#: go on; more only contend for the GIL.
DEFAULT_THREADS = 8
#: Reads of up to 1 MiB per request (the kernel caps it at its fuse_max_pages_limit).
MAX_PAGES = 256
#: Readahead on the mount: the kernel's default (128 KiB) is its cap in FUSE_INIT, and a
#: server can only lower it; :func:`mount_fd` raises it through sysfs before INIT. Files
#: are read to the end in larger steps: a Python start sends a third fewer READs.
READAHEAD = 1 << 20
#: Nothing is ever written, so only the kernel's minimum read buffer depends on this.
MAX_WRITE = 128 << 10
#: A request is at most max_write plus its headers; one read() gets exactly one request.
HEADER_ROOM = 4096
#: Asynchronous requests (readahead) the kernel keeps in flight at once (its default: 12).
MAX_BACKGROUND = 64
CONGESTION_THRESHOLD = 48
WANTED_FLAGS = p.ASYNC_READ | p.PARALLEL_DIROPS | p.MAX_PAGES | p.CACHE_SYMLINKS

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4

_TYPE = {Kind.FILE: stat.S_IFREG, Kind.HARDLINK: stat.S_IFREG, Kind.DIR: stat.S_IFDIR,
         Kind.SYMLINK: stat.S_IFLNK, Kind.CHAR: stat.S_IFCHR, Kind.BLOCK: stat.S_IFBLK,
         Kind.FIFO: stat.S_IFIFO}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC
_OK_HEADER = p.OUT_HEADER.size
#: A write of an answer fails so when its request is gone (interrupted, or the connection
#: aborted); nobody is waiting for it any more.
_GONE = (errno.ENOENT, errno.ENODEV)

Handler = Callable[[int, int, memoryview], None]


class FuseLowLevelError(BootseerError):
    """The lazy mount could not be made or served (not root, no /dev/fuse, a dead fd)."""


@dataclass(frozen=True)
class Negotiated:
    """What FUSE_INIT settled for a connection: the first server saves it, a taking-over
    server loads it (the kernel sends INIT once per connection)."""

    minor: int  # protocol 7.<minor> as answered
    flags: int  # FUSE_INIT flags in force
    max_readahead: int
    max_write: int
    max_pages: int
    kernel_minor: int  # what the kernel offered
    kernel_flags: int

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self)) + "\n")
        os.replace(tmp, path)  # a server killed half-way leaves the old file or none

    @classmethod
    def load(cls, path: Path) -> Negotiated | None:
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            raise FuseLowLevelError(f"takeover state {path} is unreadable: {exc}") from exc


def mount_fd(mountpoint: Path, fsname: str = "bootseer-image", *,
             subtype: str = "bootseer") -> int:
    """Mount an empty FUSE connection read-only at ``mountpoint``; return its /dev/fuse fd.

    The caller keeps the fd open as long as the mount should live (closing the last file of
    a connection aborts it) and hands it to server processes (``pass_fds``), which clone it
    (:func:`serve`). The kernel queues FUSE_INIT at once; file system calls on the mount
    wait until a server has answered it. Root only: mount(2) needs CAP_SYS_ADMIN.
    """
    if os.geteuid() != 0:
        raise FuseLowLevelError("mounting a FUSE connection by fd needs root "
                                "(CAP_SYS_ADMIN); use bootseer.prefetch.fuse (fusermount) instead")
    try:
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise FuseLowLevelError(f"cannot open /dev/fuse: {exc.strerror} (is the fuse module "
                                f"loaded, the device present in this container?)") from exc
    target = os.path.realpath(mountpoint)  # now: once mounted, a stat waits for a server
    options = (f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other,"
               f"default_permissions")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(fsname.encode(), os.fsencode(target), f"fuse.{subtype}".encode(),
                  ctypes.c_ulong(MS_RDONLY | MS_NOSUID | MS_NODEV), options.encode()) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise FuseLowLevelError(f"mounting FUSE at {mountpoint} failed: {os.strerror(err)}")
    _raise_readahead(target)
    return fd


def _raise_readahead(target: str) -> None:
    """Set the readahead of the mount at ``target`` (a real path) to :data:`READAHEAD`:
    its backing device info in sysfs, named after the device number, found in mountinfo
    (a stat of the mount would wait for a server). Advice only: a failure is logged."""
    for char in "\\ \t\n":  # mountinfo escapes these as octal
        target = target.replace(char, f"\\{ord(char):03o}")
    device = None
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:  # the last mount on the path is the one just made
            fields = line.split()
            if fields[4] == target:
                device = fields[2]
    try:
        Path(f"/sys/class/bdi/{device}/read_ahead_kb").write_text(str(READAHEAD >> 10))
    except OSError as exc:
        log.warning("could not raise the readahead of %s (bdi %s): %s", target, device, exc)


def clone_fd(fd: int) -> int:
    """A new /dev/fuse file attached to ``fd``'s connection, with its own request queue."""
    clone = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(clone, p.FUSE_DEV_IOC_CLONE, struct.pack("=I", fd))
    except OSError as exc:
        os.close(clone)
        raise FuseLowLevelError(f"cannot attach to FUSE connection fd {fd}: {exc.strerror} "
                                f"(not a mounted /dev/fuse file?)") from exc
    return clone


def serve(image: LazyImage, fd: int, *, takeover_state: Path,
          prefetcher: Prefetcher | None = None, recording: Recording | None = None,
          threads: int = DEFAULT_THREADS) -> Negotiated | None:
    """Serve ``image`` on the FUSE connection of ``fd`` until it is unmounted (or aborted).

    ``fd`` is the file :func:`mount_fd` returned (or any clone of it); it is cloned, not
    read, and left open. ``takeover_state`` is where the connection's :class:`Negotiated`
    parameters live: written when this server answers FUSE_INIT, read when it takes over
    a connection already initialised. A state file left from an earlier mount is harmless:
    a fresh connection always sends INIT first, and answering it rewrites the file.

    ``prefetcher`` and ``recording`` are accepted as :func:`bootseer.prefetch.fuse.mount` accepts
    them: both act through ``image``, so serving needs nothing more from them.

    Returns what is in force for the connection (None if it ended before INIT).
    """
    negotiated = Negotiated.load(takeover_state)
    if negotiated is not None:
        log.info("taking over FUSE connection (protocol 7.%d, flags %#x)", negotiated.minor,
                 negotiated.flags)
    clone = clone_fd(fd)
    try:
        server = _Server(image, clone, takeover_state, negotiated)
    except BaseException:
        os.close(clone)
        raise
    workers = [threading.Thread(target=server.run, name=f"fuse-{i}", daemon=True)
               for i in range(threads)]
    for worker in workers:
        worker.start()
    # Interrupted here (SIGINT, a SIGTERM handler raising), the clone stays open: workers
    # may still answer on it, and its number must not go to another file meanwhile. The
    # process exit closes it, ending what was in flight as a kill would.
    for worker in workers:
        worker.join()
    os.close(clone)
    if server.failure is not None:
        raise FuseLowLevelError(f"serving FUSE failed: {server.failure}") from server.failure
    return server.negotiated


class _Server:
    """The request handlers; shared by the reader threads, stateless but for caches."""

    def __init__(self, image: LazyImage, fd: int, state_path: Path,
                 negotiated: Negotiated | None) -> None:
        self.image, self.fd, self.state_path = image, fd, state_path
        self.no_open = self.no_opendir = False
        self.negotiated: Negotiated | None = None
        if negotiated is not None:
            self.agree(negotiated)
        self.failure: OSError | None = None
        self.by_path = image.manifest.by_path
        #: node id → entry: a hard link group is its first path (kind FILE).
        self.nodes: dict[int, FileEntry] = {
            e.ino: e for e in image.manifest.entries if e.kind is not Kind.HARDLINK}
        root = self.nodes.get(p.ROOT_ID)
        if root is None or root.path != "/":
            raise FuseLowLevelError(f"image {image.image_id}: the root's inode number is not "
                                    f"{p.ROOT_ID}; cannot use inode numbers as node ids")
        self.has_xattrs = any(e.xattrs for e in image.manifest.entries)
        # Immutable answers, packed on first use (a dict store is atomic under the GIL; two
        # threads packing the same node at once only waste a little work).
        self.entry_outs: dict[int, bytes] = {}
        self.attr_outs: dict[int, bytes] = {}
        self.listings: dict[int, list[bytes]] = {}
        self.negative = p.ENTRY_OUT.pack(0, 0, TIMEOUT, TIMEOUT, 0, 0) + bytes(p.ATTR.size)
        max_write = max(MAX_WRITE, negotiated.max_write if negotiated else 0)
        self.buffer_size = max_write + HEADER_ROOM
        self.handlers: dict[int, Handler] = {
            p.INIT: self.init, p.LOOKUP: self.lookup, p.GETATTR: self.getattr,
            p.READLINK: self.readlink, p.OPEN: self.open, p.READ: self.read,
            p.RELEASE: self.ok, p.OPENDIR: self.opendir, p.READDIR: self.readdir,
            p.RELEASEDIR: self.ok, p.STATFS: self.statfs, p.GETXATTR: self.getxattr,
            p.LISTXATTR: self.listxattr, p.ACCESS: self.ok, p.DESTROY: self.ok,
            p.FLUSH: self.enosys,
        }
        for opcode in p.WRITE_OPCODES:
            self.handlers[opcode] = self.erofs
        for opcode in p.NO_REPLY_OPCODES:
            self.handlers[opcode] = self.ignore

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        """Read and answer requests until the connection is gone (ENODEV)."""
        buffer = bytearray(self.buffer_size)
        view = memoryview(buffer)
        unpack, handlers, enosys = p.IN_HEADER.unpack_from, self.handlers, self.enosys
        readv, fd, header = os.readv, self.fd, p.IN_HEADER.size
        while True:
            try:
                n = readv(fd, (buffer,))
            except OSError as exc:
                if exc.errno == errno.ENODEV:  # unmounted or aborted
                    return
                if exc.errno in (errno.ENOENT, errno.EAGAIN):  # request gone before read
                    continue
                self.failure = exc
                return
            _, opcode, unique, nodeid, _, _, _, _, _ = unpack(buffer)
            try:
                handlers.get(opcode, enosys)(unique, nodeid, view[header:n])
            except Exception:
                log.exception("FUSE request %d (opcode %d, node %d) failed", unique, opcode,
                              nodeid)
                self.error(unique, errno.EIO)

    def reply(self, unique: int, body: bytes = b"") -> None:
        self.send((p.OUT_HEADER.pack(_OK_HEADER + len(body), 0, unique), body))

    def error(self, unique: int, err: int) -> None:
        self.send((p.OUT_HEADER.pack(_OK_HEADER, -err, unique),))

    def send(self, parts: tuple[bytes, ...]) -> None:
        """Write one answer (a single write: the kernel takes one message per write)."""
        try:
            os.writev(self.fd, parts)
        except OSError as exc:
            if exc.errno not in _GONE:
                log.error("answering a FUSE request failed: %s", exc)

    # -- handlers ---------------------------------------------------------------------------

    def init(self, unique: int, nodeid: int, body: memoryview) -> None:
        major, minor, max_readahead, flags = p.INIT_IN.unpack_from(body)
        if major != p.KERNEL_VERSION or minor < p.MIN_MINOR:
            log.error("kernel FUSE protocol %d.%d is not supported (need %d.%d or later)",
                      major, minor, p.KERNEL_VERSION, p.MIN_MINOR)
            self.error(unique, errno.EPROTO)
            return
        # The kernel takes the smaller of this and the mount's readahead: asking for more
        # than it offered keeps what mount_fd set.
        negotiated = Negotiated(minor=min(minor, p.MAX_MINOR), flags=flags & WANTED_FLAGS,
                                max_readahead=max(max_readahead, READAHEAD),
                                max_write=MAX_WRITE,
                                max_pages=MAX_PAGES, kernel_minor=minor, kernel_flags=flags)
        # Saved before answering: once answered, a server killed before saving would leave
        # a connection no successor could know it is initialised.
        negotiated.save(self.state_path)
        self.agree(negotiated)
        log.info("FUSE connection initialised: protocol 7.%d, flags %#x (kernel: 7.%d, %#x)",
                 negotiated.minor, negotiated.flags, minor, flags)
        self.reply(unique, p.INIT_OUT.pack(
            p.KERNEL_VERSION, negotiated.minor, negotiated.max_readahead, negotiated.flags,
            MAX_BACKGROUND, CONGESTION_THRESHOLD, MAX_WRITE, 1, MAX_PAGES, 0, 0))

    def agree(self, negotiated: Negotiated) -> None:
        """Take on what INIT settled. Where the kernel supports it, OPEN and OPENDIR are
        answered ENOSYS once, and then never sent again: opening costs no round trip (nor
        does RELEASE), and the kernel's default for such opens is to keep the page cache
        and cache directories, just what an immutable image wants."""
        self.no_open = bool(negotiated.kernel_flags & p.NO_OPEN_SUPPORT)
        self.no_opendir = bool(negotiated.kernel_flags & p.NO_OPENDIR_SUPPORT)
        self.negotiated = negotiated

    def lookup(self, unique: int, parent: int, body: memoryview) -> None:
        directory = self.nodes.get(parent)
        if directory is None:
            self.error(unique, errno.ENOENT)
            return
        name = os.fsdecode(bytes(body).partition(b"\0")[0])
        entry = self.by_path.get(f"/{name}" if parent == p.ROOT_ID
                                 else f"{directory.path}/{name}")
        if entry is None:
            self.reply(unique, self.negative)  # node id 0: the kernel caches the miss
            return
        out = self.entry_outs.get(entry.ino)
        if out is None:
            out = self.entry_outs[entry.ino] = p.ENTRY_OUT.pack(
                entry.ino, 0, TIMEOUT, TIMEOUT, 0, 0) + _attr(self.nodes[entry.ino])
        self.reply(unique, out)

    def getattr(self, unique: int, nodeid: int, body: memoryview) -> None:
        out = self.attr_outs.get(nodeid)
        if out is None:
            entry = self.nodes.get(nodeid)
            if entry is None:
                self.error(unique, errno.ENOENT)
                return
            out = self.attr_outs[nodeid] = p.ATTR_OUT.pack(TIMEOUT, 0, 0) + _attr(entry)
        self.reply(unique, out)

    def readlink(self, unique: int, nodeid: int, body: memoryview) -> None:
        entry = self.nodes.get(nodeid)
        if entry is None or entry.kind is not Kind.SYMLINK or entry.link_target is None:
            self.error(unique, errno.EINVAL)
            return
        self.reply(unique, os.fsencode(entry.link_target))

    def open(self, unique: int, nodeid: int, body: memoryview) -> None:
        flags, _ = p.OPEN_IN.unpack_from(body)
        if flags & _WRITE_FLAGS:
            self.error(unique, errno.EROFS)
        elif nodeid not in self.nodes:
            self.error(unique, errno.ENOENT)
        elif self.no_open:
            self.error(unique, errno.ENOSYS)
        else:
            self.reply(unique, p.OPEN_OUT.pack(0, p.FOPEN_KEEP_CACHE | p.FOPEN_NOFLUSH, 0))

    def read(self, unique: int, nodeid: int, body: memoryview) -> None:
        _, offset, size = p.READ_IN.unpack_from(body)
        entry = self.nodes.get(nodeid)
        if entry is None:
            self.error(unique, errno.ENOENT)
            return
        try:
            data = self.image.read(entry, offset, size)
        except Exception as exc:
            log.error("read of %s at %d (+%d) failed: %s", entry.path, offset, size, exc)
            self.error(unique, errno.EIO)
            return
        self.send((p.OUT_HEADER.pack(_OK_HEADER + len(data), 0, unique), data))

    def opendir(self, unique: int, nodeid: int, body: memoryview) -> None:
        entry = self.nodes.get(nodeid)
        if entry is None or entry.kind is not Kind.DIR:
            self.error(unique, errno.ENOTDIR)
        elif self.no_opendir:
            self.error(unique, errno.ENOSYS)
        else:
            self.reply(unique, p.OPEN_OUT.pack(0, p.FOPEN_KEEP_CACHE | p.FOPEN_CACHE_DIR, 0))

    def readdir(self, unique: int, nodeid: int, body: memoryview) -> None:
        _, offset, size = p.READ_IN.unpack_from(body)
        records = self.listings.get(nodeid)
        if records is None:
            entry = self.nodes.get(nodeid)
            if entry is None or entry.kind is not Kind.DIR:
                self.error(unique, errno.ENOTDIR)
                return
            records = self.listings[nodeid] = self._listing(entry)
        out, total = [], 0
        for record in islice(records, offset, None):  # offset: records already returned
            total += len(record)
            if total > size:
                break
            out.append(record)
        self.reply(unique, b"".join(out))

    def _listing(self, directory: FileEntry) -> list[bytes]:
        """The directory's ``fuse_dirent`` records, "." and ".." first; each record's
        offset is the number of records up to and including it."""
        path = directory.path
        parent = self.by_path[path.rpartition("/")[0] or "/"]
        prefix = "" if path == "/" else path
        names = [(".", directory), ("..", parent)]
        names += [(n, self.by_path[f"{prefix}/{n}"]) for n in self.image.listdir(path)]
        records = []
        for offset, (name, entry) in enumerate(names, 1):
            raw = os.fsencode(name)
            record = p.DIRENT.pack(entry.ino, offset, len(raw), _TYPE[entry.kind] >> 12) + raw
            records.append(record + bytes(-len(record) % 8))
        return records

    def statfs(self, unique: int, nodeid: int, body: memoryview) -> None:
        self.reply(unique, p.KSTATFS.pack(0, 0, 0, 0, 0, 4096, 255, 4096, 0))

    def getxattr(self, unique: int, nodeid: int, body: memoryview) -> None:
        if not self.has_xattrs:  # the kernel stops asking (overlayfs asks on every lookup)
            self.error(unique, errno.ENOSYS)
            return
        size, _ = p.XATTR_SIZE.unpack_from(body)
        entry = self.nodes.get(nodeid)
        if entry is None:
            self.error(unique, errno.ENOENT)
            return
        name = os.fsdecode(bytes(body[p.XATTR_SIZE.size:]).partition(b"\0")[0])
        value = entry.xattrs.get(name)
        if value is None:
            self.error(unique, errno.ENODATA)
        else:
            self._sized(unique, size, value)

    def listxattr(self, unique: int, nodeid: int, body: memoryview) -> None:
        size, _ = p.XATTR_SIZE.unpack_from(body)
        entry = self.nodes.get(nodeid)
        if entry is None:
            self.error(unique, errno.ENOENT)
            return
        self._sized(unique, size, b"".join(os.fsencode(n) + b"\0" for n in entry.xattrs))

    def _sized(self, unique: int, size: int, value: bytes) -> None:
        """An xattr answer: its length if asked for (size 0), else the value if it fits."""
        if size == 0:
            self.reply(unique, p.XATTR_SIZE.pack(len(value), 0))
        elif size < len(value):
            self.error(unique, errno.ERANGE)
        else:
            self.reply(unique, value)

    def ok(self, unique: int, nodeid: int, body: memoryview) -> None:
        self.reply(unique)

    def enosys(self, unique: int, nodeid: int, body: memoryview) -> None:
        self.error(unique, errno.ENOSYS)

    def erofs(self, unique: int, nodeid: int, body: memoryview) -> None:
        self.error(unique, errno.EROFS)

    def ignore(self, unique: int, nodeid: int, body: memoryview) -> None:
        """FORGET and BATCH_FORGET (nothing is counted), INTERRUPT (answers come quickly
        or, for a slow fetch, are worth waiting for): the kernel expects no answer."""


def _attr(entry: FileEntry) -> bytes:
    """The packed ``fuse_attr`` of an entry (times are its mtime, as tar gives only that)."""
    seconds = math.floor(entry.mtime)  # before 1970 it wraps, as the kernel reads it signed
    nanos = min(int((entry.mtime - seconds) * 1e9), 999_999_999)
    rdev = 0
    if entry.kind in (Kind.CHAR, Kind.BLOCK):  # the kernel's new_encode_dev
        major, minor = entry.devmajor, entry.devminor
        rdev = ((minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)) & 0xFFFFFFFF
    seconds &= 0xFFFFFFFFFFFFFFFF
    return p.ATTR.pack(entry.ino, entry.size, (entry.size + 511) // 512, seconds, seconds,
                       seconds, nanos, nanos, nanos, _TYPE[entry.kind] | entry.mode,
                       entry.nlink, entry.uid, entry.gid, rdev, 0, 0)

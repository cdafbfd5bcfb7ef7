"""The FUSE protocol server: any :class:`~bootseer.fuse.tree.Tree` on a ``/dev/fuse`` connection.

libfuse's connection dies with its process and it cannot serve a connection it has not
seen ``FUSE_INIT`` on. The kernel needs neither: a connection lives as long as *any* file
refers to it, and a new file can be attached to it with ``FUSE_DEV_IOC_CLONE``, getting a
request queue of its own. So whoever mounts (:mod:`bootseer.fuse.connection`: the node
agent, or a server mounting for itself) keeps the connection's file, and each server
process serves a clone of it (:func:`serve`). When a server dies, the kernel ends the
requests it had read but not answered with ``ECONNABORTED``; the ones still queued wait
for the next server, which clones the file again and answers them. The first server
answers ``FUSE_INIT`` and saves what it agreed with the kernel (:class:`Negotiated`); a
later one reads it back, since no INIT comes again.

Takeover needs no memory of the old server because the tree names nodes the same in every
process (:mod:`bootseer.fuse.tree`), lookups are not counted (FORGET is ignored), and a
read on a handle the tree never gave out makes the tree re-create it.

What every mount answers alike: ``ENOENT`` for a missing name (cached by the kernel as a
negative entry for the tree's TTL), ``ENODATA`` for a missing xattr, ``EROFS`` for
anything that writes, ``EIO`` (logged) for a read that fails; FLUSH, and GETXATTR on a tree
without xattrs, are ``ENOSYS`` so the kernel stops asking. For an immutable tree, answers
about metadata are packed once and reused, opens cost no round trip where the kernel
allows it (see :meth:`_Server.agree`; else they answer ``FOPEN_KEEP_CACHE``), directory
listings and symlink targets are cached by the kernel, and a listing carries every
entry's attributes (``READDIRPLUS``): the kernel then knows each name listed, and a later
lookup of it never comes here (a start lists the directories it imports from). Reads may be up to
:data:`MAX_PAGES` pages. Such a tree may also put pages into the kernel's page cache before
anyone reads them (:class:`PagePusher`, ``FUSE_NOTIFY_STORE``). A tree that can name local
files holding a node's bytes has a privileged server ask for passthrough, and the kernel
then reads those nodes itself (:mod:`bootseer.fuse.passthrough`; opens are answered then).

Speed matters, since every request costs a trip through this Python process: the structs
are compiled once and a request is read into a per-thread buffer rather than a new one.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import math
import os
import queue
import signal
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

from bootseer import boundedjson
from bootseer.fuse import FuseError
from bootseer.fuse import proto as p
from bootseer.fuse.connection import READAHEAD, clone_fd, detach, open_connection
from bootseer.fuse.passthrough import (
    MAX_STACK_DEPTH,
    Passthrough,
    PassthroughCounts,
    may_pass_through,
)
from bootseer.fuse.tree import Node, Tree
from bootseer.jsonfile import write_json

log = logging.getLogger(__name__)

#: Reader threads: enough to overlap a few fetches from the store while cached reads go
#: on; more only contend for the GIL.
DEFAULT_THREADS = 8
#: Reads of up to 1 MiB per request (the kernel caps it at its fuse_max_pages_limit).
MAX_PAGES = 256
#: Nothing is ever written, so only the kernel's minimum read buffer depends on this.
MAX_WRITE = 128 << 10
#: A request is at most max_write plus its headers; one read() gets exactly one request.
HEADER_ROOM = 4096
#: Asynchronous requests (readahead) the kernel keeps in flight at once (its default: 12).
MAX_BACKGROUND = 64
CONGESTION_THRESHOLD = 48
WANTED_FLAGS = p.ASYNC_READ | p.PARALLEL_DIROPS | p.MAX_PAGES | p.CACHE_SYMLINKS

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC
_PASSTHROUGH_FLAGS = p.FOPEN_PASSTHROUGH | p.FOPEN_NOFLUSH
_OK_HEADER = p.OUT_HEADER.size
#: A write of an answer fails so when its request is gone (interrupted, or the connection
#: aborted); nobody is waiting for it any more.
_GONE = (errno.ENOENT, errno.ENODEV)

#: What a tree says with an ``OSError`` and the caller sees as is; any other failure is
#: ``EIO`` (a store error's errno means nothing to a reader of the mount).
TREE_ERRORS = frozenset((errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EINVAL,
                         errno.ENFILE))

#: A request's handler: (unique, node id, body); it may return the kind to count the
#: request as (else its opcode's).
Handler = Callable[[int, int, memoryview], 'int | None']

#: Bytes of pages waiting to go into the kernel's page cache: past this, a push is dropped
#: (it only saves reads, which still work without it).
PUSH_QUEUE_BYTES = 64 << 20
#: A push made as soon as a lookup is answered can reach the kernel before the task that
#: looked the file up has made its inode (ENOENT): it is tried again this much later,
#: doubling, this many times.
PUSH_RETRY_S = 0.005
PUSH_RETRIES = 3

#: How :class:`RequestCounts` names the requests a read-only tree is sent.
REQUEST_NAMES = {p.LOOKUP: "lookup", p.GETATTR: "getattr", p.READLINK: "readlink",
                 p.OPEN: "open", p.READ: "read", p.RELEASE: "release", p.OPENDIR: "opendir",
                 p.READDIR: "readdir", p.READDIRPLUS: "readdirplus",
                 p.RELEASEDIR: "releasedir", p.GETXATTR: "getxattr",
                 p.LISTXATTR: "listxattr", p.STATFS: "statfs", p.ACCESS: "access",
                 p.FORGET: "forget", p.BATCH_FORGET: "forget", p.INTERRUPT: "interrupt",
                 p.INIT: "init", p.FLUSH: "flush", p.IOCTL: "ioctl"}


#: The kind a LOOKUP that found nothing is counted as (its own cost, its own remedy:
#: negative entries the kernel keeps).
NEGATIVE_LOOKUP = -1
REQUEST_NAMES[NEGATIVE_LOOKUP] = "lookup_negative"
#: An OPEN answered with a backing file: the kernel reads that open file itself.
PASSTHROUGH_OPEN = -2
REQUEST_NAMES[PASSTHROUGH_OPEN] = "open_passthrough"


class RequestCounts:
    """The requests a server answered, by kind, and the CPU time answering each kind took
    (the handler's thread time, its reply's system call included): what a start costs in
    trips through this process (a read that the kernel's page cache answers never comes
    here), and which trips are worth taking away.

    Each reader thread counts in dicts of its own, so the hot path takes no lock; a
    :meth:`snapshot` sums them (copying a dict is atomic under the GIL)."""

    def __init__(self) -> None:
        self._threads: list[tuple[dict[int, int], dict[int, int]]] = []
        self._lock = threading.Lock()

    def for_thread(self) -> tuple[dict[int, int], dict[int, int]]:
        """A reader thread's (requests, CPU nanoseconds) by kind."""
        mine: tuple[dict[int, int], dict[int, int]] = ({}, {})
        with self._lock:
            self._threads.append(mine)
        return mine

    def snapshot(self) -> dict[str, int]:
        """Requests by kind (``read``, ``lookup``, ``lookup_negative``, ...; unknown
        opcodes as ``op<N>``), and ``total``."""
        out = self._summed(0)
        out["total"] = sum(out.values())
        return dict(sorted(out.items()))

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds spent answering each kind, and ``total``."""
        out = {kind: ns / 1e9 for kind, ns in self._summed(1).items()}
        out["total"] = sum(out.values())
        return {kind: round(seconds, 6) for kind, seconds in sorted(out.items())}

    def _summed(self, which: int) -> dict[str, int]:
        with self._lock:
            threads = [dict(pair[which]) for pair in self._threads]
        out: dict[str, int] = {}
        for counts in threads:
            for kind, n in counts.items():
                name = REQUEST_NAMES.get(kind, f"op{kind}")
                out[name] = out.get(name, 0) + n
        return out


@dataclass
class PushCounts:
    """Pages put into the kernel's page cache ahead of reads (:class:`PagePusher`)."""

    pushes: int = 0
    bytes: int = 0
    dropped: int = 0  # the queue was full
    unknown: int = 0  # the kernel did not know the node (ENOENT, retried): nothing stored
    cpu_s: float = 0.0  # the pushing thread's CPU in its writes (the kernel's copy included)


class PagePusher:
    """Puts a file's pages into the kernel's page cache (``FUSE_NOTIFY_STORE``), so that
    reads of them, mmap faults included, never reach this process.

    A tree calls :meth:`push` for nodes the kernel knows (looked up); it never blocks: the
    writes happen on a thread of their own, and past :data:`PUSH_QUEUE_BYTES` waiting a
    push is dropped. The data must be the file's bytes at ``offset``, and must not reach
    past the file's end: the kernel would take the file to be longer.
    """

    def __init__(self, fd: int, counts: PushCounts) -> None:
        self.fd, self.counts = fd, counts
        self._queue: queue.SimpleQueue[tuple[int, int, bytes] | None] = queue.SimpleQueue()
        self._queued = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="fuse-push", daemon=True)
        self._thread.start()

    def push(self, ino: int, offset: int, data: bytes) -> None:
        with self._lock:
            if self._queued + len(data) > PUSH_QUEUE_BYTES:
                self.counts.dropped += 1
                return
            self._queued += len(data)
        self._queue.put((ino, offset, data))

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        later: list[tuple[float, int, int, tuple[int, int, bytes]]] = []  # a heap, by due
        tries = itertools.count()  # breaks ties in the heap
        while True:
            if later and later[0][0] <= time.monotonic():
                _, _, attempt, item = heapq.heappop(later)
            else:
                timeout = max(0.0, later[0][0] - time.monotonic()) if later else None
                try:
                    next_item = self._queue.get(timeout=timeout)
                except queue.Empty:
                    continue
                if next_item is None:
                    return
                attempt, item = 0, next_item
            ino, offset, data = item
            began = time.thread_time()
            error = self._write(ino, offset, data)
            self.counts.cpu_s += time.thread_time() - began
            if error == errno.ENOENT and attempt < PUSH_RETRIES:
                due = time.monotonic() + PUSH_RETRY_S * 2 ** attempt
                heapq.heappush(later, (due, next(tries), attempt + 1, item))
                continue
            if error is None:
                self.counts.pushes += 1
                self.counts.bytes += len(data)
            elif error == errno.ENOENT:
                self.counts.unknown += 1
            with self._lock:
                self._queued -= len(data)

    def _write(self, ino: int, offset: int, data: bytes) -> int | None:
        """One FUSE_NOTIFY_STORE; the errno if the kernel refused it."""
        body = p.NOTIFY_STORE_OUT.pack(ino, offset, len(data), 0)
        try:
            os.writev(self.fd, (p.OUT_HEADER.pack(_OK_HEADER + len(body) + len(data),
                                                  p.NOTIFY_STORE, 0), body, data))
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENODEV):  # ENODEV: unmounted meanwhile
                log.warning("putting pages of node %d in the page cache failed: %s", ino,
                            exc)
            return exc.errno
        return None


#: A takeover state file is seven numbers as JSON.
_MAX_TAKEOVER_STATE = 4 << 10


@dataclass(frozen=True)
class Negotiated:
    """What FUSE_INIT settled for a connection: the first server saves it, a taking-over
    server loads it (the kernel sends INIT once per connection)."""

    minor: int  # protocol 7.<minor> as answered
    flags: int  # FUSE_INIT flags in force (flags 32-63 included: flags | flags2 << 32)
    max_readahead: int
    max_write: int
    max_pages: int
    kernel_minor: int  # what the kernel offered
    kernel_flags: int  # (flags 32-63 included)

    def save(self, path: Path) -> None:
        write_json(path, asdict(self))

    @classmethod
    def load(cls, path: Path) -> Negotiated | None:
        try:
            return cls(**boundedjson.load_file(path, limit=_MAX_TAKEOVER_STATE,
                                               what=f"takeover state {path}"))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            raise FuseError(f"takeover state {path} is unreadable: {exc}") from exc


def serve(tree: Tree, fd: int, *, takeover_state: Path | None = None,
          threads: int = DEFAULT_THREADS, requests: RequestCounts | None = None,
          pushes: PushCounts | None = None,
          passthrough: PassthroughCounts | None = None) -> Negotiated | None:
    """Serve ``tree`` on the FUSE connection of ``fd`` until it is unmounted (or aborted).

    ``fd`` is a mounted connection's file (:mod:`bootseer.fuse.connection`); it is cloned,
    not read, and left open. ``takeover_state`` is where the connection's
    :class:`Negotiated` parameters live, for connections that outlive their server:
    written when this server answers FUSE_INIT, read when it takes over a connection
    already initialised. A state file left from an earlier mount is harmless: a fresh
    connection always sends INIT first, and answering it rewrites the file. ``requests``
    counts what is answered (a fresh one if not given); ``pushes`` what an immutable tree
    put into the page cache ahead of reads (:meth:`Tree.use_pusher`); ``passthrough``
    what the kernel was given to read itself (its decisions are logged beside
    ``takeover_state``, for the next server).

    Returns what is in force for the connection (None if it ended before INIT).
    """
    negotiated = Negotiated.load(takeover_state) if takeover_state is not None else None
    if negotiated is not None:
        log.info("taking over FUSE connection (protocol 7.%d, flags %#x)", negotiated.minor,
                 negotiated.flags)
    clone = clone_fd(fd)
    server = _Server(tree, clone, takeover_state, negotiated,
                     requests if requests is not None else RequestCounts(),
                     passthrough if passthrough is not None else PassthroughCounts())
    pusher = None
    if tree.immutable and not tree.direct_io:
        pusher = PagePusher(clone, pushes if pushes is not None else PushCounts())
        tree.use_pusher(pusher.push)
    workers = [threading.Thread(target=server.run, name=f"fuse-{i}", daemon=True)
               for i in range(threads)]
    for worker in workers:
        worker.start()
    # Interrupted here (SIGINT, a SIGTERM handler raising), the clone stays open: workers
    # may still answer on it, and its number must not go to another file meanwhile. The
    # process exit closes it, ending what was in flight as a kill would.
    for worker in workers:
        worker.join()
    if pusher is not None:
        pusher.stop()
    if server.passthrough is not None:
        server.passthrough.close()
    os.close(clone)
    if server.failure is not None:
        raise FuseError(f"serving FUSE failed: {server.failure}") from server.failure
    return server.negotiated


def serve_at(tree: Tree, mountpoint: Path, source: str, *,
             threads: int = DEFAULT_THREADS, requests: RequestCounts | None = None,
             pushes: PushCounts | None = None,
             passthrough: PassthroughCounts | None = None) -> None:
    """Mount a connection at ``mountpoint`` for this process (root: mount(2); anyone else:
    fusermount3) and serve ``tree`` on it until it is unmounted; SIGTERM and SIGINT
    unmount it, so the caller's cleanup after this returns still runs. The connection
    ends with this process: for mounts that must outlive their server, the node agent
    holds the connection and servers :func:`serve` it."""
    fd = open_connection(mountpoint, source)

    def stop(signum: int, frame: object) -> None:
        detach(mountpoint)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        serve(tree, fd, threads=threads, requests=requests, pushes=pushes,
              passthrough=passthrough)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(fd)


class _Server:
    """The request handlers, shared by the reader threads; no state but caches."""

    def __init__(self, tree: Tree, fd: int, state_path: Path | None,
                 negotiated: Negotiated | None, requests: RequestCounts,
                 passthrough: PassthroughCounts) -> None:
        self.tree, self.fd, self.state_path = tree, fd, state_path
        self.requests, self.passthrough_counts = requests, passthrough
        self.no_open = self.no_opendir = False
        self.negotiated: Negotiated | None = None
        self.passthrough: Passthrough | None = None
        if negotiated is not None:
            self.agree(negotiated, fresh=False)
        self.failure: OSError | None = None
        ttl = tree.ttl
        self.valid = (math.floor(ttl), int((ttl % 1) * 1e9))
        # An immutable tree's answers, packed on first use (a dict store is atomic under the
        # GIL; two threads packing the same node at once only waste a little work).
        self.cache = tree.immutable
        self.entry_outs: dict[int, bytes] = {}
        self.attr_outs: dict[int, bytes] = {}
        self.listings: dict[int, list[bytes]] = {}
        self.plus_listings: dict[int, list[bytes]] = {}
        seconds, nanos = self.valid
        self.negative = p.ENTRY_OUT.pack(0, 0, seconds, seconds, nanos, nanos) + \
            bytes(p.ATTR.size)
        open_flags = p.FOPEN_NOFLUSH
        if tree.immutable:
            open_flags |= p.FOPEN_KEEP_CACHE
        if tree.direct_io:
            open_flags |= p.FOPEN_DIRECT_IO
        self.open_flags = open_flags
        max_write = max(MAX_WRITE, negotiated.max_write if negotiated else 0)
        self.buffer_size = max_write + HEADER_ROOM
        self.handlers: dict[int, Handler] = {
            p.INIT: self.init, p.LOOKUP: self.lookup, p.GETATTR: self.getattr,
            p.READLINK: self.readlink, p.OPEN: self.open, p.READ: self.read,
            p.RELEASE: self.release, p.OPENDIR: self.opendir, p.READDIR: self.readdir,
            p.READDIRPLUS: self.readdirplus,
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
        counts, cpu = self.requests.for_thread()
        clock = time.thread_time_ns
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
            began, kind = clock(), opcode
            try:
                kind = handlers.get(opcode, enosys)(unique, nodeid, view[header:n]) or opcode
            except OSError as exc:
                if exc.errno in TREE_ERRORS:
                    self.error(unique, exc.errno)
                else:
                    self._failed(unique, opcode, nodeid, exc)
            except Exception as exc:
                self._failed(unique, opcode, nodeid, exc)
            counts[kind] = counts.get(kind, 0) + 1
            cpu[kind] = cpu.get(kind, 0) + clock() - began

    def _failed(self, unique: int, opcode: int, nodeid: int, exc: Exception) -> None:
        """A request the tree could not answer (the store unreachable, a block corrupt
        twice): logged, and ``EIO`` for the caller, never short or wrong bytes."""
        log.error("FUSE request %d (opcode %d, node %d) failed: %s", unique, opcode, nodeid,
                  exc, exc_info=not isinstance(exc, OSError))
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
        if flags & p.INIT_EXT and len(body) >= p.INIT_IN_EXT.size:
            flags |= p.INIT_IN_EXT.unpack_from(body)[4] << 32
        if major != p.KERNEL_VERSION or minor < p.MIN_MINOR:
            log.error("kernel FUSE protocol %d.%d is not supported (need %d.%d or later)",
                      major, minor, p.KERNEL_VERSION, p.MIN_MINOR)
            self.error(unique, errno.EPROTO)
            return
        # The kernel takes the smaller of this and the mount's readahead: asking for more
        # than it offered keeps what the connection's mount set.
        wanted = WANTED_FLAGS
        if self.tree.immutable:  # entries in listings are as good as a lookup's, for good
            wanted |= p.DO_READDIRPLUS
        if self.tree.offers_backing and may_pass_through():
            wanted |= p.PASSTHROUGH | p.INIT_EXT
        negotiated = Negotiated(minor=min(minor, p.MAX_MINOR), flags=flags & wanted,
                                max_readahead=max(max_readahead, READAHEAD),
                                max_write=MAX_WRITE,
                                max_pages=MAX_PAGES, kernel_minor=minor, kernel_flags=flags)
        # Saved before answering: once answered, a server killed before saving would leave
        # a connection no successor could know it is initialised.
        if self.state_path is not None:
            negotiated.save(self.state_path)
        self.agree(negotiated, fresh=True)
        log.info("FUSE connection initialised: protocol 7.%d, flags %#x (kernel: 7.%d, %#x)",
                 negotiated.minor, negotiated.flags, minor, flags)
        agreed = negotiated.flags
        self.reply(unique, p.INIT_OUT.pack(
            p.KERNEL_VERSION, negotiated.minor, negotiated.max_readahead, agreed & 0xFFFFFFFF,
            MAX_BACKGROUND, CONGESTION_THRESHOLD, MAX_WRITE, 1, MAX_PAGES, 0, agreed >> 32,
            MAX_STACK_DEPTH if agreed & p.PASSTHROUGH else 0, 0))

    def agree(self, negotiated: Negotiated, *, fresh: bool) -> None:
        """Take on what INIT settled (``fresh``: just now, else by a predecessor). For a
        tree whose opens need no state, where the kernel supports it, OPEN and OPENDIR are
        answered ENOSYS once, and then never sent again: opening costs no round trip (nor
        does RELEASE), and the kernel's default for such opens is to keep the page cache
        and cache directories, just what an immutable tree wants. With passthrough, OPEN
        must be answered: that is where a backing file is named."""
        stateless = self.tree.stateless_open and self.tree.immutable
        if negotiated.flags & p.PASSTHROUGH:
            log_path = None if self.state_path is None else \
                self.state_path.with_name(self.state_path.name + ".backing")
            self.passthrough = Passthrough(self.fd, self.tree, log_path, fresh=fresh,
                                           counts=self.passthrough_counts)
            self.tree.use_passthrough()
        self.no_open = stateless and bool(negotiated.kernel_flags & p.NO_OPEN_SUPPORT) and \
            self.passthrough is None
        self.no_opendir = self.tree.immutable and \
            bool(negotiated.kernel_flags & p.NO_OPENDIR_SUPPORT)
        self.negotiated = negotiated

    def lookup(self, unique: int, parent: int, body: memoryview) -> int | None:
        """A name's entry; a miss is answered as a negative entry and counted as its own
        kind (:data:`NEGATIVE_LOOKUP`)."""
        name = os.fsdecode(bytes(body).partition(b"\0")[0])
        node = self.tree.lookup(parent, name)
        if node is None:
            self.reply(unique, self.negative)  # node id 0: the kernel caches the miss
            return NEGATIVE_LOOKUP
        self.reply(unique, self._entry_out(node))
        self.tree.looked_up(node.ino)
        return None

    def _entry_out(self, node: Node) -> bytes:
        """A node's ``fuse_entry_out`` (its attributes included)."""
        out = self.entry_outs.get(node.ino)
        if out is None:
            seconds, nanos = self.valid
            out = p.ENTRY_OUT.pack(node.ino, 0, seconds, seconds, nanos, nanos) + _attr(node)
            if self.cache:
                self.entry_outs[node.ino] = out
        return out

    def getattr(self, unique: int, nodeid: int, body: memoryview) -> None:
        out = self.attr_outs.get(nodeid)
        if out is None:
            node = self.tree.node(nodeid)
            if node is None:
                self.error(unique, errno.ENOENT)
                return
            out = p.ATTR_OUT.pack(self.valid[0], self.valid[1], 0) + _attr(node)
            if self.cache:
                self.attr_outs[nodeid] = out
        self.reply(unique, out)

    def readlink(self, unique: int, nodeid: int, body: memoryview) -> None:
        self.reply(unique, self.tree.readlink(nodeid))

    def open(self, unique: int, nodeid: int, body: memoryview) -> int | None:
        flags, _ = p.OPEN_IN.unpack_from(body)
        if flags & _WRITE_FLAGS:
            self.error(unique, errno.EROFS)
        elif self.no_open:
            self.error(unique, errno.ENOSYS)
        else:
            backing = self.passthrough.backing_id(nodeid) if self.passthrough else 0
            if backing:
                self.reply(unique, p.OPEN_OUT.pack(0, _PASSTHROUGH_FLAGS, backing))
                return PASSTHROUGH_OPEN
            handle = self.tree.open(nodeid)
            self.reply(unique, p.OPEN_OUT.pack(handle, self.open_flags, 0))
        return None

    def read(self, unique: int, nodeid: int, body: memoryview) -> None:
        handle, offset, size = p.READ_IN.unpack_from(body)
        data = self.tree.read(nodeid, handle, offset, size)
        self.send((p.OUT_HEADER.pack(_OK_HEADER + len(data), 0, unique), data))

    def release(self, unique: int, nodeid: int, body: memoryview) -> None:
        handle, = p.RELEASE_IN.unpack_from(body)
        self.tree.release(nodeid, handle)
        self.reply(unique)

    def opendir(self, unique: int, nodeid: int, body: memoryview) -> None:
        node = self.tree.node(nodeid)
        if node is None or not node.is_dir:
            self.error(unique, errno.ENOTDIR if node else errno.ENOENT)
        elif self.no_opendir:
            self.error(unique, errno.ENOSYS)
        else:
            flags = p.FOPEN_KEEP_CACHE | p.FOPEN_CACHE_DIR if self.tree.immutable else 0
            self.reply(unique, p.OPEN_OUT.pack(0, flags, 0))

    def readdir(self, unique: int, nodeid: int, body: memoryview) -> None:
        _, offset, size = p.READ_IN.unpack_from(body)
        self.reply(unique, _records(self._listing(nodeid, plus=False), offset, size))

    def readdirplus(self, unique: int, nodeid: int, body: memoryview) -> None:
        """A listing whose every entry is also a lookup's answer; the tree hears of each
        node the kernel now knows, as after a lookup."""
        _, offset, size = p.READ_IN.unpack_from(body)
        records = self._listing(nodeid, plus=True)
        answer = _records(records, offset, size)
        self.reply(unique, answer)
        known = 0
        for record in islice(records, offset, None):  # the records just sent
            known += len(record)
            if known > len(answer):
                break
            ino = p.ENTRY_OUT.unpack_from(record)[0]
            if ino:
                self.tree.looked_up(ino)

    def _listing(self, ino: int, *, plus: bool) -> list[bytes]:
        """The directory's ``fuse_dirent`` records (``plus``: each after its node's
        ``fuse_entry_out``, except ``.`` and ``..``, whose node id 0 says "no entry");
        each record's offset is the number of records up to and including it. Kept for
        good for an immutable tree."""
        cached = self.plus_listings if plus else self.listings
        records = cached.get(ino)
        if records is None:
            records = self._records_of(ino, plus=plus)
            if self.cache:
                cached[ino] = records
        return records

    def _records_of(self, ino: int, *, plus: bool) -> list[bytes]:
        records = []
        for offset, (name, node) in enumerate(self.tree.readdir(ino), 1):
            raw = os.fsencode(name)
            record = p.DIRENT.pack(node.ino, offset, len(raw), stat.S_IFMT(node.mode) >> 12)
            if plus:
                record = (self._entry_out(node) if name not in (".", "..") else
                          _NO_ENTRY) + record
            record += raw
            records.append(record + bytes(-len(record) % 8))
        return records

    def statfs(self, unique: int, nodeid: int, body: memoryview) -> None:
        size = self.tree.block_size
        self.reply(unique, p.KSTATFS.pack(0, 0, 0, 0, 0, size, 255, size, 0))

    def getxattr(self, unique: int, nodeid: int, body: memoryview) -> None:
        if not self.tree.has_xattrs:  # the kernel stops asking (overlayfs asks on every lookup)
            self.error(unique, errno.ENOSYS)
            return
        size, _ = p.XATTR_SIZE.unpack_from(body)
        name = os.fsdecode(bytes(body[p.XATTR_SIZE.size:]).partition(b"\0")[0])
        value = self.tree.getxattr(nodeid, name)
        if value is None:
            self.error(unique, errno.ENODATA)
        else:
            self._sized(unique, size, value)

    def listxattr(self, unique: int, nodeid: int, body: memoryview) -> None:
        size, _ = p.XATTR_SIZE.unpack_from(body)
        names = self.tree.listxattr(nodeid)
        self._sized(unique, size, b"".join(os.fsencode(n) + b"\0" for n in names))

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


_NO_ENTRY = bytes(p.ENTRY_OUT.size + p.ATTR.size)


def _records(records: list[bytes], offset: int, size: int) -> bytes:
    """The records of a listing from ``offset`` (records already returned) that fit in
    ``size`` bytes."""
    out, total = [], 0
    for record in islice(records, offset, None):
        total += len(record)
        if total > size:
            break
        out.append(record)
    return b"".join(out)


def _attr(node: Node) -> bytes:
    """The packed ``fuse_attr`` of a node (all three times are its mtime)."""
    seconds = math.floor(node.mtime)  # before 1970 it wraps, as the kernel reads it signed
    nanos = min(int((node.mtime - seconds) * 1e9), 999_999_999)
    rdev = 0
    if node.rdev:  # the kernel's new_encode_dev
        major, minor = os.major(node.rdev), os.minor(node.rdev)
        rdev = ((minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)) & 0xFFFFFFFF
    seconds &= 0xFFFFFFFFFFFFFFFF
    return p.ATTR.pack(node.ino, node.size, (node.size + 511) // 512, seconds, seconds,
                       seconds, nanos, nanos, nanos, node.mode, node.nlink, node.uid,
                       node.gid, rdev, 0, 0)

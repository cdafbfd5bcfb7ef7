"""A checkpoint directory in the store as a read-only file tree (:class:`bootseer.fuse.tree.Tree`).

The data layer of a checkpoint mount, no FUSE in it. One recursive listing gives every
path, its size and mtime; directories are implied by keys. The listing is kept for ``ttl``
seconds (the kernel trusts names and attributes as long), so ``ls`` and ``stat`` of a
checkpoint directory cost one round trip to the NameNode per TTL rather than one per call.
Who may read a file (the store's owner, group and permissions, narrowed by ``mode``:
``checkpoint.mount_mode``) is asked once per file and TTL, when the file is first looked at;
where the store cannot say, ``mode`` itself, owned by root.

Node numbers are a hash of the path, so every server of the directory names a file alike
and a new server can take a connection over. Each open file has its own reader
(:func:`bootseer.stripedfs.files.open_reader`: the node's staged copy when current, else
the striped reader with its own read-ahead window), kept by a random handle; a read on a
handle this process never gave out (a predecessor's, after a takeover) opens the file
again under it. At most :data:`MAX_OPEN` files are open at once: each reader is small, but
a container must not be able to grow a root process without bound.

A file with a current staged copy is offered as its backing file (:meth:`backing`): the
kernel reads the copy itself (FUSE passthrough), no reader is kept. A file's content
version is its size and mtime in the listing, so a file rewritten in the store is decided
afresh, never read from the copy of its old bytes.
"""

from __future__ import annotations

import errno
import hashlib
import posixpath
import secrets
import stat
import threading
import time
from dataclasses import dataclass

from bootseer.fuse.tree import ROOT, Backing, Node, Tree
from bootseer.store import Store
from bootseer.store.base import Access
from bootseer.stripedfs.checkpoint_cache import CheckpointCache, object_url
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.files import PeerFiles, Reader, open_reader

#: Open files per mount (``ENFILE`` beyond).
MAX_OPEN = 4096


@dataclass(frozen=True)
class _Entry:
    path: str
    is_dir: bool
    size: int = 0
    mtime: float = 0.0


def node_number(path: str) -> int:
    """A path's node number: the same in every process, never 0 (no node) or :data:`ROOT`
    unless ``path`` is the root."""
    if path == "/":
        return ROOT
    digest = hashlib.blake2b(path.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return max(int.from_bytes(digest, "little") >> 1, ROOT + 1)


class CheckpointTree(Tree):
    block_size = 1 << 20

    def __init__(self, store: Store, *, config: StripeConfig | None = None,
                 copies: CheckpointCache | None = None, ttl: float = 30.0,
                 mode: int = 0o444, direct_io: bool = True,
                 peers: PeerFiles | None = None) -> None:
        self.store, self.config, self.copies, self.peers = store, config, copies, peers
        self.ttl, self.direct_io = ttl, direct_io
        self.offers_backing = copies is not None
        self.file_mode = mode & 0o444
        self.dir_mode = self.file_mode | (self.file_mode >> 2)  # search where readable
        #: The listing: entries and each directory's children, replaced whole.
        self._tree: tuple[dict[int, _Entry], dict[int, list[tuple[str, int]]]] = ({}, {})
        self._loaded_at = float("-inf")
        self._access: dict[str, Access] = {}
        self._readers: dict[int, tuple[int, Reader]] = {}
        self._lock = threading.Lock()  # readers and access answers: held for moments
        self._refresh = threading.Lock()  # held while the store lists: never by a read

    # -- metadata --------------------------------------------------------------------------

    def node(self, ino: int) -> Node | None:
        entry = self._listing()[0].get(ino)
        return None if entry is None else self._node(ino, entry)

    def lookup(self, parent: int, name: str) -> Node | None:
        entries = self._listing()[0]
        directory = entries.get(parent)
        if directory is None or not directory.is_dir:
            return None
        ino = node_number(posixpath.join(directory.path, name))
        entry = entries.get(ino)
        return None if entry is None else self._node(ino, entry)

    def readdir(self, ino: int) -> list[tuple[str, Node]]:
        entries, children = self._listing()
        directory = entries.get(ino)
        if directory is None or not directory.is_dir:
            raise OSError(errno.ENOTDIR, "not a directory")
        parent = node_number(posixpath.dirname(directory.path))
        listing = [(".", self._node(ino, directory)),
                   ("..", self._node(parent, entries.get(parent, directory)))]
        return listing + [(name, self._node(child, entries[child]))
                          for name, child in children.get(ino, [])]

    def _node(self, ino: int, entry: _Entry) -> Node:
        if entry.is_dir:
            return Node(ino, stat.S_IFDIR | self.dir_mode, 0, entry.mtime, nlink=2)
        access = self._access_of(entry.path)
        bits = self.file_mode if access is None else access.mode & self.file_mode
        uid = gid = 0
        if access is not None:
            uid, gid = access.uid or 0, access.gid or 0
        return Node(ino, stat.S_IFREG | bits, entry.size, entry.mtime, uid=uid, gid=gid)

    def _access_of(self, path: str) -> Access | None:
        """Who may read the file at ``path`` as the store says (None: it cannot say)."""
        with self._lock:
            if path in self._access:
                return self._access[path]
        try:
            found = self.store.access(path.lstrip("/"))
        except FileNotFoundError:
            found = Access(None, None, 0)  # gone since the listing: nobody reads it
        with self._lock:
            self._access[path] = found
        return found

    def _listing(self) -> tuple[dict[int, _Entry], dict[int, list[tuple[str, int]]]]:
        if time.monotonic() - self._loaded_at < self.ttl:
            return self._tree
        with self._refresh:
            if time.monotonic() - self._loaded_at < self.ttl:  # another thread listed
                return self._tree
            entries: dict[int, _Entry] = {ROOT: _Entry("/", True)}
            children: dict[int, dict[str, int]] = {ROOT: {}}
            for info in self.store.list():
                path = "/" + info.key
                entries[node_number(path)] = _Entry(path, False, info.size, info.mtime)
                child = path
                while child != "/":
                    parent = posixpath.dirname(child)
                    number = node_number(parent)
                    children.setdefault(number, {})[posixpath.basename(child)] = \
                        node_number(child)
                    if number not in entries:
                        entries[number] = _Entry(parent, True, 0, info.mtime)
                    child = parent
            self._tree = (entries, {k: sorted(v.items()) for k, v in children.items()})
            with self._lock:
                self._access = {}
            self._loaded_at = time.monotonic()
            return self._tree

    # -- content ---------------------------------------------------------------------------

    def content_version(self, ino: int) -> int:
        entry = self._listing()[0].get(ino)
        if entry is None:
            return 0
        digest = hashlib.blake2b(f"{entry.size}:{entry.mtime!r}".encode(), digest_size=8)
        return int.from_bytes(digest.digest(), "little")

    def backing(self, ino: int) -> Backing | None:
        """The file's staged copy, if it is current (a copy of what the store holds now,
        which is also what the listing says the file is)."""
        entry = self._listing()[0].get(ino)
        if self.copies is None or entry is None or entry.is_dir:
            return None
        key = entry.path.lstrip("/")
        try:
            info = self.store.stat(key)
        except FileNotFoundError:
            return None
        if (info.size, info.mtime) != (entry.size, entry.mtime):
            return None  # changed since the listing: the server reads what is there now
        found = self.copies.copy_descriptor(object_url(self.store, key), info)
        return None if found is None else Backing(found[0].sha256, found[1])

    def open(self, ino: int) -> int:
        reader = self._open_reader(ino)
        handle = secrets.randbits(63) | 1  # unique across servers of this connection
        self._keep(handle, ino, reader)
        return handle

    def read(self, ino: int, handle: int, offset: int, size: int) -> bytes:
        with self._lock:
            held = self._readers.get(handle)
        if held is None or held[0] != ino:  # a predecessor's handle: open it again
            reader = self._open_reader(ino)
            self._keep(handle, ino, reader)
        else:
            reader = held[1]
        return reader.read(offset, size)

    def release(self, ino: int, handle: int) -> None:
        with self._lock:
            held = self._readers.pop(handle, None)
        if held is not None:
            held[1].close()

    def _open_reader(self, ino: int) -> Reader:
        entry = self._listing()[0].get(ino)
        if entry is None:
            raise OSError(errno.ENOENT, "no such file")
        if entry.is_dir:
            raise OSError(errno.EISDIR, "is a directory")
        try:
            return open_reader(self.store, entry.path.lstrip("/"), config=self.config,
                               copies=self.copies, peers=self.peers)
        except FileNotFoundError:
            raise OSError(errno.ENOENT, "gone from the store") from None

    def _keep(self, handle: int, ino: int, reader: Reader) -> None:
        with self._lock:
            if len(self._readers) >= MAX_OPEN and handle not in self._readers:
                reader.close()
                raise OSError(errno.ENFILE, f"{MAX_OPEN} files of this mount are open")
            old = self._readers.get(handle)
            self._readers[handle] = (ino, reader)
        if old is not None:
            old[1].close()

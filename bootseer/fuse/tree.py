"""A read-only file tree, as a FUSE server asks about it: the one interface every mount serves.

Like ratarmount's ``MountSource``, this is the data layer's side of a mount and knows
nothing of FUSE: the lazy image (:class:`bootseer.prefetch.imagetree.ImageTree`) and a
checkpoint directory in the store (:class:`bootseer.stripedfs.tree.CheckpointTree`) each
implement it once, and :mod:`bootseer.fuse.server` serves either on ``/dev/fuse``.

Nodes are named by numbers the tree chooses, and a tree must choose them so that another
process serving the same data names every node the same: that is what lets a new server
take over a connection whose kernel already holds those numbers (the root is
:data:`ROOT`). File handles come from :meth:`Tree.open`; a tree whose reads need state per
open file keeps it by handle and must re-create it when :meth:`Tree.read` names a handle
it never gave out (a predecessor's, after a takeover).

Failures are ``OSError`` with the errno the caller should see (``ENOENT``, ``ENOTDIR``,
``EINVAL``, ``ENFILE``); any other exception from :meth:`Tree.read` is the store's or the
data's fault, which the server logs and answers ``EIO``.
"""

from __future__ import annotations

import errno
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

#: The root's node number (FUSE_ROOT_ID: the kernel asks for the root by it, no lookup).
ROOT = 1

#: ``push(ino, offset, data)``: put a file's bytes at ``offset`` into the kernel's page cache.
PushPages = Callable[[int, int, bytes], None]


@dataclass(frozen=True, slots=True)
class Node:
    """What ``stat`` shows of a node. ``mode`` includes the file type bits."""

    ino: int
    mode: int
    size: int = 0
    mtime: float = 0.0
    nlink: int = 1
    uid: int = 0
    gid: int = 0
    rdev: int = 0  # a device node's number (``os.makedev``)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


@dataclass(frozen=True, slots=True)
class Backing:
    """A local file holding exactly a node's bytes, for the kernel to read instead of the
    server (:mod:`bootseer.fuse.passthrough`): an open read-only descriptor, which the
    caller closes, and a key naming its content (nodes with the same key share one
    registration)."""

    key: str
    fd: int


class Tree(ABC):
    """A read-only tree of nodes; every method may be called from several threads."""

    #: Seconds the kernel may trust a name, an attribute or a missing name.
    ttl: float = 1.0
    #: The tree never changes while served: answers may be kept for good, and the kernel
    #: may keep a file's pages across opens.
    immutable: bool = False
    #: Opens need no state (reads ignore the handle): the kernel may skip OPEN and RELEASE
    #: altogether where it supports that.
    stateless_open: bool = False
    #: Reads bypass the kernel's page cache (large sequential reads of data read once).
    direct_io: bool = False
    #: Whether any node has an extended attribute: if not, the kernel is told to stop
    #: asking (overlayfs asks on every lookup).
    has_xattrs: bool = False
    #: The block size ``statfs`` reports (a hint for ``cp`` and friends).
    block_size: int = 4096
    #: The tree may name backing files (:meth:`backing`): a privileged server then asks
    #: the kernel for passthrough.
    offers_backing: bool = False

    @abstractmethod
    def node(self, ino: int) -> Node | None:
        """The node numbered ``ino``, or None."""

    @abstractmethod
    def lookup(self, parent: int, name: str) -> Node | None:
        """The node called ``name`` in directory ``parent``, or None."""

    @abstractmethod
    def readdir(self, ino: int) -> list[tuple[str, Node]]:
        """Directory ``ino``'s entries, ``.`` and ``..`` first (``ENOTDIR`` if it is not one)."""

    def readlink(self, ino: int) -> bytes:
        raise OSError(errno.EINVAL, "not a symbolic link")

    def getxattr(self, ino: int, name: str) -> bytes | None:
        """The value of xattr ``name`` of node ``ino``, None if it has none of that name."""
        return None

    def listxattr(self, ino: int) -> list[str]:
        return []

    def open(self, ino: int) -> int:
        """A handle for reading node ``ino`` (a regular file)."""
        return 0

    @abstractmethod
    def read(self, ino: int, handle: int, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (fewer only at the end of the file)."""

    def release(self, ino: int, handle: int) -> None:  # noqa: B027 (most trees keep nothing)
        """The kernel closed ``handle``: drop what :meth:`open` kept for it."""

    def use_pusher(self, push: PushPages) -> None:  # noqa: B027 (most trees push nothing)
        """The server can put pages into the kernel's page cache (an immutable tree served
        through the cache only). A tree that knows which pages a start will read pushes
        them once the kernel knows their node (:meth:`looked_up`), so those reads never
        reach the server. ``push`` never blocks; it may drop what it cannot take. The
        bytes must be the file's own and end at its end at most."""

    def looked_up(self, ino: int) -> None:  # noqa: B027
        """The kernel was just told about node ``ino`` (a lookup answered)."""

    def backing(self, ino: int) -> Backing | None:
        """A verified local file holding node ``ino``'s bytes, that the kernel may read
        in place of the server, or None to serve its reads here. Asked once per node and
        :meth:`content_version` per connection, at its first open: the answer holds
        until the mount ends."""
        return None

    def content_version(self, ino: int) -> int:
        """What names node ``ino``'s current content, as a 64-bit number: a node's
        passthrough mode is decided once per version (an immutable tree's never
        changes; a tree whose files can change in the store names a new version when
        one does, and :meth:`backing` is asked again)."""
        return 0

    def use_passthrough(self) -> None:  # noqa: B027
        """The connection passes through: opens of nodes :meth:`backing` names will not
        read from the server (so pushing their pages would be wasted)."""

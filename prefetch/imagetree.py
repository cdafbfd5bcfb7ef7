"""The lazy image as a read-only file tree (:class:`bootseer.fuse.tree.Tree`), for its mount.

Node numbers are the manifest's inode numbers: the root's is 1, hard links share theirs,
and every server of the same image names every node alike, so a new server can take a
connection over. Everything but file content comes from the manifest, which never changes
while mounted: the tree is immutable (the kernel keeps names, attributes, listings and
pages for a day) and its opens need no state. Given the image's hot blocks, the tree puts
them in the page cache of each file the kernel looks up (:mod:`bootseer.prefetch.pagewarm`).
A file kept whole on the node (:mod:`bootseer.prefetch.wholefiles`) is offered as its
backing file, for the kernel to read itself, except while a recording runs (it must see
every read); such a file's pages are not pushed: the kernel is asked to read its hot
blocks ahead from the whole file instead.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

from bootseer.fuse.tree import ROOT, Backing, Node, PushPages, Tree
from bootseer.prefetch.blockformat import FileEntry
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.pagewarm import PageWarmer, ReadAheadCounts
from bootseer.prefetch.rootfs import FILE_TYPE, Kind
from bootseer.prefetch.wholefiles import WholeFiles

#: Seconds the kernel may trust a name or attribute: the image is immutable, so only
#: memory pressure should drop them.
TTL = 86400


class ImageTree(Tree):
    ttl = TTL
    immutable = True
    stateless_open = True

    def __init__(self, image: LazyImage, hot: Iterable[str] = (), *,
                 passthrough: bool = True, read_ahead: ReadAheadCounts | None = None,
                 whole: WholeFiles | None = None) -> None:
        """``hot``: digests of the blocks this start is expected to read (its hot list);
        ``passthrough``: offer whole files as backing files (``image.passthrough``), if
        the image has any on the node; ``read_ahead`` counts what of them the kernel
        was asked to read ahead; ``whole``: the image's whole files, if the caller
        already asks them (the prefetch does: one key per file, computed once)."""
        self.image = image
        self.hot = frozenset(hot)
        self.read_ahead = read_ahead
        self.warmer: PageWarmer | None = None
        self.whole = whole if whole is not None else WholeFiles(image)
        self.offers_backing = passthrough and self.whole.any()
        self.passing = False  # the connection passes through
        self.by_path = image.manifest.by_path
        #: node number → index of its entry: a hard link group's is its first path (kind
        #: FILE). Entries and nodes are built as the kernel asks for them.
        self.indexes = image.manifest.node_indexes()
        self.nodes: dict[int, Node] = {}
        root = self.entry(ROOT)
        if root is None or root.path != "/":
            raise ValueError(f"image {image.image_id}: the root's inode number is not "
                             f"{ROOT}; cannot use inode numbers as node numbers")
        self.has_xattrs = image.manifest.has_xattrs

    def entry(self, ino: int) -> FileEntry | None:
        i = self.indexes.get(ino)
        return None if i is None else self.image.manifest.entries[i]

    def node(self, ino: int) -> Node | None:
        node = self.nodes.get(ino)
        if node is None:
            entry = self.entry(ino)
            if entry is None:
                return None
            node = self.nodes[ino] = _node(entry)  # a dict store is atomic under the GIL
        return node

    def _node_of(self, entry: FileEntry) -> Node:
        node = self.node(entry.ino)
        assert node is not None  # every entry's inode has an entry
        return node

    def lookup(self, parent: int, name: str) -> Node | None:
        directory = self.entry(parent)
        if directory is None:
            return None
        entry = self.by_path.get(f"/{name}" if directory.path == "/"
                                 else f"{directory.path}/{name}")
        return None if entry is None else self._node_of(entry)

    def readdir(self, ino: int) -> list[tuple[str, Node]]:
        directory = self.entry(ino)
        if directory is None or directory.kind is not Kind.DIR:
            raise OSError(errno.ENOTDIR, "not a directory")
        path = directory.path
        parent = self.by_path[path.rpartition("/")[0] or "/"]
        prefix = "" if path == "/" else path
        listing = [(".", self._node_of(directory)), ("..", self._node_of(parent))]
        listing += [(name, self._node_of(self.by_path[f"{prefix}/{name}"]))
                    for name in self.image.listdir(path)]
        return listing

    def readlink(self, ino: int) -> bytes:
        entry = self.entry(ino)
        if entry is None or entry.kind is not Kind.SYMLINK or entry.link_target is None:
            raise OSError(errno.EINVAL, "not a symbolic link")
        return os.fsencode(entry.link_target)

    def getxattr(self, ino: int, name: str) -> bytes | None:
        entry = self.entry(ino)
        return None if entry is None else entry.xattrs.get(name)

    def listxattr(self, ino: int) -> list[str]:
        entry = self.entry(ino)
        return [] if entry is None else list(entry.xattrs)

    def use_pusher(self, push: PushPages) -> None:
        self._start_warmer(push)

    def _start_warmer(self, push: PushPages, *, all_at_once: bool = False) -> None:
        """Warm the hot blocks of each file as the kernel looks it up, or (``all_at_once``)
        of every file given to the warmer when serving begins (``PageWarmer``'s
        ``behind``)."""
        if self.hot and PageWarmer.applies(self.image):
            self.warmer = PageWarmer(self.image, self.hot, push, read_ahead=self._read_ahead,
                                     counts=self.read_ahead, behind=all_at_once)

    def looked_up(self, ino: int) -> None:
        if self.warmer is not None and (entry := self.entry(ino)) is not None:
            self.warmer.looked_up(entry)

    def _read_ahead(self, entry: FileEntry, ranges: list[tuple[int, int]]) -> bool:
        """If the kernel reads ``entry`` from its whole file (its pages are not the
        mount's to push), have it read the hot ``ranges`` of that file ahead."""
        return self.passing and not self.image.recording and \
            self.whole.read_ahead(entry, ranges)

    def use_passthrough(self) -> None:
        self.passing = True

    def backing(self, ino: int) -> Backing | None:
        entry = self.entry(ino)
        if entry is None or self.image.recording:
            return None
        return self.whole.open(entry)

    def read(self, ino: int, handle: int, offset: int, size: int) -> bytes:
        entry = self.entry(ino)
        if entry is None:
            raise OSError(errno.ENOENT, "no such node")
        return self.image.read(entry, offset, size)


def _node(entry: FileEntry) -> Node:
    rdev = os.makedev(entry.devmajor, entry.devminor) \
        if entry.kind in (Kind.CHAR, Kind.BLOCK) else 0
    return Node(ino=entry.ino, mode=FILE_TYPE[entry.kind] | entry.mode, size=entry.size,
                mtime=entry.mtime, nlink=entry.nlink, uid=entry.uid, gid=entry.gid, rdev=rdev)

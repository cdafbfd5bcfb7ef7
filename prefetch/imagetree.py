"""The lazy image as a read-only file tree (:class:`bootseer.fuse.tree.Tree`), for its mount.

Node numbers are the manifest's inode numbers: the root's is 1, hard links share theirs,
and every server of the same image names every node alike, so a new server can take a
connection over. Everything but file content comes from the manifest, which never changes
while mounted: the tree is immutable (the kernel keeps names, attributes, listings and
pages for a day) and its opens need no state.
"""

from __future__ import annotations

import errno
import os

from bootseer.fuse.tree import ROOT, Node, Tree
from bootseer.prefetch.blockformat import FileEntry
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.rootfs import FILE_TYPE, Kind

#: Seconds the kernel may trust a name or attribute: the image is immutable, so only
#: memory pressure should drop them.
TTL = 86400


class ImageTree(Tree):
    ttl = TTL
    immutable = True
    stateless_open = True

    def __init__(self, image: LazyImage) -> None:
        self.image = image
        entries = image.manifest.entries
        self.by_path = image.manifest.by_path
        #: node number → entry: a hard link group is its first path (kind FILE).
        self.entries: dict[int, FileEntry] = {
            e.ino: e for e in entries if e.kind is not Kind.HARDLINK}
        root = self.entries.get(ROOT)
        if root is None or root.path != "/":
            raise ValueError(f"image {image.image_id}: the root's inode number is not "
                             f"{ROOT}; cannot use inode numbers as node numbers")
        self.nodes = {ino: _node(e) for ino, e in self.entries.items()}
        self.has_xattrs = any(e.xattrs for e in entries)

    def node(self, ino: int) -> Node | None:
        return self.nodes.get(ino)

    def lookup(self, parent: int, name: str) -> Node | None:
        directory = self.entries.get(parent)
        if directory is None:
            return None
        entry = self.by_path.get(f"/{name}" if directory.path == "/"
                                 else f"{directory.path}/{name}")
        return None if entry is None else self.nodes[entry.ino]

    def readdir(self, ino: int) -> list[tuple[str, Node]]:
        directory = self.entries.get(ino)
        if directory is None or directory.kind is not Kind.DIR:
            raise OSError(errno.ENOTDIR, "not a directory")
        path = directory.path
        parent = self.by_path[path.rpartition("/")[0] or "/"]
        prefix = "" if path == "/" else path
        listing = [(".", self.nodes[ino]), ("..", self.nodes[parent.ino])]
        listing += [(name, self.nodes[self.by_path[f"{prefix}/{name}"].ino])
                    for name in self.image.listdir(path)]
        return listing

    def readlink(self, ino: int) -> bytes:
        entry = self.entries.get(ino)
        if entry is None or entry.kind is not Kind.SYMLINK or entry.link_target is None:
            raise OSError(errno.EINVAL, "not a symbolic link")
        return os.fsencode(entry.link_target)

    def getxattr(self, ino: int, name: str) -> bytes | None:
        entry = self.entries.get(ino)
        return None if entry is None else entry.xattrs.get(name)

    def listxattr(self, ino: int) -> list[str]:
        entry = self.entries.get(ino)
        return [] if entry is None else list(entry.xattrs)

    def read(self, ino: int, handle: int, offset: int, size: int) -> bytes:
        entry = self.entries.get(ino)
        if entry is None:
            raise OSError(errno.ENOENT, "no such node")
        return self.image.read(entry, offset, size)


def _node(entry: FileEntry) -> Node:
    rdev = os.makedev(entry.devmajor, entry.devminor) \
        if entry.kind in (Kind.CHAR, Kind.BLOCK) else 0
    return Node(ino=entry.ino, mode=FILE_TYPE[entry.kind] | entry.mode, size=entry.size,
                mtime=entry.mtime, nlink=entry.nlink, uid=entry.uid, gid=entry.gid, rdev=rdev)

"""Apply an image's layer tars in order into one in-memory index of its root filesystem.

The lazy image needs the *merged* view a container sees — what ``tar -x`` of every layer
in order, plus the OCI whiteout rules, would leave on disk — without unpacking anything.
:func:`merge_layers` streams each layer once (``tarfile`` mode ``"r|"``, never seeking),
hands every regular file's bytes to a caller's ``store_content`` callback as they go by
(the caller cuts them into blocks), and keeps only metadata: a :class:`RootfsIndex` of
:class:`Entry` records. It writes nothing to the host file system, ever.

OCI layer rules (image-spec ``layer.md``):

* ``.wh.<name>`` hides ``<name>`` (and what is below it) from *lower* layers; entries the
  same layer adds stay. ``.wh..wh..opq`` in a directory hides all of its lower-layer
  contents. Both are applied as they are read, to lower-layer entries only, so the order
  of a layer's entries does not change the result: a hidden lower directory that leads to
  an entry of this layer becomes an implicit directory (below), just as if it had been
  removed before that entry arrived. Whiteout files never enter the index.
* A later entry replaces an earlier one. A directory over a directory updates the
  metadata and keeps the children; anything else replaces the whole subtree.
* A path whose parent directories have no entry gets them, implicitly, as ``0o755``
  root:root with mtime 0 (what ``tar -x`` does, up to the time stamp).
* A hard link shares its target's inode: the same metadata and content reference, and
  the same ``ino`` in the index. Overwriting or deleting one name of a group leaves the
  others together (the link is broken, as on disk). In the finished index the group's
  first path in tree order is kind ``FILE``, the others kind ``HARDLINK`` with
  ``link_target`` naming it, and every member has the group's ``ino`` and ``nlink``.
* Symlink targets are kept verbatim, absolute or relative: they are resolved by the
  kernel inside the container's root, never on the host. Their mode is always ``0o777``
  (Linux ignores it). Device nodes and FIFOs are metadata only.
* Ownership is numeric (uid/gid; user and group names are ignored, as runtimes do);
  extended attributes come from PAX ``SCHILY.xattr.*`` records, as raw bytes.

Layer tars are hostile input. What we do with each kind of trouble:

=========================================================  ==================================
case                                                       decision
=========================================================  ==================================
``..`` in an entry name or hard link target                reject (:class:`UnsafeLayerError`)
absolute name (``/etc/x``)                                 neutralise: strip the ``/`` as GNU
                                                           tar does, warn once per layer
``./`` prefixes, ``//``, trailing ``/``                    normalised silently
parent in the merged view is a symlink (``a -> /etc``,     reject: writing through it would
then ``a/passwd``; also for whiteouts and hard links)      leave the root on a real unpack
parent is a file, device or FIFO                           reject (conflicting entries)
hard link to a missing path, a directory, itself           reject
hard link to a symlink, device or FIFO                     neutralise: a copy of the target
                                                           (own inode), warn
same path twice in one layer                               last one wins, as with tar; warn
root entry (``./``) that is not a directory                reject
contiguous file (type ``7``), any unknown type flag        reject as unsupported
GNU/PAX sparse file                                        accepted: ``tarfile`` expands it
symlink with an empty target                               reject
whiteout of ``''``, ``.``, ``..``; a name below a          reject
``.wh.*`` directory
AUFS metadata (``.wh..wh.plnk`` and what is below it)      skip, warn (Docker skips them too)
whiteout of a path that does not exist                     no-op
a stream that is not a tar                                 reject, once it is read to the
                                                           end (see merge_layers)
=========================================================  ==================================
"""

from __future__ import annotations

import logging
import stat
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import BinaryIO, Generic, TypeVar

from bootseer.errors import BootseerError

log = logging.getLogger(__name__)

T = TypeVar("T")

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
AUFS_PREFIX = ".wh..wh."  # AUFS bookkeeping (hard link directory, ...), not a whiteout
_XATTR_PREFIX = "SCHILY.xattr."
_IMPLICIT_DIR_MODE = 0o755


class UnsafeLayerError(BootseerError):
    """A layer tar holds an entry we refuse to apply; the message names layer and entry."""


class Kind(str, Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    HARDLINK = "hardlink"  # a regular file that shares its inode with ``link_target``
    CHAR = "char"
    BLOCK = "block"
    FIFO = "fifo"


#: A kind's file type bits (``stat.S_IF*``), for ``st_mode``.
FILE_TYPE = {
    Kind.FILE: stat.S_IFREG, Kind.HARDLINK: stat.S_IFREG, Kind.DIR: stat.S_IFDIR,
    Kind.SYMLINK: stat.S_IFLNK, Kind.CHAR: stat.S_IFCHR, Kind.BLOCK: stat.S_IFBLK,
    Kind.FIFO: stat.S_IFIFO,
}


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One path of the merged root filesystem, with what ``stat`` would report for it."""

    path: str  # absolute inside the image: "/", "/etc", "/etc/passwd"
    kind: Kind
    mode: int  # permission bits, setuid/setgid/sticky included; no file type bits
    uid: int
    gid: int
    size: int = 0  # content bytes for files; target length for symlinks; 0 otherwise
    mtime: float = 0.0
    link_target: str | None = None  # symlink: verbatim; hard link: the group's FILE path
    xattrs: Mapping[str, bytes] = field(default_factory=dict)
    devmajor: int = 0
    devminor: int = 0
    content: T | None = None  # what store_content returned (files and hard links)
    ino: int = 0  # inode number, shared by a hard link group; the root is 1
    nlink: int = 1  # hard link group size; for a directory 2 + its subdirectories

    @property
    def st_mode(self) -> int:
        """File type and permission bits, as ``os.lstat`` would report them."""
        return FILE_TYPE[self.kind] | self.mode


@dataclass(frozen=True)
class RootfsIndex(Generic[T]):
    """The merged root filesystem: every path, in tree order (a directory before its
    contents, siblings by name), so walks and serialisations are deterministic."""

    entries: Mapping[str, Entry[T]]
    children: Mapping[str, tuple[str, ...]]  # directory path → sorted child names
    hardlink_groups: Mapping[int, tuple[str, ...]]  # ino → paths, for groups of 2 or more

    def __getitem__(self, path: str) -> Entry[T]:
        return self.entries[path]

    def __contains__(self, path: object) -> bool:
        return path in self.entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, path: str) -> Entry[T] | None:
        return self.entries.get(path)

    def listdir(self, path: str) -> tuple[str, ...]:
        """Names in directory ``path`` (``KeyError`` if it is not a directory)."""
        return self.children[path]


def merge_layers(layers: Iterable[tuple[str, BinaryIO]],
                 store_content: Callable[[str, BinaryIO, int], T]) -> RootfsIndex[T]:
    """Apply ``(name, decompressed tar stream)`` layers, base first, into one index.

    ``store_content(path, fileobj, size)`` is called for every regular file of every layer
    (also ones a later layer deletes) while the stream is positioned at its bytes; what it
    returns is kept as the entry's ``content``. The name is only used in messages.

    A layer we refuse is read to its end before :class:`UnsafeLayerError` is raised, so a
    stream that verifies its digest at the end reports a corrupt blob as such instead.
    """
    merger: _Merger[T] = _Merger(store_content)
    for number, (name, stream) in enumerate(layers):
        merger.apply(number, name, stream)
    return merger.finish()


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def _join(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}"


def _tree_key(path: str) -> tuple[str, ...]:
    return () if path == "/" else tuple(path[1:].split("/"))


class _Merger(Generic[T]):
    """The merge state; one instance per :func:`merge_layers` call."""

    def __init__(self, store_content: Callable[[str, BinaryIO, int], T]) -> None:
        self._store = store_content
        self._entries: dict[str, Entry[T]] = {}
        self._origin: dict[str, int] = {}  # path → number of the layer that last wrote it
        self._inode: dict[str, int] = {}  # path → internal inode id; hard links share one
        self._kids: dict[str, set[str]] = {}  # directory → child paths
        self._next_inode = 0
        self._put("/", Entry("/", Kind.DIR, _IMPLICIT_DIR_MODE, 0, 0), -1)

    def apply(self, number: int, name: str, stream: BinaryIO) -> None:
        layer = _Layer(number, name)
        try:
            try:
                tar = tarfile.open(fileobj=stream, mode="r|", errors="surrogateescape")
                while (member := tar.next()) is not None:
                    self._apply_member(layer, tar, member)
                    tar.members.clear()  # stream mode would otherwise keep every header
            except (tarfile.TarError, EOFError) as e:
                raise UnsafeLayerError(f"layer {name}: not a valid tar stream: {e}") from e
        except UnsafeLayerError:
            # Garbage may be corruption: a stream that checks its digest at its end (as
            # image_source's do) gets to report that instead, once it has been read.
            while stream.read(1 << 20):
                pass
            raise

    def _apply_member(self, layer: _Layer, tar: tarfile.TarFile,
                      member: tarfile.TarInfo) -> None:
        path = layer.normalise(member.name, member.name)
        *parents, base = _tree_key(path) or ("",)
        if any(c.startswith(AUFS_PREFIX) for c in parents):
            log.warning("layer %s: skipping AUFS metadata %s", layer.name, member.name)
            return
        if any(c.startswith(WHITEOUT_PREFIX) for c in parents):
            raise layer.error(member.name, "a path below a whiteout name")
        if base.startswith(WHITEOUT_PREFIX):
            self._whiteout(layer, member.name, path, base)
            return
        if path == "/" and not member.isdir():
            raise layer.error(member.name, "the root must be a directory")
        self._make_parents(layer, member.name, path)
        inode = None
        if member.islnk():
            entry, inode = self._hardlink(layer, member, path)
        else:
            entry = self._entry(layer, tar, member, path)
        if path in layer.seen:
            log.warning("layer %s: %s appears twice; the later entry wins", layer.name,
                        member.name)
        layer.seen.add(path)
        self._put(path, entry, layer.number, inode)

    def _entry(self, layer: _Layer, tar: tarfile.TarFile, member: tarfile.TarInfo,
               path: str) -> Entry[T]:
        xattrs = {key[len(_XATTR_PREFIX):]: value.encode("utf-8", "surrogateescape")
                  for key, value in member.pax_headers.items()
                  if key.startswith(_XATTR_PREFIX)}
        common = dict(path=path, mode=member.mode & 0o7777, uid=member.uid, gid=member.gid,
                      mtime=member.mtime, xattrs=xattrs)
        if member.type == tarfile.CONTTYPE:
            raise layer.error(member.name, "contiguous files are not supported")
        if member.isreg():
            fileobj = tar.extractfile(member)
            assert fileobj is not None  # a regular member always has a file object
            content = self._store(path, fileobj, member.size)
            return Entry(kind=Kind.FILE, size=member.size, content=content, **common)
        if member.isdir():
            return Entry(kind=Kind.DIR, **common)
        if member.issym():
            if not member.linkname:
                raise layer.error(member.name, "symlink with an empty target")
            common["mode"] = 0o777
            size = len(member.linkname.encode("utf-8", "surrogateescape"))
            return Entry(kind=Kind.SYMLINK, size=size, link_target=member.linkname, **common)
        if member.ischr() or member.isblk():
            return Entry(kind=Kind.CHAR if member.ischr() else Kind.BLOCK,
                         devmajor=member.devmajor, devminor=member.devminor, **common)
        if member.isfifo():
            return Entry(kind=Kind.FIFO, **common)
        raise layer.error(member.name, f"unsupported tar entry type {member.type!r}")

    def _hardlink(self, layer: _Layer, member: tarfile.TarInfo,
                  path: str) -> tuple[Entry[T], int | None]:
        """A hard link is its target's inode under a second name (tar applies none of the
        link header's own metadata): the entry, and the inode to share (if any)."""
        target_path = layer.normalise(member.linkname, member.name)
        target = self._entries.get(target_path)
        if target is None:
            raise layer.error(member.name, f"hard link to {target_path}, which does not exist "
                                           "(hard links are never followed through symlinks)")
        if target_path == path:
            raise layer.error(member.name, "hard link to itself")
        if target.kind is Kind.DIR:
            raise layer.error(member.name, f"hard link to directory {target_path}")
        if target.kind is not Kind.FILE:
            log.warning("layer %s: %s is a hard link to %s %s; storing a copy instead",
                        layer.name, member.name, target.kind.value, target_path)
            return replace(target, path=path), None
        return replace(target, path=path), self._inode[target_path]

    def _whiteout(self, layer: _Layer, raw_name: str, path: str, base: str) -> None:
        directory = _parent(path)
        if base == OPAQUE_MARKER:
            self._make_parents(layer, raw_name, path)
            self._hide_lower(list(self._kids[directory]), layer.number)
            return
        hidden = base[len(WHITEOUT_PREFIX):]
        if base.startswith(AUFS_PREFIX):
            log.warning("layer %s: skipping AUFS metadata %s", layer.name, raw_name)
            return
        if hidden in ("", ".", ".."):
            raise layer.error(raw_name, f"whiteout of {hidden!r}")
        self._make_parents(layer, raw_name, path)
        target = _join(directory, hidden)
        if target in self._entries:
            self._hide_lower([target], layer.number)

    def _make_parents(self, layer: _Layer, raw_name: str, path: str) -> None:
        """Check that every parent of ``path`` is a real directory; create missing ones."""
        parts = _tree_key(path)
        for depth in range(1, len(parts)):
            parent = "/" + "/".join(parts[:depth])
            entry = self._entries.get(parent)
            if entry is None:
                self._put(parent, Entry(parent, Kind.DIR, _IMPLICIT_DIR_MODE, 0, 0),
                          layer.number)
            elif entry.kind is Kind.SYMLINK:
                raise layer.error(raw_name, f"its parent {parent} is a symlink (to "
                                            f"{entry.link_target}); refusing to write through it")
            elif entry.kind is not Kind.DIR:
                raise layer.error(raw_name, f"its parent {parent} is a {entry.kind.value}, "
                                            "not a directory")

    def _put(self, path: str, entry: Entry[T], layer: int, inode: int | None = None) -> None:
        old = self._entries.get(path)
        if old is not None and not (old.kind is Kind.DIR and entry.kind is Kind.DIR):
            self._remove_subtree(path)
        if path != "/":
            self._kids[_parent(path)].add(path)
        if entry.kind is Kind.DIR:
            self._kids.setdefault(path, set())
        if inode is None:
            self._next_inode += 1
            inode = self._next_inode
        self._entries[path] = entry
        self._origin[path] = layer
        self._inode[path] = inode

    def _subtree(self, roots: list[str]) -> list[str]:
        """``roots`` and everything below them, each directory before its contents."""
        order: list[str] = []
        stack = list(roots)
        while stack:  # iterative: a hostile layer can nest thousands of levels deep
            path = stack.pop()
            order.append(path)
            stack.extend(self._kids.get(path, ()))
        return order

    def _remove_subtree(self, path: str) -> None:
        for victim in reversed(self._subtree([path])):
            self._drop(victim)

    def _hide_lower(self, roots: list[str], layer: int) -> None:
        """Remove lower-layer entries at and below ``roots``, keeping this layer's entries;
        the lower directories that lead to them lose their lower-layer metadata."""
        keep: set[str] = set()
        for path in reversed(self._subtree(roots)):  # contents before their directory
            if path in keep and self._origin[path] != layer:
                self._entries[path] = Entry(path, Kind.DIR, _IMPLICIT_DIR_MODE, 0, 0)
                self._origin[path] = layer
            if self._origin[path] == layer:
                keep.add(_parent(path))
            else:
                self._drop(path)

    def _drop(self, path: str) -> None:
        del self._entries[path], self._origin[path], self._inode[path]
        self._kids.pop(path, None)
        self._kids[_parent(path)].discard(path)

    def finish(self) -> RootfsIndex[T]:
        paths = sorted(self._entries, key=_tree_key)
        groups: dict[int, list[str]] = {}
        for path in paths:
            if self._entries[path].kind is Kind.FILE:
                groups.setdefault(self._inode[path], []).append(path)
        ino_of: dict[int, int] = {}
        entries: dict[str, Entry[T]] = {}
        for path in paths:
            entry = self._entries[path]
            ino = ino_of.setdefault(self._inode[path], len(ino_of) + 1)
            if entry.kind is Kind.DIR:
                subdirs = sum(self._entries[k].kind is Kind.DIR for k in self._kids[path])
                entry = replace(entry, ino=ino, nlink=2 + subdirs)
            elif entry.kind is Kind.FILE:
                group = groups[self._inode[path]]
                first = group[0]
                entry = replace(entry, ino=ino, nlink=len(group),
                                kind=Kind.FILE if path == first else Kind.HARDLINK,
                                link_target=None if path == first else first)
            else:
                entry = replace(entry, ino=ino)
            entries[path] = entry
        children = {path: tuple(sorted(k.rsplit("/", 1)[1] for k in kids))
                    for path, kids in sorted(self._kids.items(), key=lambda i: _tree_key(i[0]))}
        hardlinks = {entries[g[0]].ino: tuple(g) for g in groups.values() if len(g) > 1}
        return RootfsIndex(entries, children, hardlinks)


@dataclass
class _Layer:
    """What the merge remembers about the layer being applied."""

    number: int
    name: str
    seen: set[str] = field(default_factory=set)
    warned_absolute: bool = False

    def normalise(self, name: str, member: str) -> str:
        """A tar name → an absolute path in the image ("/" for the root)."""
        if name.startswith("/") and not self.warned_absolute:
            log.warning("layer %s: absolute name %s (and maybe more): stripping the leading "
                        "'/', as tar does", self.name, name)
            self.warned_absolute = True
        parts = [c for c in name.split("/") if c not in ("", ".")]
        if ".." in parts:
            raise self.error(member, f"'..' in {name!r} would leave the image root")
        return "/" + "/".join(parts)

    def error(self, member: str, problem: str) -> UnsafeLayerError:
        return UnsafeLayerError(f"layer {self.name}: entry {member!r}: {problem}")

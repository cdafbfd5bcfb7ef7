"""Turn a root filesystem on disk into OCI layer tars: a full layer, or the diff of two states.

A Dockerfile ``RUN`` step makes a layer out of what the step changed. We do the same
without a snapshotting file system: :func:`snapshot` records what ``lstat`` says about
every path of a tree (not following symlinks), the step runs, a second snapshot is taken,
and :func:`diff` lists what the layer must carry:

* paths that are new, or whose type, permissions, owner, size, mtime, ctime, inode, link
  target, device number or xattrs changed. ctime catches in-place metadata changes and a
  new hard link to an old file (the link count is inode metadata), inode catches a file
  replaced by rename (what dpkg does);
* for every path that disappeared, a whiteout ``.wh.NAME`` in its parent — only for the
  topmost one: a deleted directory needs one whiteout, not one per file;
* the parent directories of all of these, so the tar also reads well with plain ``tar -x``.

:func:`write_layer` streams the chosen paths into a gzip-compressed PAX tar, hashing the
compressed bytes (the blob digest) and the tar itself (the config's ``diff_id``) as they
are written. Entries keep mode bits (setuid included), numeric uid/gid (no user or group
names: the host's names mean nothing for the image), mtimes in whole seconds, symlink
targets verbatim, device numbers, FIFOs and ``SCHILY.xattr.*`` records. Regular files that
share an inode are written once, then as hard-link entries to that first name. Sockets
cannot be stored in a tar and are left out (logged).
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import stat
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

WHITEOUT_PREFIX = ".wh."
GZIP_LEVEL = 6  # gzip's own default: ~3x smaller than the tar, at tens of MB/s per core


@dataclass(frozen=True)
class FileState:
    """What ``lstat`` (plus ``readlink`` and ``listxattr``) said about one path."""

    mode: int  # st_mode: file type and permission bits
    uid: int
    gid: int
    size: int
    mtime_ns: int
    ctime_ns: int
    dev: int
    ino: int
    nlink: int
    rdev: int
    link_target: str | None  # symlinks only
    xattrs: tuple[tuple[str, bytes], ...]

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    def same_as(self, other: FileState) -> bool:
        """Whether a layer may leave this path out (``other`` is the older state).

        A directory is compared on its own metadata only: its contents are compared path
        by path, and adding or removing an entry changes its mtime anyway.
        """
        if self.is_dir and other.is_dir:
            return (self.mode, self.uid, self.gid, self.mtime_ns, self.xattrs) == (
                other.mode, other.uid, other.gid, other.mtime_ns, other.xattrs)
        return self == other


# Relative path (``"etc/passwd"``, as ``os.fsdecode`` gives it) → its state. The root of
# the tree itself is not a member.
Snapshot = Mapping[str, FileState]


def snapshot(root: Path) -> dict[str, FileState]:
    """Every path below ``root``, parents before children, siblings sorted by name."""
    states: dict[str, FileState] = {}
    pending = [""]
    while pending:  # iterative: no recursion limit on deep trees
        rel = pending.pop()
        with os.scandir(root / rel if rel else root) as it:
            names = [e.name for e in it]
        for name in names:
            child = f"{rel}/{name}" if rel else name
            states[child] = _state(root / child)
            if states[child].is_dir:
                pending.append(child)
    return _tree_order(states)


def _tree_order(states: Mapping[str, FileState]) -> dict[str, FileState]:
    return {path: states[path] for path in sorted(states, key=_key)}


def _key(path: str) -> tuple[str, ...]:
    return tuple(path.split("/"))


def _state(path: Path) -> FileState:
    st = os.lstat(path)
    target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    return FileState(
        mode=st.st_mode, uid=st.st_uid, gid=st.st_gid,
        size=st.st_size if stat.S_ISREG(st.st_mode) else 0,
        mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, dev=st.st_dev, ino=st.st_ino,
        nlink=st.st_nlink, rdev=st.st_rdev, link_target=target, xattrs=_xattrs(path))


def _xattrs(path: Path) -> tuple[tuple[str, bytes], ...]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:  # a file system without xattrs
        return ()
    return tuple(sorted((name, os.getxattr(path, name, follow_symlinks=False))
                        for name in names))


@dataclass(frozen=True)
class Change:
    """One entry of a layer: a path to copy from the tree, or a whiteout of a path."""

    path: str  # relative, e.g. "usr/bin/python3"
    whiteout: bool = False

    @property
    def arcname(self) -> str:
        """The name in the tar: the path itself, or ``dir/.wh.NAME`` for a whiteout."""
        if not self.whiteout:
            return self.path
        parent, _, name = self.path.rpartition("/")
        return f"{parent}/{WHITEOUT_PREFIX}{name}" if parent else f"{WHITEOUT_PREFIX}{name}"


def full(after: Snapshot) -> list[Change]:
    """The changes of a base layer: everything."""
    return [Change(path) for path in after]


def diff(before: Snapshot, after: Snapshot) -> list[Change]:
    """What a layer on top of ``before`` must hold so that the result is ``after``."""
    changed = {path for path, state in after.items()
               if path not in before or not state.same_as(before[path])}
    deleted = set()
    for path in before:
        if path in after:
            # Still there, maybe as another type: a new entry replaces the old one and all
            # that was below it, with no whiteout (a directory that became a file).
            continue
        parent = path.rpartition("/")[0]
        if parent == "" or (parent in after and after[parent].is_dir and before[parent].is_dir):
            deleted.add(path)  # topmost: its parent is still there
    for path in list(changed) + list(deleted):
        parent = path.rpartition("/")[0]
        while parent and parent not in changed:
            changed.add(parent)  # it exists in `after`: the parent of a kept or deleted path
            parent = parent.rpartition("/")[0]
    changes = [Change(p) for p in changed] + [Change(p, whiteout=True) for p in deleted]
    return sorted(changes, key=lambda c: _key(c.arcname))


@dataclass(frozen=True)
class LayerBlob:
    """A layer written to disk: what the manifest and the config need to know about it."""

    path: Path  # the gzip-compressed tar
    digest: str  # sha256 of the compressed blob
    size: int  # bytes of the compressed blob
    diff_id: str  # sha256 of the uncompressed tar
    tar_size: int  # bytes of the uncompressed tar
    entries: int  # tar members, whiteouts included
    whiteouts: int
    content_bytes: int  # regular-file bytes stored (hard links counted once)


class _HashingWriter:
    """A write-only stream that hashes and counts what passes through to ``sink``."""

    def __init__(self, sink) -> None:
        self._sink = sink
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.size += len(data)
        self._sink.write(data)
        return len(data)

    def flush(self) -> None:
        self._sink.flush()


def write_layer(root: Path, changes: Iterable[Change], states: Snapshot, out: Path) -> LayerBlob:
    """Write ``changes`` (read from the tree ``root``, described by ``states``) to ``out``."""
    entries = whiteouts = content = 0
    first_name: dict[tuple[int, int], str] = {}  # (dev, ino) → first name in this layer
    with open(out, "wb") as raw_file:
        blob = _HashingWriter(raw_file)
        with gzip.GzipFile(fileobj=blob, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as gz:
            tar_stream = _HashingWriter(gz)
            with tarfile.open(fileobj=tar_stream, mode="w|", format=tarfile.PAX_FORMAT,
                              encoding="utf-8", errors="surrogateescape") as tar:
                for change in changes:
                    if change.whiteout:
                        tar.addfile(_whiteout_info(change.arcname))
                        entries += 1
                        whiteouts += 1
                        continue
                    state = states[change.path]
                    info = _tarinfo(change.path, state, first_name)
                    if info is None:
                        continue
                    if info.isreg():
                        with open(root / change.path, "rb") as f:
                            tar.addfile(info, f)
                        content += info.size
                    else:
                        tar.addfile(info)
                    entries += 1
    return LayerBlob(out, "sha256:" + blob.sha256.hexdigest(), blob.size,
                     "sha256:" + tar_stream.sha256.hexdigest(), tar_stream.size, entries,
                     whiteouts, content)


def _whiteout_info(arcname: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(arcname)
    info.mode = 0o644
    return info


def _tarinfo(path: str, state: FileState,
             first_name: dict[tuple[int, int], str]) -> tarfile.TarInfo | None:
    info = tarfile.TarInfo(path)
    info.mode = stat.S_IMODE(state.mode)
    info.uid, info.gid = state.uid, state.gid
    info.uname = info.gname = ""
    info.mtime = state.mtime_ns // 1_000_000_000
    info.pax_headers = {f"SCHILY.xattr.{name}": value.decode("utf-8", "surrogateescape")
                        for name, value in state.xattrs}
    mode = state.mode
    if stat.S_ISREG(mode):
        inode = (state.dev, state.ino)
        if state.nlink > 1 and inode in first_name:
            info.type, info.linkname = tarfile.LNKTYPE, first_name[inode]
            return info
        if state.nlink > 1:
            first_name[inode] = path
        info.type, info.size = tarfile.REGTYPE, state.size
    elif stat.S_ISDIR(mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(mode):
        info.type, info.linkname = tarfile.SYMTYPE, state.link_target or ""
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        info.type = tarfile.CHRTYPE if stat.S_ISCHR(mode) else tarfile.BLKTYPE
        info.devmajor, info.devminor = os.major(state.rdev), os.minor(state.rdev)
    elif stat.S_ISFIFO(mode):
        info.type = tarfile.FIFOTYPE
    else:
        log.warning("leaving %s out of the layer: a socket cannot be stored in a tar", path)
        return None
    return info


def tree_bytes(states: Snapshot) -> int:
    """Bytes of regular-file content in a snapshot, each hard-linked inode counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for state in states.values():
        if stat.S_ISREG(state.mode) and (state.dev, state.ino) not in seen:
            seen.add((state.dev, state.ino))
            total += state.size
    return total

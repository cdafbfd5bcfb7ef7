"""What a command changed under its targets: an ``lstat`` walk before, one after, a diff.

An entry changed when its type, mode, owner, size, mtime, ctime, inode or symlink target
differ. ctime catches what the others can miss (content rewritten in place within the same
mtime, a new hard link to an old file: both names share the inode's ctime, so a group is
captured whole). Sockets, FIFOs and devices are not environment content: skipped, with a
warning. A deletion is recorded only at its top-most path.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Node:
    kind: str  # "file", "dir" or "symlink"
    mode: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    ctime_ns: int
    dev: int
    ino: int
    nlink: int
    link: str | None = None


Tree = dict[str, Node]  # path relative to the target ("." for the target) -> Node


def _node(path: str, st: os.stat_result) -> Node | None:
    if stat.S_ISREG(st.st_mode):
        kind, link = "file", None
    elif stat.S_ISDIR(st.st_mode):
        kind, link = "dir", None
    elif stat.S_ISLNK(st.st_mode):
        kind, link = "symlink", os.readlink(path)
    else:
        log.warning("%s: not a file, directory or symlink; left out of the snapshot", path)
        return None
    return Node(kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                st.st_size if kind == "file" else 0, st.st_mtime_ns, st.st_ctime_ns,
                st.st_dev, st.st_ino, st.st_nlink, link)


def scan(root: Path) -> Tree:
    """Every entry under ``root`` in tree order (a directory before its contents); {} if
    ``root`` does not exist."""
    tree: Tree = {}
    try:
        top = _node(str(root), os.lstat(root))
    except FileNotFoundError:
        return tree
    if top is None or top.kind != "dir":
        raise NotADirectoryError(20, "a snapshot target must be a directory", str(root))
    tree["."] = top

    def walk(directory: str, rel: str) -> None:
        with os.scandir(directory) as it:
            names = sorted(e.name for e in it)
        for name in names:
            path = os.path.join(directory, name)
            node = _node(path, os.lstat(path))
            if node is None:
                continue
            child = f"{rel}/{name}" if rel else name
            tree[child] = node
            if node.kind == "dir":
                walk(path, child)

    walk(str(root), "")
    return tree


@dataclass(frozen=True)
class TreeDiff:
    changed: list[str]  # new or modified, tree order
    deleted: list[str]  # top-most deleted paths


def diff(before: Tree, after: Tree) -> TreeDiff:
    changed = [rel for rel, node in after.items() if before.get(rel) != node]
    gone = {rel for rel in before if rel not in after}
    deleted = [rel for rel in before if rel in gone and _parent_is_dir(rel, gone, after)]
    return TreeDiff(changed, deleted)


def _parent_is_dir(rel: str, gone: set[str], after: Tree) -> bool:
    """Record a deletion only where its parent survives as a directory: below a deleted
    parent it is implied, below one that became a file or symlink replacing that entry
    removes it (and deleting through the new symlink would be refused on restore)."""
    parent = rel.rpartition("/")[0] or "."
    return parent not in gone and after[parent].kind == "dir"

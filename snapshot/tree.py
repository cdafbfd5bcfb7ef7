"""A snapshot unpacked once per node, read-only, for every restore on the node to mount.

A restore writes every file of an environment again, whatever the node holds: from shards
staged on the node it still decompresses and writes the whole tree (bench-env: 3.9 s for
the full preset, 8.5 s for the CUDA one), about what ``tar -x`` of the tree costs. So root
unpacks a snapshot once, into the node's snapshot cache, as an overlayfs *layer*: its
targets at their absolute paths below the layer's root (``tree/opt/venv/...``), what it
changed as files, directories, links, and what it deleted as whiteouts. A restore then
mounts that layer over each target (:mod:`bootseer.snapshot.mount`): ready in the time
of a mount, whatever the environment's size.

* **It is node cache.** The tree is an entry of the snapshot cache
  (:meth:`~bootseer.nodecache.NodeCache.add_tree`), counted against its one limit with
  the shards and evicted least recently used first, but never while an overlay reads it.
* **Verified before first use.** It is unpacked by the restore's own staging (every shard
  checked against the manifest's digest at its end, every file against its size, every
  path against the manifest's rules, nothing written through a link) into a temporary
  directory named by the builder's pid, and renamed into the cache only once complete: a
  crash leaves a temporary that the cache sweeps once that process is dead, never an entry.
* **Root's.** Only root builds trees (files keep the snapshot's owners); an entry is a
  0700 directory, reached only through the overlays root mounts (``nosuid,nodev``), whose
  writes go to a private upper layer.

A tree is named by the snapshot's key (a key names one snapshot for good: publishing is
create-only), and holds the snapshot as captured: a relocated restore extracts as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bootseer.errors import BootseerError
from bootseer.nodecache import TREE, NodeCache
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.manifest import Manifest, UnsafeSnapshotError
from bootseer.snapshot.restore import FirstShards, crash_point, remove_tree, stage_layer
from bootseer.store import BlobStore

log = logging.getLogger(__name__)

_TAG = b"bootseer-env-tree/1\0"
#: Beside a tree's files in its cache entry: what a mount needs of the snapshot.
RECORD = "record.json"
_PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID
Attributes = tuple[int, int, int, int]  # mode, uid, gid, mtime_ns


@dataclass(frozen=True)
class TreeRecord:
    """What mounting a tree needs of its snapshot, written beside it when it is built (so
    a mount decodes no manifest: 0.34 s for 36,000 entries), root's like the tree."""

    key: str
    targets: tuple[str, ...]
    files: int  # entries that are not directories
    bytes: int  # content bytes
    #: Per target: the directories the tree holds that the snapshot did not change (the
    #: parents of files changed in place, :func:`~bootseer.snapshot.restore.stage_layer`),
    #: parents first; a mount gives them the target's own attributes.
    made: tuple[tuple[str, ...], ...]
    #: Per target: the attributes the snapshot gives the target itself (``"."``, if it
    #: captured it) and the directories it changed between the target and those.
    captured: tuple[dict[str, Attributes], ...]

    @classmethod
    def of(cls, manifest: Manifest, made: list[list[str]]) -> TreeRecord:
        captured = []
        for number, rels in enumerate(made):
            dirs = {e.path: e for e in manifest.entries
                    if e.target == number and e.kind == "dir"}
            wanted = {"."} | {p for rel in rels for p in _parents(rel)}
            captured.append({rel: (e.mode, e.uid, e.gid, e.mtime_ns)
                             for rel, e in dirs.items() if rel in wanted})
        return cls(manifest.key, manifest.targets,
                   sum(1 for e in manifest.entries if e.kind != "dir"),
                   manifest.content_bytes, tuple(tuple(m) for m in made), tuple(captured))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def load(cls, path: Path) -> TreeRecord:
        try:
            body = json.loads(path.read_text())
            return cls(str(body["key"]), tuple(body["targets"]), int(body["files"]),
                       int(body["bytes"]), tuple(tuple(m) for m in body["made"]),
                       tuple({rel: tuple(a) for rel, a in c.items()}
                             for c in body["captured"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BootseerError(f"{path} is damaged: {exc}") from exc


def _parents(rel: str) -> list[str]:
    """``a/b/c`` -> ``a/b``, ``a``."""
    out = []
    while "/" in rel:
        rel = rel.rpartition("/")[0]
        out.append(rel)
    return out


def _refuse_privileges(manifest: Manifest) -> None:
    """A tree is shared by every restore of the node: one with a setuid or setgid file
    (never part of a Python environment) is refused before anything is unpacked."""
    for entry in manifest.entries:
        if entry.kind == "file" and entry.mode & _PRIVILEGE_BITS:
            raise UnsafeSnapshotError(f"snapshot {manifest.key}: {entry.path} is setuid or "
                                      "setgid; a node-wide tree holds no such file")


class EnvTree:
    """Snapshot ``key``'s unpacked tree in the node's snapshot cache ``cache``."""

    def __init__(self, cache: NodeCache, key: str) -> None:
        self.cache, self.key = cache, key
        self.entry = hashlib.sha256(_TAG + key.encode()).hexdigest()

    def find(self) -> Path | None:
        """The tree's root (its targets below it at their absolute paths), marked used;
        None if it is not on the node."""
        return self.cache.tree(self.entry)

    def layer(self, root: Path, target: str) -> Path:
        """Where target ``target``'s layer lies in the tree rooted at ``root``."""
        return root / target.lstrip("/")

    def record(self, root: Path) -> TreeRecord:
        """What mounting the tree rooted at ``root`` needs of its snapshot."""
        return TreeRecord.load(root.parent / RECORD)

    def build(self, blobs: BlobStore, manifest: Manifest, *,
              options: SnapshotOptions | None = None,
              on_progress: Callable[[int], None] | None = None,
              first: FirstShards | None = None) -> Path:
        """Unpack the snapshot (shards from the cache where a warm staged them, else from
        the store) and add it to the cache; its root. Root only. A build of the same tree
        under way (a warm's, beside a start that needs the tree) is waited for, not
        repeated."""
        if os.geteuid() != 0:
            raise BootseerError("only root unpacks a snapshot's tree (its files keep the "
                                "snapshot's owners)")
        found = self.find()
        if found is not None:
            return found
        _refuse_privileges(manifest)
        with self.cache.building(self.entry):  # one unpacking per node at a time
            found = self.find()
            if found is not None:
                return found
            tmp = self.cache.new_temporary(self.entry)
            os.mkdir(tmp, 0o700)
            try:
                os.mkdir(tmp / TREE, 0o755)
                made = stage_layer(blobs, manifest, str(tmp / TREE), options=options,
                                   on_progress=on_progress, cache=self.cache, first=first)
                TreeRecord.of(manifest, made).save(tmp / RECORD)
                crash_point("unpacked")
                self.cache.add_tree(tmp, self.entry, manifest.content_bytes)
            finally:
                remove_tree(str(tmp))  # only if it did not go in
        found = self.find()
        if found is None:
            raise BootseerError(f"snapshot {manifest.key}: its tree was evicted as soon as "
                                "it was added (the snapshot cache is too small for it)")
        return found

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

import hashlib
import json
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path

from bootseer.errors import BootseerError
from bootseer.nodecache import TREE, NodeCache
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.manifest import Manifest, UnsafeSnapshotError
from bootseer.snapshot.restore import FirstShards, crash_point, remove_tree, stage_layer
from bootseer.store import BlobStore

log = logging.getLogger(__name__)

_TAG = b"bootseer-env-tree/1\0"
#: Beside a tree's files in its cache entry: the directories it made (:meth:`made_parents`).
PARENTS = "parents.json"
_PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID


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

    def made_parents(self, root: Path) -> list[list[str]]:
        """Per target, the directories the tree holds that the snapshot did not change
        (:func:`~bootseer.snapshot.restore.stage_layer`): a mount gives them the target's
        own attributes."""
        made = json.loads((root.parent / PARENTS).read_text())
        if not (isinstance(made, list) and all(isinstance(m, list) for m in made)):
            raise BootseerError(f"{root.parent / PARENTS} is damaged")
        return made

    def build(self, blobs: BlobStore, manifest: Manifest, *,
              options: SnapshotOptions | None = None,
              on_progress: Callable[[int], None] | None = None,
              first: FirstShards | None = None) -> Path:
        """Unpack the snapshot (shards from the cache where a warm staged them, else from
        the store) and add it to the cache; its root. Root only."""
        if os.geteuid() != 0:
            raise BootseerError("only root unpacks a snapshot's tree (its files keep the "
                                "snapshot's owners)")
        found = self.find()
        if found is not None:
            return found
        _refuse_privileges(manifest)
        tmp = self.cache.new_temporary(self.entry)
        os.mkdir(tmp, 0o700)
        try:
            os.mkdir(tmp / TREE, 0o755)
            made = stage_layer(blobs, manifest, str(tmp / TREE), options=options,
                               on_progress=on_progress, cache=self.cache, first=first)
            (tmp / PARENTS).write_text(json.dumps(made))
            crash_point("unpacked")
            self.cache.add_tree(tmp, self.entry, manifest.content_bytes)
        finally:
            remove_tree(str(tmp))  # only if it did not go in
        found = self.find()
        if found is None:
            raise BootseerError(f"snapshot {manifest.key}: its tree was evicted as soon as "
                                "it was added (the snapshot cache is too small for it)")
        return found

"""A container's environments: the snapshots it names, mounted in its root over the image.

A container that names snapshots (``io.bootseer.envs=KEY,...`` or ``BOOTSEER_ENVS``) gets
each one's tree (:mod:`bootseer.snapshot.tree`: unpacked once per node, by ``bootseer warm
--env`` ahead of time, else here) as a lower layer of its root, above the image: every
target of the snapshot at its path, what the snapshot deleted hidden, the rest of the
image as it is. Containers on the node share each tree; their writes go to their own
upper layers, like every write to their root. Nothing is extracted and nothing is
written per container but the few directories whose attributes must be the image's
(:func:`bootseer.snapshot.mount.upper_dirs`). In the container, ``BOOTSEER_ENVS_MOUNTED``
(:data:`bootseer.snapshot.run.MOUNTED_ENVS`) names the snapshots, and ``bootseer env
run`` of one of them runs nothing.

The agent holds the trees in use through the container's overlay, which names them: the
snapshot cache evicts no tree an overlay reads, and after an agent restart the adopted
overlay still names them.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from bootseer.errors import BootseerError
from bootseer.nodecache import NodeCache
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.mount import make_dirs, upper_dirs
from bootseer.snapshot.restore import load_manifest
from bootseer.snapshot.tree import Attributes, EnvTree
from bootseer.store import BlobStore

log = logging.getLogger(__name__)


def layers(keys: tuple[str, ...], blobs: BlobStore, cache: NodeCache,
           options: SnapshotOptions, image: Path, upper: Path) -> list[Path]:
    """The trees of snapshots ``keys`` (the first one on top), unpacked here if the node
    lacks one, and ``upper``'s directories that keep the image's attributes (``image``:
    the image as it lies under them)."""
    roots = []
    for key in keys:
        tree = EnvTree(cache, key)
        root = tree.find()
        if root is None:
            log.info("snapshot %s is not unpacked on this node: unpacking it for a start "
                     "(warm --env does it ahead)", key)
            try:
                manifest = load_manifest(blobs, key, cache)
            except FileNotFoundError as exc:  # the store has no such snapshot
                raise BootseerError(str(exc)) from exc
            root = tree.build(blobs, manifest, options=options)
        record = tree.record(root)
        wanted: dict[str, Attributes] = {}
        for number, target in enumerate(record.targets):
            top = target.strip("/")
            wanted.update(_image_parents(image, top))
            for rel, attributes in upper_dirs(record.captured[number], record.made[number],
                                              image / top).items():
                if rel == ".":
                    rel = top or "."
                elif top:
                    rel = f"{top}/{rel}"
                wanted[rel] = attributes
        make_dirs(upper, wanted)
        roots.append(root)
    return roots


def _image_parents(image: Path, top: str) -> dict[str, Attributes]:
    """The image's directories above a target, with their attributes (the tree holds
    plain ones there): those the image has."""
    found: dict[str, Attributes] = {}
    parts = top.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        rel = "/".join(parts[:depth])
        try:
            st = os.lstat(image / rel)
        except FileNotFoundError:
            break
        if not stat.S_ISDIR(st.st_mode):
            raise BootseerError(f"/{rel} is not a directory in the image: a snapshot "
                                "cannot be mounted below it")
        found[rel] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns)
    return found

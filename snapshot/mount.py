"""A restore as a mount: each target an overlay over the snapshot's node-local tree.

With the snapshot unpacked on the node (:mod:`bootseer.snapshot.tree`: ``bootseer warm
--env`` as root, or the first restore here), restoring it writes nothing: each target
``T`` becomes an overlay mount whose layers are, from the top, a private writable upper
layer, the tree's layer for ``T`` and ``T`` as it was; so the target shows what the
snapshot changed over what it holds, whiteouts hiding what it deleted, exactly what an
extraction would leave, in the time of one mount whatever the environment's size. A job
that writes into its environment writes into its own upper layer
(``<cache_dir>/envs/<hash of T>/``, root's, fresh at every restore), never the tree
another restore on the node mounts.

Every restore mounts afresh: the environment mounted at ``T`` before, if any, is unmounted
and its writes dropped (an extraction, too, puts back every file the snapshot holds);
``T`` shows its own directory for that moment. A mount at ``T`` that is not such an
environment is left alone and the restore refused. ``bootseer env unmount``
gives a target back (its directory as it was before the first mount).

Only root mounts, and only a restore where the snapshot was captured (a relocated one
rewrites files, so it extracts as before). :func:`restore_here` chooses: where a mount
cannot serve (not root, relocation, nested targets, a tree larger than the cache, no
overlayfs), the restore extracts, as before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from bootseer.errors import BootseerError
from bootseer.mounts import OverlayMount, mount_overlay, overlay_at, unmount
from bootseer.nodecache import NodeCache, NotCached
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.manifest import Manifest, SnapEntry, UnsafeSnapshotError
from bootseer.snapshot.restore import (
    FirstShards,
    RestoreResult,
    locked_targets,
    recover,
    remove_tree,
    restore,
)
from bootseer.snapshot.tree import EnvTree
from bootseer.store import BlobStore

log = logging.getLogger(__name__)


class MountUnavailable(BootseerError):
    """This restore cannot be a mount here; it extracts instead."""


class MountFailed(BootseerError):
    """mount(8) refused one target's overlay."""


def mounts_dir(cache: NodeCache) -> Path:
    """Where the mounts' private layers live: ``envs`` beside the snapshot cache."""
    return cache.directory.parent / "envs"


def restore_here(blobs: BlobStore, manifest: Manifest, *, cache: NodeCache | None,
                 options: SnapshotOptions, targets: tuple[str, ...] | None = None,
                 relocate: bool = False, on_progress: Callable[[int], None] | None = None,
                 first: FirstShards | None = None) -> RestoreResult:
    """Restore ``manifest``: as a mount where one can serve (see the module docstring),
    else by extraction (:func:`bootseer.snapshot.restore.restore`)."""
    if cache is not None and options.mount:
        try:
            why = _cannot_mount(manifest, cache, targets)
            if why is not None:
                raise MountUnavailable(why)
            return mount_restore(blobs, manifest, cache, options=options,
                                 on_progress=on_progress, first=first)
        except MountUnavailable as exc:
            log.info("snapshot %s: extracting, not mounting: %s", manifest.key, exc)
    return restore(blobs, manifest, targets=targets, relocate=relocate, options=options,
                   on_progress=on_progress, cache=cache, first=first)


#: CAP_SYS_ADMIN's bit in /proc/self/status's CapEff: what mounting takes.
_CAP_SYS_ADMIN = 21


def _cannot_mount(manifest: Manifest, cache: NodeCache,
                  targets: tuple[str, ...] | None) -> str | None:
    if os.geteuid() != 0 or not _may_mount():
        return "only root with CAP_SYS_ADMIN mounts (not a container's root, say)"
    if targets is not None and tuple(os.path.normpath(t) for t in targets) != \
            manifest.targets:
        return "restoring elsewhere than where it was captured"
    if manifest.content_bytes > cache.max_bytes * cache.low_water:
        return (f"its {manifest.content_bytes} bytes do not fit in the snapshot cache "
                f"({cache.max_bytes} bytes)")
    for target in manifest.targets:
        if any(other != target and other.startswith(target.rstrip("/") + "/")
               for other in manifest.targets):
            return f"target {target} holds another target"
        if any(c in target for c in ",:\n"):
            return f"target {target} holds a character overlayfs options cannot carry"
    return None


def _may_mount() -> bool:
    with open("/proc/self/status") as status:
        caps = next((line.split()[1] for line in status if line.startswith("CapEff:")), "0")
    return bool(int(caps, 16) >> _CAP_SYS_ADMIN & 1)


def mount_restore(blobs: BlobStore, manifest: Manifest, cache: NodeCache, *,
                  options: SnapshotOptions | None = None,
                  on_progress: Callable[[int], None] | None = None,
                  first: FirstShards | None = None) -> RestoreResult:
    """Mount the snapshot's tree at each of its targets, unpacking it first if the node
    does not have it (``MountUnavailable`` if that cannot be done here)."""
    started = time.monotonic()
    tree = EnvTree(cache, manifest.key)
    root = tree.find()
    read = 0 if root is not None else len(manifest.shards)
    try:
        root = root or tree.build(blobs, manifest, options=options,
                                  on_progress=on_progress, first=first)
    except NotCached as exc:
        raise MountUnavailable(f"the snapshot cache has no room for its tree: {exc}") from exc
    states, made = mounts_dir(cache), tree.made_parents(root)
    with locked_targets(manifest.targets):
        for number, target in enumerate(manifest.targets):
            try:
                _mount_target(manifest, number, tree.layer(root, target), made[number],
                              Path(target), states)
            except MountFailed as exc:  # all targets or none: the extraction does them all
                for done in manifest.targets[:number]:
                    unmount(Path(done))
                    remove_tree(str(_state(states, Path(done))))
                raise MountUnavailable(str(exc)) from exc
    files = sum(1 for e in manifest.entries if e.kind != "dir")
    return RestoreResult(manifest.key, manifest.targets, files, manifest.content_bytes,
                         read, time.monotonic() - started, mounted=True)


def _mount_target(manifest: Manifest, number: int, layer: Path, made: list[str],
                  target: Path, states: Path) -> None:
    current = overlay_at(target)
    if current is not None:
        if not _ours(current, states):
            raise BootseerError(f"{target} is an overlay mount that is not a Bootseer "
                                f"environment; unmount it or restore elsewhere")
        unmount(target)  # a restore gives the snapshot afresh: the last mount's writes go
    elif os.path.ismount(target):
        raise BootseerError(f"{target} is a mount point; unmount it or restore elsewhere")
    recover(str(target))  # what a crashed extraction left beside it
    if os.path.lexists(target) and (target.is_symlink() or not target.is_dir()):
        raise BootseerError(f"{target} exists and is not a directory")
    target.mkdir(parents=True, exist_ok=True)
    state = _state(states, target)
    remove_tree(str(state))
    states.mkdir(mode=0o700, parents=True, exist_ok=True)
    state.mkdir(mode=0o700)
    upper = state / "upper"
    _upper_dirs(manifest, number, made, target, upper)
    try:
        mount_overlay([layer, target], upper, state / "work", target)
    except BootseerError as exc:
        remove_tree(str(state))
        raise MountFailed(str(exc)) from exc


def _upper_dirs(manifest: Manifest, number: int, made: list[str], target: Path,
                upper: Path) -> None:
    """The upper layer's directories, made before the mount: an overlay's directory shows
    the attributes of its top layer's, so each gets what an extraction leaves there. The
    root: the snapshot's, if it captured the target, else the target's own. The tree's
    directories the snapshot did not change (parents of files changed in place): the
    target's, where each must be a real directory (as a restore requires), with their
    parents the snapshot changed in between."""
    dirs = {e.path: e for e in manifest.entries if e.target == number and e.kind == "dir"}
    wanted: dict[str, tuple[int, int, int, int]] = {}
    for rel in [".", *made]:
        path = target if rel == "." else target / rel
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise BootseerError(f"{path} is missing: this target does not match the state "
                                "the snapshot was captured on") from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeSnapshotError(f"{path} is a symlink here; restoring below it would "
                                      "write outside the target")
        if not stat.S_ISDIR(st.st_mode):
            raise BootseerError(f"{path} is not a directory here")
        own = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns)
        wanted[rel] = own if rel not in dirs else _attributes(dirs[rel])
        parent = rel.rpartition("/")[0]
        while parent and parent not in wanted:  # changed by the snapshot: its attributes
            wanted[parent] = _attributes(dirs[parent])
            parent = parent.rpartition("/")[0]
    upper.mkdir(mode=0o700)
    for rel in sorted(wanted, key=lambda r: (r != ".", r.count("/"))):
        if rel != ".":
            (upper / rel).mkdir(mode=0o700)
    for rel in sorted(wanted, key=lambda r: (r != ".", r.count("/")), reverse=True):
        mode, uid, gid, mtime_ns = wanted[rel]
        path = upper if rel == "." else upper / rel
        os.chown(path, uid, gid)
        os.chmod(path, mode)
        os.utime(path, ns=(mtime_ns, mtime_ns))


def _attributes(entry: SnapEntry) -> tuple[int, int, int, int]:
    return entry.mode, entry.uid, entry.gid, entry.mtime_ns


def _state(states: Path, target: Path) -> Path:
    return states / hashlib.sha256(os.fsencode(target)).hexdigest()[:32]


def _ours(mount: OverlayMount, states: Path) -> bool:
    return mount.upper is not None and Path(mount.upper).parent.parent == states


def unmount_env(cache: NodeCache, target: Path) -> bool:
    """Give ``target`` back: unmount the environment mounted there and drop its writes;
    False if none is (``BootseerError`` for a mount that is not one)."""
    states, target = mounts_dir(cache), Path(os.path.abspath(target))
    current = overlay_at(target)
    if current is None:
        return False
    if not _ours(current, states):
        raise BootseerError(f"{target} is an overlay mount that is not a Bootseer "
                            f"environment; not unmounting it")
    with locked_targets((str(target),)):
        unmount(target)
        remove_tree(str(_state(states, target)))
    return True

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

Only root with ``CAP_SYS_ADMIN`` mounts (not a container's root: there, the node agent
lays the tree in the container's root, :mod:`bootseer.agents.envs`), and only where the
snapshot was captured (a relocated restore rewrites files, so it extracts as before). A
restore first tries :func:`mount_prestaged`, which reads the tree's record and no
manifest; else :func:`restore_here` unpacks the tree and mounts it, or, where a mount
cannot serve (not root, relocation, nested targets, a tree larger than the cache, no
overlayfs), extracts as before.
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
from bootseer.snapshot.manifest import Manifest, UnsafeSnapshotError
from bootseer.snapshot.restore import (
    FirstShards,
    RestoreResult,
    locked_targets,
    recover,
    remove_tree,
    restore,
)
from bootseer.snapshot.tree import Attributes, EnvTree, TreeRecord
from bootseer.store import BlobStore

log = logging.getLogger(__name__)


class MountUnavailable(BootseerError):
    """This restore cannot be a mount here; it extracts instead."""


class MountFailed(BootseerError):
    """mount(8) refused one target's overlay."""


def mounts_dir(cache: NodeCache) -> Path:
    """Where the mounts' private layers live: ``envs`` beside the snapshot cache."""
    return cache.directory.parent / "envs"


def mount_prestaged(cache: NodeCache | None, key: str, options: SnapshotOptions,
                    targets: tuple[str, ...] | None = None) -> RestoreResult | None:
    """Restore snapshot ``key`` by mounting its tree if the node has it and a mount can
    serve here; None otherwise (the caller restores from the manifest). Reads no
    manifest: the tree's record has what a mount needs."""
    if cache is None or not options.mount:
        return None
    tree = EnvTree(cache, key)
    root = tree.find()
    if root is None:
        return None
    record = tree.record(root)
    why = _cannot_mount(record.targets, targets)
    if why is not None:
        log.info("snapshot %s: not mounting: %s", key, why)
        return None
    try:
        return _mount_all(tree, root, record, cache, shards_read=0,
                          started=time.monotonic())
    except MountUnavailable as exc:
        log.info("snapshot %s: not mounting: %s", key, exc)
        return None


def restore_here(blobs: BlobStore, manifest: Manifest, *, cache: NodeCache | None,
                 options: SnapshotOptions, targets: tuple[str, ...] | None = None,
                 relocate: bool = False, on_progress: Callable[[int], None] | None = None,
                 first: FirstShards | None = None) -> RestoreResult:
    """Restore ``manifest``: as a mount where one can serve (see the module docstring),
    unpacking its tree first, else by extraction
    (:func:`bootseer.snapshot.restore.restore`)."""
    if cache is not None and options.mount:
        try:
            why = _cannot_mount(manifest.targets, targets)
            if why is None and manifest.content_bytes > cache.max_bytes * cache.low_water:
                why = (f"its {manifest.content_bytes} bytes do not fit in the snapshot "
                       f"cache ({cache.max_bytes} bytes)")
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


def _cannot_mount(captured: tuple[str, ...], targets: tuple[str, ...] | None) -> str | None:
    """Why a snapshot captured under ``captured`` cannot be mounted at ``targets`` (None:
    where it was captured) here; None if it can."""
    if os.geteuid() != 0 or not _may_mount():
        return "only root with CAP_SYS_ADMIN mounts (not a container's root, say)"
    if targets is not None and tuple(os.path.normpath(t) for t in targets) != captured:
        return "restoring elsewhere than where it was captured"
    for target in captured:
        if any(other != target and other.startswith(target.rstrip("/") + "/")
               for other in captured):
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
    return _mount_all(tree, root, tree.record(root), cache, shards_read=read,
                      started=started)


def _mount_all(tree: EnvTree, root: Path, record: TreeRecord, cache: NodeCache, *,
               shards_read: int, started: float) -> RestoreResult:
    """Mount the tree at every target of its snapshot, or at none; its seconds counted
    from ``started``."""
    states = mounts_dir(cache)
    with locked_targets(record.targets):
        for number, target in enumerate(record.targets):
            try:
                _mount_target(tree.layer(root, target), record.captured[number],
                              record.made[number], Path(target), states)
            except MountFailed as exc:  # all targets or none: the extraction does them all
                for done in record.targets[:number]:
                    unmount(Path(done))
                    remove_tree(str(_state(states, Path(done))))
                raise MountUnavailable(str(exc)) from exc
    return RestoreResult(record.key, record.targets, record.files, record.bytes,
                         shards_read, time.monotonic() - started, mounted=True)


def _mount_target(layer: Path, captured: dict[str, Attributes], made: tuple[str, ...],
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
    wanted = upper_dirs(captured, made, target)  # refused before anything is made
    state = _state(states, target)
    remove_tree(str(state))
    states.mkdir(mode=0o700, parents=True, exist_ok=True)
    state.mkdir(mode=0o700)
    upper = state / "upper"
    make_dirs(upper, wanted)
    try:
        mount_overlay([layer, target], upper, state / "work", target)
    except BootseerError as exc:
        remove_tree(str(state))
        raise MountFailed(str(exc)) from exc


def upper_dirs(captured: dict[str, Attributes], made: tuple[str, ...],
               current: Path) -> dict[str, Attributes]:
    """The directories an upper layer must hold, made before the mount, for one target
    (relative to the target's root, ``"."`` the target itself), ``current`` where the
    target as it lies under the layer can be seen. An overlay's directory shows its top
    layer's attributes, so each gets what an extraction leaves there. The root: the
    snapshot's, if it captured the target (``captured``), else the target's own. The
    tree's directories the snapshot did not change (``made``: parents of files changed
    in place): the target's, where each must be a real directory (as a restore requires),
    with their parents the snapshot changed in between."""
    wanted: dict[str, Attributes] = {}
    for rel in [".", *made]:
        if rel in captured:
            wanted[rel] = captured[rel]
            continue
        st = _real_dir(current, rel)
        wanted[rel] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns)
        parent = rel.rpartition("/")[0]
        while parent and parent not in wanted and parent in captured:
            wanted[parent] = captured[parent]
            parent = parent.rpartition("/")[0]
    return wanted


def _real_dir(current: Path, rel: str) -> os.stat_result:
    """``current/rel``'s status, each of its components checked to be a real directory
    (as a restore checks a target's): never one looked up through a symlink, which may
    lead out of the target (out of the image, for a container's root)."""
    path = current
    for part in ["", *([] if rel == "." else rel.split("/"))]:
        path = path / part if part else path
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
    return st


def make_dirs(root: Path, wanted: dict[str, Attributes]) -> None:
    """Make ``wanted``'s directories below ``root`` (``"."``: ``root`` itself), parents
    first, and give each its attributes, children first (making a child changes its
    parent's mtime)."""
    for rel in sorted(wanted, key=lambda r: (r != ".", r.count("/"))):
        os.makedirs(root if rel == "." else root / rel, mode=0o700, exist_ok=True)
    for rel in sorted(wanted, key=lambda r: (r != ".", r.count("/")), reverse=True):
        mode, uid, gid, mtime_ns = wanted[rel]
        path = root if rel == "." else root / rel
        os.chown(path, uid, gid)
        os.chmod(path, mode)
        os.utime(path, ns=(mtime_ns, mtime_ns))


def _state(states: Path, target: Path) -> Path:
    return states / hashlib.sha256(os.fsencode(target)).hexdigest()[:32]


def _ours(mount: OverlayMount, states: Path) -> bool:
    return mount.upper is not None and Path(mount.upper).parent.parent == states.resolve()


def unmount_env(cache: NodeCache, target: Path) -> bool:
    """Give ``target`` back: unmount the environment mounted there and drop its writes;
    False if none is (``BootseerError`` for a mount that is not one)."""
    states, target = mounts_dir(cache), Path(os.path.abspath(target))
    current = overlay_at(target)
    if current is None:
        return False
    if current.upper is None or not _ours(current, states):
        raise BootseerError(f"{target} is an overlay mount that is not a Bootseer "
                            f"environment; not unmounting it")
    with locked_targets((str(target),)):
        unmount(target)
        remove_tree(str(Path(current.upper).parent))  # its state: upper and work
    return True

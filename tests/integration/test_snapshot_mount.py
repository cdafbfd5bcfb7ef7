"""A restore as root mounts the snapshot, unpacked once on the node: what it shows equals
what an extraction writes (every kind of change), writes stay in the mount's own layer,
a prestaged snapshot mounts with no store and no extraction, and the tree is node cache:
counted, never evicted while mounted, never trusted half-built, refused when hostile.

Real overlayfs mounts, as root; the CLI as a user runs it where the flow is the user's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.ci import require
from support.snapshots import (
    based_targets,
    bootseer,
    capture,
    published_venv,
    remove_target,
    reset,
    tree_state,
)

from bootseer.errors import IntegrityError
from bootseer.mounts import overlay_at, overlays_reading
from bootseer.nodecache import CacheFull, NodeCache
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.manifest import UnsafeSnapshotError
from bootseer.snapshot.mount import mount_restore, unmount_env
from bootseer.snapshot.restore import CRASH_ENV, load_manifest, restore, stage_layer
from bootseer.snapshot.run import capture_command
from bootseer.snapshot.tree import EnvTree
from bootseer.store import BlobStore, open_store

ANSWER = "import tiny; print(tiny.ANSWER)"


@pytest.fixture(autouse=True)
def _root() -> None:
    require(None if os.geteuid() == 0 else "needs root", "mounting environments")


def _cache(tmp_path: Path, limit: int = 1 << 30) -> NodeCache:
    return NodeCache(tmp_path / "cache" / "snapshots", limit, in_use=overlays_reading)


def _python(venv: Path) -> str:
    run = subprocess.run([str(venv / "bin" / "python"), "-c", ANSWER], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def _fresh_node(tmp_path: Path) -> tuple[str, Path, tuple[str, ...], dict, dict[str, str]]:
    """A venv published by ``env run``, its state, then removed as on a fresh node whose
    cache is ``tmp_path/cache``: (key, venv, the run's arguments, state, environment)."""
    key, venv, run = published_venv(tmp_path)
    installed = tree_state(venv)
    remove_target(venv)
    return key, venv, run, installed, {"BOOTSEER_CACHE_DIR": str(tmp_path / "cache")}


def test_a_mount_shows_what_an_extraction_writes_for_every_kind_of_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two targets with a base each; a command changes everything a command can (new,
    modified in place, mode, mtime, deleted files and trees, symlinks, hard links, a file
    that became a directory and a directory a link, a read-only directory). Mounted over
    the base, each target equals the extraction over the same base, attribute for
    attribute (the parents of files changed in place included)."""
    blobs, targets = based_targets(tmp_path, monkeypatch)
    capture(blobs, targets)
    extracted = {t: tree_state(t) for t in targets}
    reset(targets)
    base = {t: tree_state(t) for t in targets}
    cache = _cache(tmp_path)
    result = mount_restore(blobs, load_manifest(blobs, "k1"), cache)
    tree = EnvTree(cache, "k1")
    assert tree.record(tree.find()).made == (("untouched",), ("untouched",))
    try:
        assert result.mounted and all(overlay_at(t) is not None for t in targets)
        mounted = {t: tree_state(t) for t in targets}
    finally:
        for target in targets:
            assert unmount_env(cache, target)
    assert {t: tree_state(t) for t in targets} == base  # unmounted: the base, untouched
    assert mounted == extracted
    restore(blobs, load_manifest(blobs, "k1"))
    assert {t: tree_state(t) for t in targets} == extracted


def test_a_restore_as_root_mounts_and_writes_stay_in_the_mounts_own_layer(
        tmp_path: Path) -> None:
    key, venv, run, installed, env = _fresh_node(tmp_path)
    restored = bootseer(*run, store=tmp_path / "store", env=env)
    assert "mounted the node's tree" in restored.stderr and "not run" in restored.stderr
    assert overlay_at(venv) is not None and tree_state(venv) == installed
    assert _python(venv) == "42"
    (module,) = venv.glob("lib/python*/site-packages/tiny/__init__.py")
    module.write_text("ANSWER = 7\n")
    (venv / "mine").write_text("mine")
    assert _python(venv) == "7"
    tree = EnvTree(_cache(tmp_path), key).find()
    assert tree is not None
    shared = tree / module.relative_to("/")
    assert shared.read_text() == "ANSWER = 42\n"  # the node's tree never changes
    assert not (tree / venv.relative_to("/") / "mine").exists()
    bootseer("env", "restore", key, store=tmp_path / "store", env=env)  # afresh
    assert _python(venv) == "42" and not (venv / "mine").exists()
    assert tree_state(venv) == installed
    bootseer("env", "unmount", str(venv), store=tmp_path / "store", env=env)
    assert overlay_at(venv) is None and list(venv.iterdir()) == []  # as before: empty
    assert not list((tmp_path / "cache" / "envs").iterdir())  # its writes are gone


def test_a_prestaged_snapshot_mounts_with_no_store_and_no_extraction(tmp_path: Path) -> None:
    """``warm --env`` as root unpacks the tree; the restore then reads nothing (the store
    is gone) and writes no file: it mounts."""
    key, venv, run = published_venv(tmp_path)
    installed = tree_state(venv)
    store, env = tmp_path / "store", {"BOOTSEER_CACHE_DIR": str(tmp_path / "cache")}
    warmed = json.loads(bootseer("warm", "--json", "--env", key, store=store, env=env).stdout)
    (part,) = warmed["envs"]
    assert part["tree"] is True and part["complete"]
    remove_target(venv)
    store.rename(tmp_path / "store-gone")
    restored = bootseer(*run, store=store, env=env)
    assert "mounted the node's tree" in restored.stderr
    assert tree_state(venv) == installed and _python(venv) == "42"
    unmount_env(_cache(tmp_path), venv)


def test_the_tree_is_counted_and_never_evicted_while_mounted(tmp_path: Path) -> None:
    key, venv, run, _, env = _fresh_node(tmp_path)
    bootseer(*run, store=tmp_path / "store", env=env)
    cache = _cache(tmp_path)
    tree = EnvTree(cache, key)
    entry = cache.path(tree.entry)
    counted = int((entry / "size").read_text())
    assert counted > 0 and cache.usage() >= counted
    small = _cache(tmp_path, limit=cache.usage() + 1000)
    with pytest.raises(CacheFull):  # only evicting the mounted tree would make room
        small.put("ab" * 32, b"x" * 5000)
    assert tree.find() is not None and _python(venv) == "42"
    unmount_env(cache, venv)
    small.put("ab" * 32, b"x" * 5000)  # unmounted: it goes, and the entry goes in
    assert tree.find() is None and not entry.exists()


def test_a_crash_mid_unpack_leaves_nothing_trusted_and_the_next_restore_recovers(
        tmp_path: Path) -> None:
    key, venv, run, installed, env = _fresh_node(tmp_path)
    crashed = bootseer(*run, store=tmp_path / "store", check=False,
                       env={**env, CRASH_ENV: "unpacked"})
    assert crashed.returncode == -signal.SIGKILL
    cache = _cache(tmp_path)  # opening it sweeps the dead builder's temporary
    assert EnvTree(cache, key).find() is None and overlay_at(venv) is None
    assert not list((cache.directory / "tmp").iterdir())
    restored = bootseer(*run, store=tmp_path / "store", env=env)
    assert "mounted the node's tree" in restored.stderr and tree_state(venv) == installed
    unmount_env(cache, venv)


def test_two_builders_of_one_tree_unpack_it_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start's mount that needs the tree a warm is unpacking (two threads of the agent
    here; processes alike: the lock is a file's) waits for that build and gets its tree,
    instead of unpacking the snapshot again beside it."""
    key, venv, _, installed, _ = _fresh_node(tmp_path)
    blobs = BlobStore(open_store(f"file://{tmp_path / 'store'}"))
    manifest, cache = load_manifest(blobs, key), _cache(tmp_path)
    unpacked, first_in = [], threading.Event()

    def slow_stage_layer(*args, **kwargs):
        unpacked.append(threading.current_thread().name)
        first_in.set()
        time.sleep(0.5)  # the second builder arrives while this one unpacks
        return stage_layer(*args, **kwargs)

    monkeypatch.setattr("bootseer.snapshot.tree.stage_layer", slow_stage_layer)
    roots: dict[str, Path] = {}

    def build(name: str) -> None:
        roots[name] = EnvTree(_cache(tmp_path), key).build(blobs, manifest)

    warm = threading.Thread(target=build, args=("warm",), name="warm")
    warm.start()
    assert first_in.wait(30)
    build("start")
    warm.join(60)
    assert unpacked == ["warm"] and roots["start"] == roots["warm"]
    assert EnvTree(cache, key).find() == roots["warm"]
    mount_restore(blobs, manifest, cache)
    assert tree_state(venv) == installed and _python(venv) == "42"
    unmount_env(cache, venv)


def test_a_setuid_file_or_a_lying_shard_builds_no_tree(tmp_path: Path) -> None:
    """A setuid file is refused before anything is unpacked; a shard whose file is not the
    size the manifest says fails the unpack, and leaves neither an entry nor a temporary."""
    store, target = tmp_path / "store", tmp_path / "t"
    blobs = BlobStore(open_store(f"file://{store}"))
    setuid = f"mkdir -p {target} && cp /bin/true {target}/t && chmod 4755 {target}/t"
    assert capture_command(blobs, "suid", ["sh", "-c", setuid], [target],
                           environ=os.environ, options=SnapshotOptions()).published
    cache = _cache(tmp_path)
    with pytest.raises(UnsafeSnapshotError, match="setuid"):
        mount_restore(blobs, load_manifest(blobs, "suid"), cache)
    lying = f"mkdir -p {tmp_path}/u && echo hello > {tmp_path}/u/f"
    assert capture_command(blobs, "lies", ["sh", "-c", lying], [tmp_path / "u"],
                           environ=os.environ, options=SnapshotOptions()).published
    manifest = load_manifest(blobs, "lies")
    (entry,) = [e for e in manifest.entries if e.path == "f"]
    forged = dataclasses.replace(manifest, entries=tuple(
        e._replace(size=99) if e is entry else e for e in manifest.entries))
    with pytest.raises(IntegrityError):
        mount_restore(blobs, forged, cache)
    assert not list((cache.directory / "tmp").iterdir())
    assert EnvTree(cache, "suid").find() is None and EnvTree(cache, "lies").find() is None
    assert overlay_at(target) is None and overlay_at(tmp_path / "u") is None


def test_a_parent_that_became_a_symlink_is_refused_before_anything_is_mounted(
        tmp_path: Path) -> None:
    """A file changed in place below ``d`` leaves ``d`` for the target to provide. Where
    ``d`` is now a symlink out of the target, the mount is refused (as an extraction
    refuses it) and nothing outside is looked up or changed."""
    store, target, outside = tmp_path / "store", tmp_path / "t", tmp_path / "outside"
    blobs = BlobStore(open_store(f"file://{store}"))
    (target / "d" / "e").mkdir(parents=True)
    (target / "d" / "e" / "f").write_text("before\n")
    os.utime(target / "d" / "e", ns=(1, 1))
    change = f"echo after > {target}/d/e/f"  # in place: d and d/e do not change
    assert capture_command(blobs, "inplace", ["sh", "-c", change], [target],
                           environ=os.environ, options=SnapshotOptions()).published
    (outside / "e").mkdir(parents=True)
    subprocess.run(["rm", "-rf", str(target / "d")], check=True)
    (target / "d").symlink_to(outside)
    cache = _cache(tmp_path)
    with pytest.raises(UnsafeSnapshotError, match="symlink"):
        mount_restore(blobs, load_manifest(blobs, "inplace"), cache)
    assert overlay_at(target) is None and sorted(os.listdir(outside)) == ["e"]
    assert not (tmp_path / "cache" / "envs").exists() or \
        not list((tmp_path / "cache" / "envs").iterdir())
    assert EnvTree(cache, "inplace").record(EnvTree(cache, "inplace").find()).made == (
        ("d", "d/e"),)

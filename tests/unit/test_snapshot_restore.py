"""Capture, pack and restore on real trees: every change kind, byte-identical restores,
hostile and corrupt snapshots refused with nothing switched in, crashes mid-restore."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st
from support.snapshots import T0, based_targets, capture, reset, tree_state

from bootseer.errors import BootseerError, IntegrityError
from bootseer.snapshot import restore as restore_module
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.manifest import (
    FIRST_SHARDS,
    FORMAT_V1,
    REF_PREFIX,
    Manifest,
    Shard,
    SnapEntry,
    UnsafeSnapshotError,
)
from bootseer.snapshot.restore import CRASH_ENV, FirstShards, load_manifest, restore
from bootseer.store import BlobStore, open_store
from bootseer.store.blobs import STREAM_READ, STREAM_START, ChunkTable


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    return based_targets(tmp_path, monkeypatch)


def test_capture_records_every_kind_of_change(env) -> None:
    blobs, targets = env
    m = capture(blobs, targets[:1])
    kinds = {e.path: e.kind for e in m.entries}
    assert kinds["new.txt"] == "file" and kinds["empty"] == "file"
    assert {"keep/modified.txt", "keep/mode.txt", "keep/touched.txt"} <= kinds.keys()
    assert kinds["pkg/link"] == kinds["old-link"] == kinds["dir-to-link"] == "symlink"
    assert kinds["file-to-dir"] == "dir" and kinds["ro"] == "dir"
    links = {e.path: e.link for e in m.entries if e.kind == "hardlink"}
    # a group's first name in tree order leads it
    assert links == {"pkg/new-hardlink": "new.txt", "keep/same.txt": "keep/same-hardlink"}
    assert {d.path for d in m.deleted} == {"gone.txt", "gone-tree"}
    assert "pkg/sub/__pycache__" in kinds  # bytecode compiled before the snapshot
    assert len(m.shards) >= 2 and m.targets == (str(targets[0]),)
    assert "keep/same.txt" in kinds  # its ctime changed with the new hard link
    assert load_manifest(blobs, "k1") == m


def test_restore_is_byte_identical_and_idempotent(env) -> None:
    blobs, targets = env
    capture(blobs, targets)
    expected = {t: tree_state(t) for t in targets}
    reset(targets)
    result = restore(blobs, load_manifest(blobs, "k1"), options=SnapshotOptions(concurrency=3))
    assert {t: tree_state(t) for t in targets} == expected
    assert result.shards >= 2
    restore(blobs, load_manifest(blobs, "k1"))  # over its own result: nothing changes
    assert {t: tree_state(t) for t in targets} == expected
    # no staging or old trees are left behind, only the (empty) lock files
    leftovers = [p.name for p in targets[0].parent.iterdir()]
    assert sorted(leftovers) == [".a.bootseer-lock", ".b.bootseer-lock", "a", "b"]


def _spy_opens(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Every ``BlobStore.open``: the digest, and whether its first read began at once."""
    opened: list[tuple[str, bool]] = []
    real = BlobStore.open

    def spy(self, digest: str, *, start: bool = False):
        opened.append((digest, start))
        return real(self, digest, start=start)

    monkeypatch.setattr(BlobStore, "open", spy)
    return opened


def test_the_shards_a_reference_names_are_opened_before_the_manifest_is_decoded(
        env, monkeypatch) -> None:
    """The reference names the first shards a restore reads; it opens them, their first
    read begun, as soon as it has the manifest's bytes, and takes those streams instead of
    opening the shards again."""
    blobs, targets = env
    manifest = capture(blobs, targets)
    expected = {t: tree_state(t) for t in targets}
    in_order = [manifest.shards[n].digest for n in manifest.read_order()]
    assert len(in_order) > 2
    assert blobs.get_ref(REF_PREFIX + "k1").meta["first_shards"] == in_order[:FIRST_SHARDS]
    assert [manifest.shards[n].input_bytes for n in manifest.read_order()] == sorted(
        (s.input_bytes for s in manifest.shards), reverse=True)
    reset(targets)
    opened = _spy_opens(monkeypatch)
    opened_at_decode: list[int] = []
    decode = Manifest.decode

    def spy_decode(cls, data: bytes, origin: str) -> Manifest:
        opened_at_decode.append(len(opened))
        return decode(data, origin)

    monkeypatch.setattr(Manifest, "decode", classmethod(spy_decode))
    with FirstShards(2) as first:
        loaded = load_manifest(blobs, "k1", None, first)
        assert opened == [(d, True) for d in in_order[:2]] and opened_at_decode == [2]
        restore(blobs, loaded, options=SnapshotOptions(concurrency=2), first=first)
    assert {t: tree_state(t) for t in targets} == expected
    assert sorted(opened) == sorted((d, True) for d in in_order)  # each once, started


def test_each_shard_is_opened_before_a_thread_takes_it(env, monkeypatch) -> None:
    """The shards' streams are opened in read order, ``concurrency + OPEN_AHEAD`` ahead of
    the thread that extracts them, so the link fetches the next shards while files are
    written."""
    blobs, targets = env
    manifest = capture(blobs, targets)
    expected = {t: tree_state(t) for t in targets}
    in_order = [manifest.shards[n].digest for n in manifest.read_order()]
    depth = 2  # one thread, one more ahead: a window this snapshot's shards can show
    assert len(in_order) > depth + 1, "too few shards to see the window move"
    reset(targets)
    opened = _spy_opens(monkeypatch)
    at_take: list[list[str]] = []
    take = restore_module._ShardStreams.take

    def spy_take(self, digest: str):
        stream = take(self, digest)
        at_take.append([d for d, _ in opened])
        return stream

    monkeypatch.setattr(restore_module._ShardStreams, "take", spy_take)
    monkeypatch.setattr(restore_module, "OPEN_AHEAD", depth - 1)
    restore(blobs, manifest, options=SnapshotOptions(concurrency=1))
    assert {t: tree_state(t) for t in targets} == expected
    assert at_take == [in_order[: i + 1 + depth] for i in range(len(in_order))]
    assert opened == [(d, True) for d in in_order]


@pytest.mark.parametrize("hint", ["stranger", "not a list", "garbage"])
def test_first_shards_that_are_not_the_manifests_cost_one_read_each_and_change_nothing(
        env, monkeypatch, hint) -> None:
    """The ``first_shards`` hint is only a hint: whatever a reference names there (a large
    blob the manifest does not list, a digest not in the store, a path, a number), the
    restore is the manifest's, and a blob it names costs one read of its start at most."""
    blobs, targets = env
    manifest = capture(blobs, targets)
    expected = {t: tree_state(t) for t in targets}
    stranger = blobs.put(os.urandom(3 * STREAM_READ + 1)).digest
    names = {"stranger": [stranger, manifest.shards[0].digest],
             "not a list": stranger,
             "garbage": ["../../etc/passwd", 7, None, "sha256:" + "0" * 64, "sha256:xyz"]}
    ref = blobs.get_ref(REF_PREFIX + "k1")
    blobs.set_ref(ref.name, ref.digest, {**ref.meta, "first_shards": names[hint]})
    reset(targets)
    reads: list[tuple[int, int]] = []
    real_read = blobs.store.read_range_into

    def spy_read(key: str, offset: int, buffer: memoryview, *, progress=None) -> None:
        if key == BlobStore.blob_key(stranger):
            reads.append((offset, len(buffer)))
        real_read(key, offset, buffer, progress=progress)

    monkeypatch.setattr(blobs.store, "read_range_into", spy_read)
    with FirstShards(4) as first:
        restore(blobs, load_manifest(blobs, "k1", None, first), first=first)
    assert {t: tree_state(t) for t in targets} == expected
    assert reads in ([], [(0, STREAM_START)])  # none if the restore closed it first
    if hint != "stranger":
        assert reads == []


def test_a_corrupt_shard_opened_early_is_refused_like_any_other(env, tmp_path) -> None:
    blobs, targets = env
    manifest = capture(blobs, targets)
    reset(targets)
    before = {t: tree_state(t) for t in targets}
    first_digest = manifest.shards[manifest.read_order()[0]].digest
    path = _shard_file(tmp_path / "store", first_digest)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with FirstShards(4) as first, pytest.raises(IntegrityError, match=first_digest):
        restore(blobs, load_manifest(blobs, "k1", None, first), first=first)
    assert {t: tree_state(t) for t in targets} == before


def test_restoring_under_another_prefix_is_refused(env) -> None:
    blobs, targets = env
    m = capture(blobs, targets[:1])
    with pytest.raises(Exception, match="another prefix .* relocation"):
        restore(blobs, m, targets=(str(targets[1]),))


def _shard_file(store: Path, digest: str) -> Path:
    hexd = digest.removeprefix("sha256:")
    return store / "blobs" / "sha256" / hexd[:2] / hexd


@pytest.mark.parametrize("processes", [True, False], ids=["workers", "threads"])
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupt_shard_is_detected_and_nothing_is_switched_in(env, tmp_path, damage,
                                                                 processes,
                                                                 monkeypatch) -> None:
    monkeypatch.setattr(restore_module, "PROCESSES", processes)
    blobs, targets = env
    m = capture(blobs, targets)
    reset(targets)
    before = {t: tree_state(t) for t in targets}
    path = _shard_file(tmp_path / "store", m.shards[-1].digest)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="corrupt"):
        restore(blobs, load_manifest(blobs, "k1"))
    assert {t: tree_state(t) for t in targets} == before
    assert not [p for p in targets[0].parent.iterdir() if "bootseer-new" in p.name]


def test_a_restore_unpacks_in_forked_workers(env, monkeypatch) -> None:
    """One worker process per thread the restore would use; the tree is the same."""
    blobs, targets = env
    manifest = capture(blobs, targets)
    expected = {t: tree_state(t) for t in targets}
    reset(targets)
    forks: list[int] = []
    fork = os.fork

    def counted() -> int:
        pid = fork()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(restore_module.os, "fork", counted)
    restore(blobs, manifest, options=SnapshotOptions(concurrency=3))
    assert len(forks) == 3
    assert {t: tree_state(t) for t in targets} == expected


def test_a_layer_unpacked_by_workers_lists_the_parents_it_made_once(
        env, tmp_path, monkeypatch) -> None:
    """The parents a layer's stages make (for files changed in place in directories the
    snapshot did not change) come back from the workers, each once, as from threads."""
    from bootseer.snapshot.restore import stage_layer

    blobs, targets = env
    manifest = capture(blobs, targets)
    made = {}
    for processes in (False, True):
        monkeypatch.setattr(restore_module, "PROCESSES", processes)
        made[processes] = stage_layer(blobs, manifest, str(tmp_path / f"layer-{processes}"),
                                      options=SnapshotOptions(concurrency=2))
    assert made[True] == made[False] and any(made[True])
    assert all(len(parents) == len(set(parents)) for parents in made[True])


def test_a_worker_that_dies_fails_the_restore_and_nothing_is_switched_in(
        env, monkeypatch) -> None:
    blobs, targets = env
    manifest = capture(blobs, targets)
    reset(targets)
    before = {t: tree_state(t) for t in targets}
    monkeypatch.setattr(restore_module, "_extract_shard", lambda *args: os._exit(3))
    with pytest.raises(BootseerError, match="restore worker .* died"):
        restore(blobs, manifest, options=SnapshotOptions(concurrency=2))
    assert {t: tree_state(t) for t in targets} == before
    assert not [p for p in targets[0].parent.iterdir() if "bootseer-new" in p.name]


@pytest.mark.parametrize("cut", ["frame", "report"])
def test_a_worker_killed_midway_through_a_report_fails_the_restore_cleanly(
        env, monkeypatch, cut) -> None:
    """A worker killed while it writes a report (the parent kills every worker on the
    first error) leaves half a frame in its pipe: the restore fails with one clear error
    and no thread of the parent's dies with a traceback of its own."""
    blobs, targets = env
    manifest = capture(blobs, targets)
    reset(targets)
    before = {t: tree_state(t) for t in targets}

    def half_a_report(fd: int, message: object) -> None:
        data = pickle.dumps(message)
        os.write(fd, struct.pack("<i", len(data))[:2] if cut == "frame"
                 else struct.pack("<i", len(data)) + data[: len(data) // 2])
        os._exit(9)

    monkeypatch.setattr(restore_module, "_send", half_a_report)
    died: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    with pytest.raises(BootseerError, match="restore worker"):
        restore(blobs, manifest, options=SnapshotOptions(concurrency=2))
    assert not died, died[0].exc_value
    assert {t: tree_state(t) for t in targets} == before


def _tar_shard(blobs: BlobStore, members: list[tuple[tarfile.TarInfo, bytes]],
               cut: int | None = None) -> Shard:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data else None)
    packed = zstandard.ZstdCompressor().compress(raw.getvalue())[:cut]
    info = blobs.put(packed)
    return Shard(info.digest, info.size, 0)


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _entry(path: str, data: bytes, **kw) -> SnapEntry:
    fields = dict(target=0, path=path, kind="file", mode=0o644, uid=0, gid=0, mtime_ns=T0,
                  size=len(data), digest="sha256:" + hashlib.sha256(data).hexdigest(), shard=0)
    return SnapEntry(**(fields | kw))


def _publish(blobs: BlobStore, m: Manifest) -> None:
    blobs.set_ref(REF_PREFIX + m.key, blobs.put(m.encode()).digest)


def hostile_cases(target: str, outside: str, blobs: BlobStore):
    good = _tar_shard(blobs, [_file("0/ok", b"ok")])
    evil = _tar_shard(blobs, [_file("0/lnk/evil", b"evil")])
    escape = _tar_shard(blobs, [_file("0/ok", b"ok"), _file("0/../../evil", b"evil")])
    return {
        "dotdot": ([_entry("../evil", b"evil")], [], good, "'..'"),
        "absolute": ([_entry("/etc/evil", b"evil")], [], good, "absolute"),
        "below-own-symlink": ([_entry("lnk", b"", kind="symlink", link=outside, size=0,
                                      digest=None), _entry("lnk/evil", b"evil")], [], evil,
                              "below the symlink"),
        "below-existing-symlink": ([_entry("lnk/evil", b"evil")], [], evil, "is a symlink"),
        "delete-through-symlink": ([], [(0, "lnk/victim")], good, "is a symlink"),
        "hardlink-out": ([_entry("ok", b"ok"), _entry("h", b"", kind="hardlink",
                                                      link="../../etc/passwd", shard=None)],
                         [], good, "not a file of the snapshot"),
        "member-not-in-manifest": ([_entry("ok", b"ok")], [], escape,
                                   "does not place there"),
    }


@pytest.mark.parametrize("case", ["dotdot", "absolute", "below-own-symlink",
                                  "below-existing-symlink", "delete-through-symlink",
                                  "hardlink-out", "member-not-in-manifest"])
def test_hostile_snapshots_are_refused_and_write_nothing(tmp_path, case) -> None:
    from bootseer.snapshot.manifest import Deletion

    blobs = BlobStore(open_store(f"file://{tmp_path / 'store'}"))
    target, outside = tmp_path / "t", tmp_path / "outside"
    target.mkdir()
    outside.mkdir()
    (outside / "victim").write_text("victim")
    (target / "lnk").symlink_to(outside)
    entries, deleted, shard, message = hostile_cases(str(target), str(outside), blobs)[case]
    m = Manifest("evil", (str(target),), tuple(entries),
                 tuple(Deletion(t, p) for t, p in deleted), (shard,))
    _publish(blobs, m)
    before = tree_state(target)
    with pytest.raises(UnsafeSnapshotError, match=message):
        restore(blobs, load_manifest(blobs, "evil"))
    assert sorted(os.listdir(outside)) == ["victim"] and tree_state(target) == before
    assert not (tmp_path / "evil").exists()
    assert set(os.listdir(tmp_path)) - {".t.bootseer-lock"} == {"outside", "store", "t"}


@pytest.mark.parametrize("case", ["dotdot", "absolute", "below-own-symlink", "hardlink-out",
                                  "member-not-in-manifest"])
def test_hostile_snapshots_unpack_into_no_tree_and_write_nothing(tmp_path, case) -> None:
    """The node-wide tree (snapshot/tree.py) is unpacked by the same checks: a hostile
    snapshot is refused before, or as, its bad entry comes, and nothing lands outside."""
    from bootseer.snapshot.manifest import Deletion
    from bootseer.snapshot.restore import stage_layer

    blobs = BlobStore(open_store(f"file://{tmp_path / 'store'}"))
    target, outside, root = tmp_path / "t", tmp_path / "outside", tmp_path / "tree"
    outside.mkdir()
    root.mkdir()
    entries, deleted, shard, message = hostile_cases(str(target), str(outside), blobs)[case]
    m = Manifest("evil", (str(target),), tuple(entries),
                 tuple(Deletion(t, p) for t, p in deleted), (shard,))
    _publish(blobs, m)
    with pytest.raises(UnsafeSnapshotError, match=message):
        stage_layer(blobs, load_manifest(blobs, "evil"), str(root))
    assert os.listdir(outside) == [] and not (tmp_path / "evil").exists()
    assert set(os.listdir(tmp_path)) == {"outside", "store", "tree"}


def test_entries_below_a_non_directory_are_found_at_any_depth_and_neighbours_are_not() -> None:
    """The manifest check sorts paths: what lies below ``p`` sorts between ``p/`` and
    ``p0``; names that only sort near ``p`` (``p-x``, ``p.x``, ``p0``) are not below it."""
    def manifest(*entries: SnapEntry) -> Manifest:
        return Manifest("m", ("/t",), (_entry(".", b"", kind="dir", shard=None),
                                       *entries), (), (Shard("sha256:" + "0" * 64, 1, 1),))

    lnk = _entry("lnk", b"", kind="symlink", link="/elsewhere")
    with pytest.raises(UnsafeSnapshotError, match="'lnk/a/b' lies below the symlink 'lnk'"):
        manifest(lnk, _entry("lnk/a/b", b"x")).check("m")
    with pytest.raises(UnsafeSnapshotError, match="below the file 'f'"):
        manifest(_entry("f", b"x"), _entry("f/inner", b"y")).check("m")
    manifest(_entry("f", b"x"), _entry("f-x", b"x"), _entry("f.x", b"x"),
             _entry("f0", b"x"), _entry("fx", b"x"), lnk, _entry("lnk.d", b"", kind="dir",
                                                                 shard=None),
             _entry("lnk.d/a", b"x")).check("m")


def _checked(*entries: SnapEntry, deleted: tuple = ()) -> None:
    Manifest("m", ("/t",), (_entry(".", b"", kind="dir", shard=None), *entries), deleted,
             (Shard("sha256:" + "0" * 64, 1, 1),)).check("m")


@pytest.mark.parametrize(("entries", "message"), [
    ([_entry("a", b"x"), _entry("b", b"x", target=1)], "entry 'b' names no target"),
    ([_entry("a", b"x"), _entry("b", b"x", target=True)], "entry 'b' names no target"),
    ([_entry("a", b"x"), _entry("b", b"x", kind="fifo")], "entry 'b' has unknown type 'fifo'"),
    ([_entry("a", b"x"), _entry("b/../../c", b"x")], "'b/../../c' holds '..'"),
    ([_entry("a", b"x"), _entry("/etc/c", b"x")], "'/etc/c' is absolute"),
    ([_entry("a", b"x"), _entry("b\0c", b"x")], "holds NUL"),
    ([_entry("a", b"x"), _entry("b", b"x", shard=1)], "entry 'b' names no shard"),
    ([_entry("a", b"x"), _entry("b", b"x", shard=0.0)], "entry 'b' names no shard"),
    ([_entry("a", b"x"), _entry("b", b"x", shard=None)], "entry 'b' names no shard"),
    ([_entry("a", b"", kind="symlink", link="")], "symlink 'a' has no target"),
    ([_entry("a", b"x"), _entry("a", b"y")], "entry 'a' appears twice"),
    ([_entry("h", b"", kind="hardlink", link="d", shard=None),
      _entry("d", b"", kind="dir", shard=None)], "hard link 'h' points to 'd'"),
])
def test_each_rule_of_the_manifest_check_refuses_and_names_the_entry(entries, message) -> None:
    """Each rule is checked over all entries at once; a failing one names its entry."""
    with pytest.raises(UnsafeSnapshotError, match=message):
        _checked(*entries)


def test_a_target_captured_as_a_file_and_bad_deletions_are_refused() -> None:
    with pytest.raises(UnsafeSnapshotError, match="captured as a file"):
        Manifest("m", ("/t",), (_entry(".", b"x"),), (),
                 (Shard("sha256:" + "0" * 64, 1, 1),)).check("m")
    from bootseer.snapshot.manifest import Deletion
    for deletion, message in [(Deletion(1, "a"), "names no target"),
                              (Deletion(0, "a/../b"), "holds '..'"),
                              (Deletion(0, "."), "names a target itself")]:
        with pytest.raises(UnsafeSnapshotError, match=message):
            _checked(deleted=(deletion,))


COMPONENTS = st.sampled_from(["a", "b.c", ".", "..", "", "...", ".x", "\0", "/"])
PATHS = st.lists(COMPONENTS, min_size=1, max_size=3).map("/".join)


@given(st.lists(PATHS, min_size=1, max_size=4))
def test_the_joined_path_check_accepts_exactly_what_check_relpath_accepts(paths) -> None:
    from bootseer.snapshot.manifest import _all_relpaths, check_relpath

    def one_by_one() -> bool:
        try:
            for path in paths:
                check_relpath(path)
        except ValueError:
            return False
        return True

    assert _all_relpaths(paths) == one_by_one()


@pytest.mark.parametrize(("field", "message"), [
    ({"path": 7}, "path 7 is not a string"), ({"path": ["a"]}, "is not a string"),
    ({"target": [0]}, "names no target"), ({"kind": {}}, "malformed"),
    ({"shard": [0]}, "names no shard")])
def test_a_manifest_with_a_field_of_the_wrong_type_is_refused(field, message) -> None:
    good = Manifest("m", ("/t",), (_entry(".", b"", kind="dir", shard=None), _entry("a", b"x")),
                    (), (Shard("sha256:" + "0" * 64, 1, 1),))
    body = json.loads(zstandard.ZstdDecompressor().decompress(good.encode()))
    for name, value in field.items():
        body["entries"][name][1] = value
    data = zstandard.ZstdCompressor().compress(json.dumps(body).encode())
    with pytest.raises((IntegrityError, UnsafeSnapshotError), match=message):
        Manifest.decode(data, "m")


def _as_format_1(manifest: Manifest) -> bytes:
    """``manifest`` as the previous format wrote it: a list with an object per entry."""
    body = json.loads(zstandard.ZstdDecompressor().decompress(manifest.encode()))
    body["format"] = FORMAT_V1
    body["entries"] = [{k: v for k, v in e._asdict().items() if v is not None}
                       for e in manifest.entries]
    return zstandard.ZstdCompressor().compress(json.dumps(body).encode())


def test_a_snapshot_published_in_the_previous_format_restores(env) -> None:
    """Format 1's manifest (an object per entry) decodes to the same manifest and
    restores the same tree."""
    blobs, targets = env
    manifest = capture(blobs, targets)
    expected = {t: tree_state(t) for t in targets}
    old = _as_format_1(manifest)
    assert Manifest.decode(old, "k1") == manifest
    ref = blobs.get_ref(REF_PREFIX + "k1")
    blobs.set_ref(ref.name, blobs.put(old).digest, ref.meta)
    reset(targets)
    restore(blobs, load_manifest(blobs, "k1"))
    assert {t: tree_state(t) for t in targets} == expected


@pytest.mark.parametrize(("columns", "message"), [
    (lambda c: c | {"owner": c["uid"]}, "not columns named after their fields"),
    (lambda c: c | {"mode": c["mode"][:-1]}, "mode column is missing or not 2 long"),
    (lambda c: {k: v for k, v in c.items() if k != "kind"}, "kind column is missing"),
    (lambda c: c | {"path": "a"}, "target column is missing or not -1 long"),
    (lambda c: list(c), "not columns")])
def test_entries_that_are_not_equal_columns_are_refused(columns, message) -> None:
    good = Manifest("m", ("/t",), (_entry(".", b"", kind="dir", shard=None), _entry("a", b"x")),
                    (), (Shard("sha256:" + "0" * 64, 1, 1),))
    body = json.loads(zstandard.ZstdDecompressor().decompress(good.encode()))
    body["entries"] = columns(body["entries"])
    data = zstandard.ZstdCompressor().compress(json.dumps(body).encode())
    with pytest.raises(IntegrityError, match=message):
        Manifest.decode(data, "m")


def test_shards_carry_no_header_beyond_each_members_own(env) -> None:
    """A fractional mtime makes tarfile put a PAX header before every member; a restore
    takes the mtime from the manifest, so the shard carries whole seconds and no PAX."""
    blobs, targets = env
    manifest = capture(blobs, targets)
    headers = 0
    for shard in manifest.shards:
        with blobs.open(shard.digest) as raw, \
                zstandard.ZstdDecompressor().stream_reader(raw) as stream, \
                tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                headers += 1
                assert not member.pax_headers, member.name
    assert headers == sum(1 for e in manifest.entries if e.kind in ("file", "symlink"))


def test_a_shard_whose_stream_is_cut_is_refused(tmp_path) -> None:
    blobs = BlobStore(open_store(f"file://{tmp_path / 'store'}"))
    target = tmp_path / "t"
    data = os.urandom(200_000)
    cut = _tar_shard(blobs, [_file("0/f", data)], cut=5000)
    _publish(blobs, Manifest("cut", (str(target),), (_entry("f", data),), (), (cut,)))
    with pytest.raises(IntegrityError, match="truncated or corrupt"):
        restore(blobs, load_manifest(blobs, "cut"))
    assert not target.exists() and set(os.listdir(tmp_path)) == {".t.bootseer-lock", "store"}


def test_a_shard_replaced_in_the_store_with_a_matching_chunk_table_is_refused(tmp_path) -> None:
    """Whoever can write the store can replace a shard and write a chunk table that fits
    the new bytes (a table is checked for damage only): the shard's whole digest, checked
    at its end, refuses it, and nothing is switched in."""
    blobs = BlobStore(open_store(f"file://{tmp_path / 'store'}"))
    target = tmp_path / "t"
    data = os.urandom(200_000)
    shard = _tar_shard(blobs, [_file("0/f", data)])
    _publish(blobs, Manifest("k", (str(target),), (_entry("f", data),), (), (shard,)))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_file("0/f", data[::-1])[0], io.BytesIO(data[::-1]))  # same size
    forged = zstandard.ZstdCompressor().compress(raw.getvalue())
    _shard_file(tmp_path / "store", shard.digest).write_bytes(forged)
    table = ChunkTable(shard.digest, len(forged), blobs.chunk_size,
                       (hashlib.sha256(forged).digest(),))
    hexd = shard.digest.removeprefix("sha256:")
    (tmp_path / "store" / "chunks" / "sha256" / hexd[:2] / hexd).write_bytes(table.encode())
    blobs = BlobStore(open_store(f"file://{tmp_path / 'store'}"))  # no table cached
    assert blobs.read_range(shard.digest, 0, 10) == forged[:10]  # the table fits
    with pytest.raises(IntegrityError, match="replaced"):
        restore(blobs, load_manifest(blobs, "k"))
    assert not target.exists() and set(os.listdir(tmp_path)) == {".t.bootseer-lock", "store"}


RESTORE_SCRIPT = """
import sys
from bootseer.store import BlobStore, open_store
from bootseer.store.blobs import STREAM_READ, ChunkTable
from bootseer.snapshot.restore import load_manifest, restore
blobs = BlobStore(open_store(sys.argv[1]))
restore(blobs, load_manifest(blobs, "k1"))
"""


@pytest.mark.parametrize("point", ["staged", "exchanged", "switched-one"])
def test_a_restore_killed_midway_leaves_whole_states_and_a_retry_completes(env, tmp_path,
                                                                           point) -> None:
    blobs, targets = env
    capture(blobs, targets)
    restored = {t: tree_state(t) for t in targets}
    reset(targets)
    previous = {t: tree_state(t) for t in targets}
    killed = subprocess.run([sys.executable, "-c", RESTORE_SCRIPT, blobs.store.url],
                            env=os.environ | {CRASH_ENV: point}, timeout=60)
    assert killed.returncode == -9
    after_crash = {t: tree_state(t) for t in targets}
    expect = {"staged": [previous, previous], "exchanged": [restored, previous],
              "switched-one": [restored, previous]}[point]
    for number, t in enumerate(targets):
        assert after_crash[t] == expect[number][t], (point, t)
    restore(blobs, load_manifest(blobs, "k1"))
    assert {t: tree_state(t) for t in targets} == restored
    assert not [p for p in targets[0].parent.iterdir() if "-new" in p.name or "-old" in p.name]


def test_env_run_of_a_snapshot_the_agent_mounted_here_runs_and_restores_nothing(
        tmp_path) -> None:
    """In a container whose root the node agent gave the snapshot (``BOOTSEER_ENVS_MOUNTED``
    names its key), ``env run`` neither restores (there is no store here to ask) nor runs
    the command."""
    from bootseer.snapshot.key import KeyInputs, key_material, snapshot_key
    from bootseer.snapshot.run import MOUNTED_ENVS, env_run

    marker = tmp_path / "ran"
    inputs = KeyInputs(("sh", "-c", f"touch {marker}"), targets=(tmp_path / "venv",))
    key = snapshot_key(key_material(inputs, {}))
    blobs = BlobStore(open_store(f"file://{tmp_path / 'no-store'}"))
    outcome = env_run(blobs, inputs, environ={MOUNTED_ENVS: f"other,{key}"},
                      options=SnapshotOptions())
    assert outcome.mounted_by_agent and outcome.restored is None and outcome.capture is None
    assert not marker.exists() and not (tmp_path / "no-store").exists()

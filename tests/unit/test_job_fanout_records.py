"""HDFS-native fan-out without HDFS: how many replicas a job's readers want, what an image
asks to spread, and the scheduler's record of what changed (its own, well formed, and a
restore that touches nothing outside its roots). On a real cluster:
``integration/test_job_fanout.py``."""

from __future__ import annotations

import json

import pytest
from support.images import recorded_big_image

from bootseer.agents import fanout
from bootseer.errors import BootseerError, SizeLimitError
from bootseer.store import BlobStore, open_store
from bootseer.userstate import UnsafeStateError


@pytest.mark.parametrize(("readers", "per", "most", "want"),
                         [(1, 4, 10, 1), (4, 4, 10, 1), (5, 4, 10, 2), (16, 4, 10, 4),
                          (1000, 4, 10, 10), (16, 1, 3, 3)])
def test_replicas_grow_with_the_readers_up_to_the_datanodes(readers, per, most, want) -> None:
    assert fanout.replicas_for(readers, per, most) == want
    with pytest.raises(ValueError):
        fanout.replicas_for(0, per, most)


def test_an_image_is_its_manifest_and_hot_pack_and_a_local_store_is_left_alone(
        dirs) -> None:
    image_id = recorded_big_image(dirs)
    blobs = BlobStore(open_store(str(dirs["store"])))
    wanted = fanout.image_objects(blobs, "big", "train")
    assert wanted.keys[0] == blobs.blob_key(image_id)
    assert any(key.startswith("packs/") for key in wanted.keys)  # the hot pack
    for key in wanted.keys:
        blobs.store.stat(key)
    assert fanout.fan_out([wanted], 8) == []  # one local copy: nothing to spread


def test_a_record_is_refused_unless_it_is_the_users_own_and_well_formed(tmp_path) -> None:
    store = f"file://{tmp_path}/store"
    assert fanout.load(store, "j") is None
    fanout.save(store, "j", (store,), [fanout.Change(store, "a", 1, 3)])
    record = fanout.load(store, "j")
    assert record is not None and record.changes == (fanout.Change(store, "a", 1, 3),)
    (path,) = fanout.record_dir().iterdir()
    good = path.read_bytes()
    for body, error in ((b'{"format": "bootseer-fanout/1", "roots": 1}', "not a fan-out"),
                        (b"[" * 100_000, "nested"),
                        (json.dumps({**json.loads(good), "job": "k"}).encode(), "job k"),
                        (json.dumps({**json.loads(good), "changes": [
                            {"store": store, "key": "a", "before": 0, "after": 3}]}).encode(),
                         "not a replication")):
        path.write_bytes(body)
        with pytest.raises(BootseerError, match=error):
            fanout.load(store, "j")
    path.write_bytes(b"[" + b" " * (17 << 20) + b"]")
    with pytest.raises(SizeLimitError):
        fanout.load(store, "j")
    path.write_bytes(good)
    path.chmod(0o644)  # another user may read it: may they have written it before?
    with pytest.raises(UnsafeStateError, match="chmod 0600"):
        fanout.load(store, "j")
    path.unlink()
    (tmp_path / "elsewhere").write_bytes(good)
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeStateError, match="not a link"):
        fanout.load(store, "j")
    path.unlink()
    fanout.record_dir().chmod(0o755)
    with pytest.raises(UnsafeStateError, match="chmod 0700"):
        fanout.save(store, "j", (store,), [])
    with pytest.raises(ValueError):
        fanout.load(store, "../x")


def test_restore_touches_only_objects_under_the_records_roots(tmp_path) -> None:
    store = open_store(f"file://{tmp_path}")
    opened = []
    record = fanout.Record("j", store.url, (f"{store.url}/ckpt",), (
        fanout.Change("hdfs://elsewhere:8020/x", "victim", 3, 9),
        fanout.Change(store.url, "ckpt2/victim", 3, 9),
        fanout.Change(store.url, "ckpt/gone", 1, 2)))
    assert fanout.restore(record, lambda url: opened.append(url) or store) == 0
    assert opened == [store.url]  # only for the object under the root; the others never

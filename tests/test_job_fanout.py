"""HDFS-native fan-out: ``bootseer job fanout`` raises the replication of what every node
of a job reads, on a real HDFS cluster, and ``bootseer job restore`` puts it back."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from store_contract import MIB, ramp
from test_prefetch_warm import dirs, recorded_big_image  # noqa: F401 (fixture)

from bootseer.agents import fanout
from bootseer.store import BlobStore, open_store


@pytest.mark.parametrize(("readers", "per", "most", "want"),
                         [(1, 4, 10, 1), (4, 4, 10, 1), (5, 4, 10, 2), (16, 4, 10, 4),
                          (1000, 4, 10, 10), (16, 1, 3, 3)])
def test_replicas_grow_with_the_readers_up_to_the_datanodes(readers, per, most, want) -> None:
    assert fanout.replicas_for(readers, per, most) == want
    with pytest.raises(ValueError):
        fanout.replicas_for(0, per, most)


def test_an_image_is_its_manifest_and_hot_pack_and_a_local_store_is_left_alone(
        dirs) -> None:  # noqa: F811 (the fixture)
    image_id = recorded_big_image(dirs)
    blobs = BlobStore(open_store(str(dirs["store"])))
    wanted = fanout.image_objects(blobs, "big", "train")
    assert wanted.keys[0] == blobs.blob_key(image_id)
    assert any(key.startswith("packs/") for key in wanted.keys)  # the hot pack
    for key in wanted.keys:
        blobs.store.stat(key)
    assert fanout.fan_out([wanted], 8) == []  # one local copy: nothing to spread


def bootseer(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bootseer", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def test_a_jobs_checkpoint_is_fanned_out_for_its_nodes_and_restored(hdfs_cluster) -> None:
    base = f"{hdfs_cluster.namenode_rpc_url}/fanout/{uuid.uuid4().hex[:8]}"
    ckpt = open_store(f"{base}/ckpt", replication=1)
    for n in range(3):
        ckpt.put(f"rank{n}.pt", ramp(n, MIB))
    main = f"{base}/store"
    fanned = bootseer("--store", main, "job", "fanout", "train-9", "--nodes", "8",
                      "--checkpoint", f"{base}/ckpt", "--max-replicas", "2")
    assert fanned.returncode == 0, fanned.stderr
    assert "3 of 3 objects now kept 2-fold" in fanned.stderr + fanned.stdout
    assert [ckpt.replication(f"rank{n}.pt") for n in range(3)] == [2, 2, 2]
    # A second fan-out (more nodes) keeps the first one's "before": restore goes back to 1.
    assert bootseer("--store", main, "job", "fanout", "train-9", "--nodes", "16",
                    "--checkpoint", f"{base}/ckpt/rank0.pt", "--max-replicas", "2",
                    "--readers-per-replica", "1").returncode == 0
    restored = bootseer("--store", main, "job", "restore", "train-9")
    assert restored.returncode == 0, restored.stderr
    assert [ckpt.replication(f"rank{n}.pt") for n in range(3)] == [1, 1, 1]
    again = bootseer("--store", main, "job", "restore", "train-9")
    assert again.returncode == 1 and "no fan-out to restore" in again.stderr
    missing = bootseer("--store", main, "job", "fanout", "train-9", "--nodes", "8",
                       "--max-replicas", "2")
    assert missing.returncode == 2 and "--checkpoint" in missing.stderr


def test_a_forged_fanout_record_is_refused_or_kept_to_its_own_cluster(tmp_path) -> None:
    from bootseer.errors import BootseerError

    store = open_store(f"file://{tmp_path}")
    store.put(fanout.record_key("j"), b"[{\"store\": 1}]")
    with pytest.raises(BootseerError, match="not a fan-out record"):
        fanout.load(store, "j")
    store.put(fanout.record_key("j"), b"[" + b" " * (17 << 20) + b"]")
    with pytest.raises(BootseerError, match="more than a fan-out record holds"):
        fanout.load(store, "j")
    opened = []
    forged = [fanout.Change("hdfs://elsewhere:8020/x", "victim", 3, 9),
              fanout.Change(store.url, "gone", 1, 2)]
    assert fanout.restore(forged, lambda url: opened.append(url) or store,
                          cluster=store.url) == 0
    assert opened == [store.url]  # the other cluster was never contacted

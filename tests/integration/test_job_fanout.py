"""HDFS-native fan-out: ``bootseer job fanout`` raises the replication of what every node
of a job reads, on a real HDFS cluster, and ``bootseer job restore`` puts it back; the
record of what it changed is the scheduler's alone, and names nothing else. (Replica counts
and the record without a cluster: ``unit/test_job_fanout_records.py``.)"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from urllib.parse import urlsplit

import pytest
from support.store_contract import MIB, ramp

from bootseer.agents import fanout
from bootseer.store import open_store


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
    # The record is the scheduler's own, not the store's.
    assert not open_store(main).exists("jobs/train-9/fanout.json")
    (record,) = fanout.record_dir().iterdir()
    assert stat.S_IMODE(fanout.record_dir().stat().st_mode) == 0o700
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
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
    bad_name = bootseer("--store", main, "job", "restore", "../x")
    assert bad_name.returncode == 2 and "job" in bad_name.stderr


@pytest.mark.parametrize("protocol", ["hdfs", "webhdfs"])
def test_a_forged_record_changes_no_other_tenants_files(hdfs_cluster, protocol) -> None:
    """The attack: a record naming other tenants' files (in the store, where any writer
    could put it; or in the scheduler's own, naming what its fan-out was never asked
    for). Restoring it under the scheduler's HDFS identity must change none of them."""
    namenode = (hdfs_cluster.namenode_rpc_url if protocol == "hdfs"
                else hdfs_cluster.webhdfs_url)
    base = f"{namenode}/fanout/{uuid.uuid4().hex[:8]}"
    victims = {"tenant-b/prod/weights.bin": 2, "tenant-c/data/shard.bin": 1,
               "store2/x.bin": 1}  # store2: a sibling whose name extends "store"
    for key, replicas in victims.items():
        open_store(base, replication=replicas).put(key, ramp(7, 4096))
    ckpt = open_store(f"{base}/ckpt", replication=1)
    ckpt.put("rank0.pt", ramp(1, MIB))
    main = f"{base}/store"
    root = f"{protocol}://{urlsplit(namenode).netloc}"  # the whole file system
    prefix = urlsplit(base).path.lstrip("/")
    forged = [{"store": root, "key": f"{prefix}/tenant-b/prod/weights.bin", "before": 1,
               "after": 3},
              {"store": base, "key": "tenant-c/data/shard.bin", "before": 512, "after": 3}]
    open_store(main).put("jobs/train-9/fanout.json", json.dumps(forged).encode())

    def replication() -> dict[str, int]:
        return {key: open_store(base).replication(key) for key in victims}

    # The store's record is never read.
    nothing = bootseer("--store", main, "job", "restore", "train-9")
    assert nothing.returncode == 1 and "no fan-out to restore" in nothing.stderr
    assert replication() == victims
    # The scheduler's own record, with foreign objects added to what its fan-out changed.
    fanned = bootseer("--store", main, "job", "fanout", "train-9", "--nodes", "8",
                      "--checkpoint", f"{base}/ckpt", "--max-replicas", "2")
    assert fanned.returncode == 0, fanned.stderr
    assert ckpt.replication("rank0.pt") == 2
    fanout.save(open_store(main).url, "train-9", (), [fanout.Change(**c) for c in forged] + [
        fanout.Change(f"{base}/store2", "x.bin", 512, 3),
        fanout.Change(f"{base}/ckpt", "../tenant-c/data/shard.bin", 512, 3),
        fanout.Change(f"{base}/ckpt/../tenant-c", "data/shard.bin", 512, 3)])
    restored = bootseer("--store", main, "job", "restore", "train-9")
    assert restored.returncode == 0, restored.stderr
    assert "1 of 6 objects back" in restored.stdout + restored.stderr
    assert restored.stderr.count("not restoring") == 5, restored.stderr
    assert ckpt.replication("rank0.pt") == 1
    assert replication() == victims

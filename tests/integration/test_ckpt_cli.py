"""``bootseer ckpt put`` and ``get``: staging checkpoints in and out of real HDFS, with the
configured ``hdfs.*`` options, ``get`` through the one read path (a current staged copy
first)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from hdfs import InsecureClient
from support.hdfs import audited_users
from support.store_contract import MIB, ramp

from bootseer.store import open_store


def bootseer(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "bootseer", *args], capture_output=True,
                            text=True, timeout=300, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr
    return result


def test_put_and_get_a_file_and_a_directory(hdfs_cluster, tmp_path: Path) -> None:
    url = f"{hdfs_cluster.namenode_rpc_url}/ckpt-cli/{uuid.uuid4().hex[:8]}"
    src = tmp_path / "src"
    (src / "optim").mkdir(parents=True)
    (src / "model.pt").write_bytes(ramp(0, 5 * MIB + 3))
    (src / "optim" / "rank0.pt").write_bytes(ramp(7, 2 * MIB))
    (src / "empty").write_bytes(b"")

    bootseer("ckpt", "put", str(src), f"{url}/step100")
    bootseer("ckpt", "put", str(src / "model.pt"), f"{url}/single/model.pt")

    bootseer("ckpt", "get", f"{url}/step100", str(tmp_path / "back"))
    for rel in ("model.pt", "optim/rank0.pt", "empty"):
        assert (tmp_path / "back" / rel).read_bytes() == (src / rel).read_bytes(), rel
    bootseer("ckpt", "get", f"{url}/single/model.pt", str(tmp_path / "one.pt"))
    assert (tmp_path / "one.pt").read_bytes() == (src / "model.pt").read_bytes()


def test_get_of_a_missing_url_is_one_clear_error(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "bootseer", "ckpt", "get",
                             f"file://{tmp_path}/nothing/here", str(tmp_path / "x")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "no such file or directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_put_and_get_open_the_store_with_the_configured_hdfs_options(hdfs_cluster,
                                                                     tmp_path: Path) -> None:
    """``hdfs.block_size`` shapes what ``put`` writes (the cluster's default is 1 MiB);
    ``hdfs.user`` is who ``get`` reads as, in the NameNode's own audit log."""
    run = uuid.uuid4().hex[:8]
    url = f"{hdfs_cluster.namenode_rpc_url}/ckpt-cli-opts/{run}"
    (tmp_path / "model.pt").write_bytes(ramp(3, 5 * MIB))
    bootseer("ckpt", "put", str(tmp_path / "model.pt"), f"{url}/model.pt",
             env={"BOOTSEER_HDFS_BLOCK_SIZE": "2m"})
    assert open_store(url).block_size("model.pt") == 2 * MIB
    reader = f"ckpt-get-{run}"
    bootseer("ckpt", "get", f"{url}/model.pt", str(tmp_path / "back.pt"),
             env={"BOOTSEER_HDFS_USER": reader})
    assert (tmp_path / "back.pt").read_bytes() == ramp(3, 5 * MIB)
    assert reader in audited_users(hdfs_cluster, "open", f"/ckpt-cli-opts/{run}/model.pt")


def test_get_reads_a_current_staged_copy_and_never_a_stale_one(hdfs_cluster,
                                                               tmp_path: Path) -> None:
    """After ``warm``, the store's object is replaced by other bytes of the same size.
    With its old mtime put back (WebHDFS SETTIMES), the store's ``stat`` still matches the
    copy's record: ``get`` returns the copy's bytes, which the store no longer holds. With
    a new mtime, the copy is stale: ``get`` returns the store's bytes."""
    run = uuid.uuid4().hex[:8]
    path = f"/ckpt-cli-staged/{run}/model.pt"
    url = f"{hdfs_cluster.namenode_rpc_url}{path}"
    store = open_store(f"{hdfs_cluster.namenode_rpc_url}/ckpt-cli-staged/{run}")
    store.put("model.pt", ramp(1, 3 * MIB + 5))
    staged = store.stat("model.pt")
    env = {"BOOTSEER_CACHE_DIR": str(tmp_path / "cache")}
    bootseer("warm", "--checkpoint", url, "--no-agent", env=env)

    store.put("model.pt", ramp(2, 3 * MIB + 5))  # same size, other bytes
    webhdfs = InsecureClient(f"http://127.0.0.1:{hdfs_cluster.spec.namenode_http_port}")
    webhdfs.set_times(path, modification_time=round(staged.mtime * 1000))
    assert store.stat("model.pt") == staged
    bootseer("ckpt", "get", url, str(tmp_path / "copy.pt"), env=env)
    assert (tmp_path / "copy.pt").read_bytes() == ramp(1, 3 * MIB + 5)

    webhdfs.set_times(path, modification_time=round(staged.mtime * 1000) + 60_000)
    bootseer("ckpt", "get", url, str(tmp_path / "store.pt"), env=env)
    assert (tmp_path / "store.pt").read_bytes() == ramp(2, 3 * MIB + 5)

"""``bootseer ckpt put`` and ``get``: staging checkpoints in and out of real HDFS."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from store_contract import MIB, ramp


def bootseer(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "bootseer", *args], capture_output=True,
                            text=True, timeout=300)
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

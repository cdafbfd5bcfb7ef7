"""``make bench-ckpt-gpu`` runs on a GPU machine only at times and briefly, so its script
must not be first run there: here it runs end to end on the host (``--device cpu``, tiny
sizes, no cold runs), every loader compared byte for byte, every key of the result
written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_gpu_benchmark_runs_on_the_host(tmp_path: Path) -> None:
    out = tmp_path / "ckpt-gpu.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        str(REPO / d) for d in ("", "dev", "benchmarks"))}
    subprocess.run([sys.executable, str(REPO / "benchmarks/bench_ckpt_gpu.py"),
                    "--device", "cpu", "--mib", "64", "--shards", "2", "--single-mib", "16",
                    "--pt-mib", "16", "--pool-mib", "32", "--runs", "1", "--no-cold",
                    "--no-sweep", "--work", str(tmp_path), "--out", str(out)],
                   check=True, env=env, cwd=tmp_path, timeout=300)
    result = json.loads(out.read_text())
    assert result["benchmark"] == "ckpt-gpu" and result["device"] == "cpu"
    for key in ("warm_vs_lib", "warm_vs_best_practice", "host_peak_over_pool"):
        assert result[key] > 0, key
    assert result["cold_vs_disk"] is None  # no cold runs asked for
    assert set(result["sharded_warm"]) == {"safetensors_lib_copy", "best_practice", "bootseer"}
    peak = result["peaks"]["bootseer"]
    assert peak["tensor_bytes"] <= peak["host_peak_bytes"] < 2 * peak["tensor_bytes"]
    assert result["torch_pt"]["bootseer_vs_torch_load"] > 0

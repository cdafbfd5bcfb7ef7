"""``make bench-ckpt-gpu``: a safetensors checkpoint onto a GPU — Bootseer vs the library vs
a careful hand-written loader, warm and cold, against the node's limits.

Runs on a GPU machine from the checkout alone (PyTorch and safetensors installed there;
Bootseer's own dependencies that such a machine lacks, zstandard and platformdirs, carried
as wheels): no HDFS, no network, no root beyond dropping the page cache. In one run, on
local disk, ``file://`` URLs:

* a sharded bf16 checkpoint of ``--mib`` in ``--shards`` shards with its index, and a
  single-file one of ``--single-mib``;
* cases (``benchmarks/loadcases.py``): ``safetensors_lib_cuda`` (``load_file(device=)``
  shard by shard), ``best_practice`` (16 threads of 16 MiB ``preadv`` into one reused
  pinned buffer, an async copy per chunk, tensors as views of the device buffer),
  ``bootseer_cuda`` (``load_safetensors`` of the index, staging pool ``--pool-mib``),
  each ``--runs`` times, warm (files in the page cache) and cold (page cache dropped
  before every run), rounds interleaved; every tensor of every case compared byte for
  byte with the library's;
* limits: pinned and pageable host-to-device copy rates, the disk's cold sequential read
  rate of the same files (one stream, 16 MiB reads into a reused buffer);
* peaks, each in a fresh process: host memory (peak RSS over the process's RSS after
  CUDA's start) and device memory over the tensors' size, per case;
* ``torch.load`` of a ``.pt`` vs ``bootseer.checkpoint.load`` onto the device;
* a sweep of Bootseer's warm load over local reads in flight and local read size.

On a GPU machine with no network, Bootseer's two missing dependencies travel as wheels:
here, ``python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
--platform manylinux_2_17_x86_64 -d .whl zstandard platformdirs`` (``.whl`` ignored by
git); there, ``python3 -m pip install -q --no-index --no-deps --target /tmp/site
.whl/*.whl && PYTHONPATH=/tmp/site make bench-ckpt-gpu test-gpu`` (about 3 minutes).

``--device cpu`` runs the same on the host (no cold runs without root): the script's own
test, on machines without a GPU. Writes ``bench-results/ckpt-gpu.json``: goals
``warm_vs_lib <= 0.2``, ``warm_vs_best_practice <= 1.0``, ``cold_vs_disk >= 0.9``,
``host_peak_over_pool <= 1.1``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import loadcases
import torch
from benchlib import Recording, busy_fraction, cpu_times, drop_page_cache

import bootseer.checkpoint as ckpt
from bootseer.stripedfs import localfile
from bootseer.stripedfs.config import StripeConfig

log = logging.getLogger("bench-ckpt-gpu")
MIB = 1 << 20
GB = 1e9


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def loaders(device: str, pool: int) -> dict[str, loadcases.Loader]:
    lib = "safetensors_lib_cuda" if device.startswith("cuda") else "safetensors_lib_copy"
    return {lib: loadcases.library if device.startswith("cuda") else loadcases.library_copy,
            "best_practice": loadcases.best_practice,
            "bootseer_cuda" if device.startswith("cuda") else "bootseer":
                loadcases.bootseer(StripeConfig(max_memory=pool))}


def timed(cases: dict, paths: list[Path], device: str, runs: int, cold: bool,
          reference: dict | None) -> dict:
    """Each case ``runs`` times, rounds interleaved; the first round checked byte for byte
    against ``reference``."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    busy: dict[str, list[float]] = {name: [] for name in cases}
    for run in range(runs):
        for name, load in cases.items():
            if cold:
                drop_page_cache()
            cpu0, start = cpu_times(), time.perf_counter()
            tensors = load(paths, device)
            sync(device)
            times[name].append(time.perf_counter() - start)
            busy[name].append(busy_fraction(cpu0, cpu_times()))
            if run == 0 and reference is not None and not loadcases.same(tensors, reference):
                raise AssertionError(f"{name} loaded tensors that differ from the library's")
            del tensors
    size = sum(path.stat().st_size for path in paths)
    return {name: {"median_s": round(statistics.median(t), 4),
                   "GBps": round(size / statistics.median(t) / GB, 2),
                   "runs_s": [round(x, 4) for x in t],
                   "cpu_busy_fraction": round(statistics.median(busy[name]), 2)}
            for name, t in times.items()}


def copy_rates(device: str, size: int = 1 << 30) -> dict:
    """Host-to-device copy rates from pinned and from pageable memory (median of 5)."""
    if not device.startswith("cuda"):
        return {"pinned_h2d_GBps": None, "pageable_h2d_GBps": None}
    dest = torch.empty(size, dtype=torch.uint8, device=device)
    out = {}
    for kind, src in (("pinned", torch.ones(size, dtype=torch.uint8).pin_memory()),
                      ("pageable", torch.ones(size, dtype=torch.uint8))):
        times = []
        for _ in range(5):
            start = time.perf_counter()
            dest.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        out[f"{kind}_h2d_GBps"] = round(size / statistics.median(times) / GB, 2)
    return out


def cold_sequential_read(paths: list[Path], runs: int) -> float:
    """GB/s of one stream reading the files, page cache dropped (median of ``runs``)."""
    buffer = bytearray(16 * MIB)
    times = []
    for _ in range(runs):
        drop_page_cache()
        start = time.perf_counter()
        for path in paths:
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buffer):
                    pass
        times.append(time.perf_counter() - start)
    return round(sum(p.stat().st_size for p in paths) / statistics.median(times) / GB, 2)


def peaks(case: str, paths: list[Path], device: str, pool: int) -> dict:
    """Host and device memory peaks of one load of ``case``, in a fresh process."""
    out = subprocess.run(
        [sys.executable, __file__, "--peak-of", case, "--device", device,
         "--pool-mib", str(pool // MIB), *map(str, paths)],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure_peak(case: str, paths: list[Path], device: str, pool: int) -> None:
    """(In the fresh process) one load; prints host and device peaks as JSON."""
    if device.startswith("cuda"):
        torch.empty(1, device=device)  # CUDA's start, before the baseline
    Path("/proc/self/clear_refs").write_text("5\n")  # resets VmHWM to the current RSS
    base = _status("VmRSS")
    device_base = torch.cuda.memory_allocated() if device.startswith("cuda") else 0
    tensors = loaders(device, pool)[case](paths, device)
    sync(device)
    tensor_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    device_peak = (torch.cuda.max_memory_allocated() - device_base
                   if device.startswith("cuda") else None)
    print(json.dumps({"host_peak_bytes": _status("VmHWM") - base,
                      "device_peak_bytes": device_peak, "tensor_bytes": tensor_bytes}))


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def torch_pt(work: Path, device: str, mib: int, runs: int) -> dict:
    """``torch.load`` vs ``bootseer.checkpoint.load`` of one ``.pt`` onto ``device``, warm."""
    path = work / "model.pt"
    g = torch.Generator().manual_seed(1)
    torch.save({f"w{i}": torch.randn(16 * MIB, generator=g).to(torch.bfloat16)
                for i in range(max(1, mib // 32))}, path)
    path.read_bytes()
    cases = {"torch_load": lambda: torch.load(path, map_location=device, weights_only=True),
             "bootseer_load": lambda: ckpt.load(path.as_uri(), map_location=device,
                                                weights_only=True)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, load in cases.items():
            start = time.perf_counter()
            state = load()
            sync(device)
            times[name].append(time.perf_counter() - start)
            del state
    med = {name: statistics.median(t) for name, t in times.items()}
    return {"bytes": path.stat().st_size, **{f"{k}_s": round(v, 4) for k, v in med.items()},
            "bootseer_vs_torch_load": round(med["bootseer_load"] / med["torch_load"], 3)}


def sweep(paths: list[Path], device: str, pool: int, runs: int) -> list[dict]:
    """Bootseer's warm load over local reads in flight x local read size."""
    points = []
    default = localfile.LOCAL_CHUNK
    try:
        for chunk in (4 * MIB, 16 * MIB, 64 * MIB):
            localfile.LOCAL_CHUNK = chunk
            for concurrency in (8, 16, 32, 64):
                load = loadcases.bootseer(StripeConfig(
                    max_memory=max(pool, 2 * chunk), max_concurrent_local_reads=concurrency))
                result = timed({"bootseer": load}, paths, device, runs, False, None)
                points.append({"local_chunk_mib": chunk // MIB, "local_reads": concurrency,
                               **result["bootseer"]})
    finally:
        localfile.LOCAL_CHUNK = default
    return points


def run(args: argparse.Namespace, work: Path) -> dict:
    recording = Recording("ckpt-gpu")
    device, pool = args.device, args.pool_mib * MIB
    cuda = device.startswith("cuda")
    log.info("writing the checkpoints (%d MiB in %d shards; %d MiB in one file)",
             args.mib, args.shards, args.single_mib)
    sharded = loadcases.write_checkpoint(work / "sharded", args.mib * MIB, args.shards)
    single = loadcases.write_checkpoint(work / "single", args.single_mib * MIB, 1)
    cases = loaders(device, pool)
    lib, _, mine = cases
    result: dict = {"gpu": torch.cuda.get_device_name(device) if cuda else None,
                    "device": device, "torch": torch.__version__,
                    "checkpoint_bytes": sum(p.stat().st_size for p in sharded),
                    "shards": len(sharded),
                    "single_file_bytes": single[0].stat().st_size,
                    "pool_bytes": pool, "cases": list(cases)}
    for layout, paths in (("sharded", sharded), ("single", single)):
        for p in paths:
            p.read_bytes()
        reference = loadcases.library(paths, device)
        log.info("%s warm", layout)
        result[f"{layout}_warm"] = timed(cases, paths, device, args.runs, False, reference)
        del reference
        if args.cold:
            log.info("%s cold", layout)
            result[f"{layout}_cold"] = timed(cases, paths, device, args.runs, True, None)
    log.info("limits")
    result["limits"] = {**copy_rates(device),
                        "cold_sequential_read_GBps":
                            cold_sequential_read(sharded, args.runs) if args.cold else None}
    log.info("memory peaks")
    result["peaks"] = {case: peaks(case, sharded, device, pool) for case in cases}
    log.info(".pt")
    result["torch_pt"] = torch_pt(work, device, args.pt_mib, args.runs)
    if args.sweep:
        log.info("sweep")
        result["sweep"] = sweep(sharded, device, pool, max(1, args.runs - 1))

    def seconds(layout: str, case: str) -> float:
        return result[layout][case]["median_s"]

    warm_vs_lib = round(seconds("sharded_warm", mine) / seconds("sharded_warm", lib), 3)
    warm_vs_bp = round(seconds("sharded_warm", mine) /
                       seconds("sharded_warm", "best_practice"), 3)
    cold_vs_disk = (round(result["sharded_cold"][mine]["GBps"] /
                          result["limits"]["cold_sequential_read_GBps"], 3)
                    if args.cold else None)
    host_over_pool = round(result["peaks"][mine]["host_peak_bytes"] / pool, 3)
    return {**recording.header(runs=args.runs, caps={
                "link": "none: local disk, file:// URLs", "latency": "none added"}),
            "warm_vs_lib": warm_vs_lib, "warm_vs_best_practice": warm_vs_bp,
            "cold_vs_disk": cold_vs_disk, "host_peak_over_pool": host_over_pool,
            "single_warm_vs_lib": round(seconds("single_warm", mine) /
                                        seconds("single_warm", lib), 3),
            "goals": {"warm_vs_lib_le_0.2": warm_vs_lib <= 0.2,
                      "warm_vs_best_practice_le_1.0": warm_vs_bp <= 1.0,
                      "cold_vs_disk_ge_0.9": None if cold_vs_disk is None
                      else cold_vs_disk >= 0.9,
                      "host_peak_over_pool_le_1.1": host_over_pool <= 1.1},
            **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results/ckpt-gpu.json"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--mib", type=int, default=4096, help="the sharded checkpoint")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--single-mib", type=int, default=1024, help="the single file")
    parser.add_argument("--pt-mib", type=int, default=1024, help="the torch .pt file")
    parser.add_argument("--pool-mib", type=int, default=512,
                        help="Bootseer's staging pool (max_memory): 1/8 of the checkpoint")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-cold", dest="cold", action="store_false",
                        help="no cold runs (dropping the page cache needs root)")
    parser.add_argument("--no-sweep", dest="sweep", action="store_false")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--peak-of", help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_of:
        measure_peak(args.peak_of, args.paths, args.device, args.pool_mib * MIB)
        return
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device here: run it on a GPU machine, or pass --device cpu")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-gpu-", dir=args.work) as tmp:
        result = run(args, Path(tmp))
    log.info("done in %.0f s", time.perf_counter() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items()
                      if not isinstance(v, dict | list) or k in ("goals", "limits")}, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

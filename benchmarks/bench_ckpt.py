"""``make bench-ckpt``: checkpoint reads from real HDFS — striped vs one stream vs the limit.

A real HDFS cluster (4 DataNodes) whose every DataNode's egress is capped (``--link``),
so one stream from one DataNode is bounded like a real DataNode link while N DataNodes
together give N times that. A checkpoint of >= 2 GiB is written with a block size that
spreads it over all DataNodes. Then, with the page cache dropped before every run:

Replication is 3, HDFS's default, so a block lives on 3 of the 4 DataNodes and every read
picks one replica, as on a production cluster.

* ``single_stream``: ``hdfs dfs -cat`` (Hadoop's FsShell): one sequential stream, what a
  plain HDFS-FUSE mount does — the baseline a user has today;
* ``raw_parallel``: every HDFS block read at once with plain ranged reads (pyarrow
  ``read_at``, 4 MiB each), no FUSE, no assembly — the physical limit of this cluster and
  cap (``aggregate_cap_MBps`` is the sum of the caps; ``placement_limit_MBps`` what the
  busiest DataNode allows when each read picks one of a block's replicas at random);
* ``api``: ``bootseer.checkpoint.open(url)`` read to the end;
* ``fuse``: ``dd`` of the file through ``bootseer ckpt mount`` (``--direct-io``, the default)
  and ``fuse_page_cache`` with ``--page-cache``, the measurement behind that default;
* ``torch_load_api_s`` vs ``torch_load_copy_then_load_s``: a real ``torch.save`` file of
  the same size loaded through ``bootseer.checkpoint.load`` vs ``hdfs dfs -get`` + ``torch.load``.

Medians of ``--runs`` runs, and ratios within the same run set. Writes
``bench-results/ckpt.json``.
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
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from benchlib import busy_fraction, cpu_times, drop_page_cache

import bootseer.checkpoint as ckpt
from bootseer_dev.cluster import Cluster, ClusterSpec, parse_link

log = logging.getLogger("bench-ckpt")
MB = 1e6
MIB = 1 << 20


def timed_runs(runs: int, fn: Callable[[], None]) -> tuple[list[float], list[float]]:
    """Wall times of ``runs`` cold runs, and the machine's CPU busy fraction during each."""
    times, busy = [], []
    for i in range(runs):
        drop_page_cache()
        cpu0, start = cpu_times(), time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        cpu1 = cpu_times()
        busy.append(busy_fraction(cpu0, cpu1))
        log.info("  run %d: %.2f s, CPU %.0f%% busy", i + 1, times[-1], 100 * busy[-1])
    return times, busy


def summary(size: int, measured: tuple[list[float], list[float]]) -> dict:
    times, busy = measured
    med = statistics.median(times)
    return {"MBps": round(size / med / MB, 1), "median_s": round(med, 2),
            "runs_s": [round(t, 2) for t in times],
            "cpu_busy_fraction": round(statistics.median(busy), 2)}


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        spec = ClusterSpec.with_base_port(
            args.base_port, datanodes=args.datanodes, replication=args.replication,
            block_size=args.block_size * MIB, state_dir=work / "hdfs",
            link=parse_link(args.link), datanode_heap_mb=384,
        )
        self.cluster = Cluster(spec)
        self.url = f"{self.cluster.namenode_rpc_url}/bench"

    def fsshell(self, *args: str, stdout=subprocess.DEVNULL) -> None:
        env = self.cluster.env()
        cmd = [str(self.cluster.jdk / "bin" / "java"), "-Xmx512m", "-cp", env["CLASSPATH"],
               "org.apache.hadoop.fs.FsShell", "-fs", self.cluster.namenode_rpc_url, *args]
        subprocess.run(cmd, stdout=stdout, check=True)

    def write_inputs(self) -> tuple[int, int]:
        """The raw checkpoint (random bytes) and a real torch.save file, into HDFS."""
        size = self.args.size_gib << 30
        raw = self.work / "raw.bin"
        with open(raw, "wb") as f:
            chunk = os.urandom(64 * MIB)
            for _ in range(size // len(chunk)):
                f.write(chunk)
        state = {f"layer{i}.weight": torch.randn(size // 4 // 8 // 4096, 4096) for i in range(8)}
        torch.save(state, self.work / "model.pt")
        self.state_checksum = sum(float(t.double().sum()) for t in state.values())
        del state
        self.cluster.set_link(None)  # write uncapped: only reads are being measured
        self.fsshell("-mkdir", "-p", "/bench")
        for name in ("raw.bin", "model.pt"):
            self.fsshell("-put", "-f", str(self.work / name), f"/bench/{name}")
        raw.unlink()
        self.cluster.set_link(parse_link(self.args.link))
        return size, (self.work / "model.pt").stat().st_size

    def placement(self, name: str) -> dict[str, int]:
        """Bytes of replicas each DataNode holds."""
        per_node: Counter[int] = Counter()
        for block in self.cluster.block_locations(f"/bench/{name}"):
            for node in block.datanodes:
                per_node[node] += block.length
        return {f"datanode{k}": v for k, v in sorted(per_node.items())}

    def raw_parallel(self, name: str) -> None:
        fs = self.cluster.pyarrow_fs()
        blocks = self.cluster.block_locations(f"/bench/{name}")

        def read_block(offset: int, length: int) -> None:
            # One positional read per 4 MiB, each on a fresh open so HDFS picks a replica
            # per read, as it does for the striped reader: the same balance, no assembly.
            for off in range(offset, offset + length, 4 * MIB):
                with fs.open_input_file(f"/bench/{name}") as f:
                    f.read_at(min(4 * MIB, offset + length - off), off)

        threads = [threading.Thread(target=read_block, args=(b.offset, b.length)) for b in blocks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def api(self, name: str) -> None:
        with ckpt.open(f"{self.url}/{name}") as f:
            buffer = bytearray(16 * MIB)
            while f.readinto(buffer):
                pass

    def fuse(self, name: str, direct_io: bool) -> Callable[[], None]:
        mountpoint = self.work / "mnt"
        mountpoint.mkdir(exist_ok=True)

        def run() -> None:
            subprocess.run([sys.executable, "-m", "bootseer", "ckpt", "mount", self.url,
                            str(mountpoint), "--direct-io" if direct_io else "--page-cache"],
                           check=True, capture_output=True)
            try:
                subprocess.run(["dd", f"if={mountpoint}/{name}", "of=/dev/null", "bs=4M"],
                               check=True, capture_output=True)
            finally:
                subprocess.run([sys.executable, "-m", "bootseer", "ckpt", "umount",
                                str(mountpoint)], check=True)
        return run

    def torch_api(self) -> None:
        state = ckpt.load(f"{self.url}/model.pt", map_location="cpu", weights_only=True)
        self._check(state)

    def torch_copy_then_load(self) -> None:
        local = self.work / "copy.pt"
        local.unlink(missing_ok=True)
        self.fsshell("-get", "/bench/model.pt", str(local))
        self._check(torch.load(local, map_location="cpu", weights_only=True))
        local.unlink()

    def _check(self, state: dict) -> None:
        total = sum(float(t.double().sum()) for t in state.values())
        if abs(total - self.state_checksum) > 1e-6 * max(1.0, abs(self.state_checksum)):
            raise AssertionError("loaded checkpoint differs from the saved one")

    def run(self) -> dict:
        a = self.args
        t0 = time.perf_counter()
        self.cluster.start()
        os.environ.update({k: v for k, v in self.cluster.env().items()
                           if not k.startswith("BOOTSEER_")})
        log.info("cluster up in %.1f s; writing inputs", time.perf_counter() - t0)
        size, torch_size = self.write_inputs()
        results: dict = {}
        cases = {
            "single_stream": lambda: self.fsshell("-cat", "/bench/raw.bin"),
            "raw_parallel": lambda: self.raw_parallel("raw.bin"),
            "api": lambda: self.api("raw.bin"),
            "fuse": self.fuse("raw.bin", direct_io=True),
            "fuse_page_cache": self.fuse("raw.bin", direct_io=False),
        }
        for name, fn in cases.items():
            log.info("%s", name)
            results[name] = summary(size, timed_runs(a.runs, fn))
        log.info("torch.load through the API")
        torch_api, _ = timed_runs(a.runs, self.torch_api)
        log.info("hdfs dfs -get, then torch.load")
        torch_copy, _ = timed_runs(a.runs, self.torch_copy_then_load)

        mbps = {k: v["MBps"] for k, v in results.items()}
        # HDFS picks a replica at random per read, so on average a DataNode serves
        # 1/replication of the bytes it holds: the busiest one bounds any parallel read.
        placement = self.placement("raw.bin")
        cap = parse_link(a.link).rate_bytes_per_s
        return {
            "benchmark": "ckpt",
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"cpus": os.cpu_count()},
            "cluster": {"datanodes": a.datanodes, "block_size": a.block_size * MIB,
                        "replication": a.replication, "link_cap": a.link,
                        "link_cap_bytes_per_s_per_datanode": cap,
                        "link_delay": "none (this kernel has no sch_netem)",
                        "replica_bytes_per_datanode": placement,
                        "aggregate_cap_MBps": round(a.datanodes * cap / MB, 1),
                        "placement_limit_MBps": round(size / (max(placement.values())
                                                              / a.replication / cap) / MB, 1)},
            "checkpoint_bytes": size, "torch_checkpoint_bytes": torch_size, "runs": a.runs,
            "single_stream_MBps": mbps["single_stream"],
            "raw_parallel_MBps": mbps["raw_parallel"],
            "api_MBps": mbps["api"],
            "fuse_MBps": mbps["fuse"],
            "fuse_page_cache_MBps": mbps["fuse_page_cache"],
            "torch_load_api_s": round(statistics.median(torch_api), 2),
            "torch_load_copy_then_load_s": round(statistics.median(torch_copy), 2),
            "api_vs_single": round(mbps["api"] / mbps["single_stream"], 2),
            "fuse_vs_single": round(mbps["fuse"] / mbps["single_stream"], 2),
            "api_vs_raw": round(mbps["api"] / mbps["raw_parallel"], 3),
            "fuse_vs_raw": round(mbps["fuse"] / mbps["raw_parallel"], 3),
            "torch_api_vs_copy_then_load": round(statistics.median(torch_copy)
                                                 / statistics.median(torch_api), 2),
            "details": {**results,
                        "torch_load_api": {"runs_s": [round(t, 2) for t in torch_api]},
                        "torch_load_copy_then_load": {"runs_s": [round(t, 2) for t in torch_copy]}},
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results/ckpt.json"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size-gib", type=int, default=2)
    parser.add_argument("--datanodes", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=64, help="MiB")
    parser.add_argument("--replication", type=int, default=3,
                        help="HDFS's default; readers then pick a replica per read")
    parser.add_argument("--link", default="40MB/s", help="per-DataNode egress cap")
    parser.add_argument("--base-port", type=int, default=22000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-", dir="/var/tmp") as tmp:
        bench = Bench(args, Path(tmp))
        try:
            result = bench.run()
        finally:
            bench.cluster.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2))


if __name__ == "__main__":
    main()

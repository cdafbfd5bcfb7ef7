"""``make bench-ckpt``: checkpoint reads from real HDFS — striped vs one stream vs the limit.

A real HDFS cluster (4 DataNodes) whose every DataNode's egress is capped (``--link``),
so one stream from one DataNode is bounded like a real DataNode link while N DataNodes
together give N times that. A checkpoint of >= 2 GiB is written with a block size that
spreads it over all DataNodes. Then, with the page cache dropped before every run:

Replication is 3, HDFS's default, so a block lives on 3 of the 4 DataNodes and every read
picks one replica, as on a production cluster.

* ``single_stream``: ``hdfs dfs -cat`` (Hadoop's FsShell): one sequential stream, what a
  plain HDFS-FUSE mount does — the baseline a user has today;
* ``raw_parallel``: every HDFS block read at once with plain positional reads (the
  ``hdfs://`` store's ``read_range_into``, 4 MiB each, into a buffer per thread), no FUSE,
  no assembly — the limit of this cluster, cap and client (``aggregate_cap_MBps`` is the
  sum of the caps; ``placement_limit_MBps`` what the busiest DataNode allows when each
  read picks one of a block's replicas at random);
* ``api``: ``bootseer.checkpoint.open(url)`` read to the end;
* ``fuse``: ``dd`` of the file through ``bootseer ckpt mount`` (``--direct-io``, the default)
  and ``fuse_page_cache`` with ``--page-cache``, the measurement behind that default;
* ``torch_load_api_s`` vs ``torch_load_copy_then_load_s``: a real ``torch.save`` file of
  the same size loaded through ``bootseer.checkpoint.load`` vs ``hdfs dfs -get`` + ``torch.load``;
* ``sweep``: the API's read of the same file with each stripe size and fetch concurrency
  of ``--sweep-stripes`` x ``--sweep-concurrency`` (the defaults are chosen from it);
* ``safetensors``: a checkpoint of ``--safetensors-gib`` in ``--safetensors-shards``
  shards, as a model hub publishes one (``model-0000k-of-0000n.safetensors`` and its
  index), loaded through ``bootseer.checkpoint.load_safetensors`` of the index (shards
  two at a time) vs the safetensors library's own ``load_file`` of each shard on the
  same files through ``bootseer ckpt mount`` (``--page-cache``: the library mmaps the
  file).

And one case with no HDFS and no cap, ``page_cache``: a local sharded safetensors
checkpoint of ``--page-cache-gib`` already in the page cache, loaded into host memory by
``load_safetensors`` of its index vs the safetensors library with a forced copy (its
tensors are an unread mmap otherwise) vs a careful hand-written loader vs a plain
``read()`` of the files (``benchmarks/loadcases.py``), runs interleaved: the API's own CPU
cost, which a capped link hides (``page_cache_api_vs_lib``, goal >= 1.0); and a DCP
checkpoint of half that size loaded through ``bootseer.checkpoint.StorageReader`` vs DCP's
own ``FileSystemReader`` (``page_cache_dcp_api_vs_torch``).

Every capped case reports the bytes each DataNode served (its tc class's counter, per run; over
the bytes read, ``fetched_vs_size``) and the machine's CPU busy fraction. Medians of
``--runs`` runs, and ratios within the same run set. Goals: ``api_vs_raw >= 0.95`` and
``fuse_vs_raw >= 0.9``. ``--cases`` picks a subset (develop with ``--cases
raw_parallel,api --sweep-runs 0``). Writes ``bench-results/ckpt.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import loadcases
import torch
from benchlib import (
    CappedCluster,
    Recording,
    busy_fraction,
    cpu_times,
    drop_page_cache,
    select_cases,
)

import bootseer.checkpoint as ckpt
from bootseer.store import open_store
from bootseer.stripedfs.config import StripeConfig
from bootseer_dev.cluster import Cluster, parse_link

log = logging.getLogger("bench-ckpt")
#: The reads of raw.bin, then torch.load (API vs copy first) and the sharded safetensors.
CASES = ("single_stream", "raw_parallel", "api", "fuse", "fuse_page_cache", "torch",
         "safetensors", "page_cache")
MB = 1e6
MIB = 1 << 20


@dataclass
class Measured:
    """``runs`` cold runs of one case: wall times, CPU busy fractions, and the bytes each
    DataNode served per run (averaged)."""

    times: list[float]
    busy: list[float]
    datanode_bytes: list[int]

    def summary(self, size: int) -> dict:
        med = statistics.median(self.times)
        served = sum(self.datanode_bytes)
        return {"MBps": round(size / med / MB, 1), "median_s": round(med, 2),
                "runs_s": [round(t, 2) for t in self.times],
                "cpu_busy_fraction": round(statistics.median(self.busy), 2),
                "datanode_bytes": self.datanode_bytes,
                # What the DataNodes sent over what was read: above 1.0 is overfetch.
                "fetched_vs_size": round(served / size, 3) if size else None,
                # The busiest DataNode's share over an even share: 1.0 is a perfect spread.
                "datanode_imbalance": round(max(self.datanode_bytes) * len(self.datanode_bytes)
                                            / served, 2) if served else None}


def timed_runs(cluster: Cluster, runs: int, fn: Callable[[], None]) -> Measured:
    """``runs`` cold runs of ``fn``."""
    times, busy = [], []
    sent = cluster.datanode_sent_bytes()
    for i in range(runs):
        drop_page_cache()
        cpu0, start = cpu_times(), time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        cpu1 = cpu_times()
        busy.append(busy_fraction(cpu0, cpu1))
        log.info("  run %d: %.2f s, CPU %.0f%% busy", i + 1, times[-1], 100 * busy[-1])
    after = cluster.datanode_sent_bytes()
    return Measured(times, busy, [(b - a) // runs for a, b in zip(sent, after, strict=True)])


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.hdfs = CappedCluster(
            work, base_port=args.base_port, cap=parse_link(args.link),
            block_size=args.block_size * MIB, datanodes=args.datanodes,
            replication=args.replication, datanode_heap_mb=384, capped_from_start=True)
        self.cluster, self.url = self.hdfs.cluster, self.hdfs.url
        self.recording = Recording("ckpt")

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
        with self.hdfs.uncapped():  # only reads are being measured
            self.fsshell("-mkdir", "-p", "/bench")
            for name in ("raw.bin", "model.pt"):
                self.fsshell("-put", "-f", str(self.work / name), f"/bench/{name}")
        raw.unlink()
        return size, (self.work / "model.pt").stat().st_size

    def placement(self, name: str) -> dict[str, int]:
        """Bytes of replicas each DataNode holds."""
        per_node: Counter[int] = Counter()
        for block in self.cluster.block_locations(f"/bench/{name}"):
            for node in block.datanodes:
                per_node[node] += block.length
        return {f"datanode{k}": v for k, v in sorted(per_node.items())}

    def raw_parallel(self, name: str) -> None:
        store = open_store(self.url)
        blocks = self.cluster.block_locations(f"/bench/{name}")

        def read_block(offset: int, length: int) -> None:
            # One positional read (hdfsPread) per 4 MiB into this thread's buffer, each on
            # a fresh open so HDFS picks a replica per read, as it does for the striped
            # reader: the same balance and the same client, no assembly, no copy.
            buffer = bytearray(4 * MIB)
            for off in range(offset, offset + length, 4 * MIB):
                n = min(4 * MIB, offset + length - off)
                store.read_range_into(name, off, memoryview(buffer)[:n])

        threads = [threading.Thread(target=read_block, args=(b.offset, b.length)) for b in blocks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def api(self, name: str, config: StripeConfig | None = None) -> None:
        with ckpt.open(f"{self.url}/{name}", config=config) as f:
            buffer = bytearray(16 * MIB)
            while f.readinto(buffer):
                pass

    def sweep(self, size: int) -> list[dict]:
        """The API's read of raw.bin at each stripe size and fetch concurrency."""
        points = []
        for stripe in self.args.sweep_stripes:
            for concurrency in self.args.sweep_concurrency:
                # The window holds twice what is in flight (within the memory cap), so
                # that it is the fetches, not the window, that each point measures.
                window = min(StripeConfig.max_memory,
                             max(StripeConfig.max_read_window, 2 * concurrency * stripe * MIB))
                config = StripeConfig(stripe_size=stripe * MIB,
                                      initial_read_window=max(8, 2 * stripe) * MIB,
                                      max_read_window=window,
                                      max_concurrent_fetches=concurrency)
                log.info("sweep: %d MiB stripes, %d fetches", stripe, concurrency)
                measured = timed_runs(self.cluster, self.args.sweep_runs,
                                      lambda config=config: self.api("raw.bin", config))
                points.append({"stripe_mib": stripe, "concurrency": concurrency,
                               "read_window_mib": window // MIB, **measured.summary(size)})
        return points

    def write_safetensors(self) -> tuple[int, list[str]]:
        """The sharded safetensors checkpoint (random bf16 weights of 64 MiB each) and its
        index into HDFS; remembers a digest of each shard's first and last tensor."""
        from safetensors.torch import save_file

        shards, tensor_bytes = self.args.safetensors_shards, 64 * MIB
        per_shard = max(1, (self.args.safetensors_gib << 30) // shards // tensor_bytes)
        local = self.work / "st"
        local.mkdir()
        names, weight_map = [], {}
        self.safetensors_digests = {}
        for k in range(shards):
            name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            tensors = {f"layers.{k}.{t}.weight": torch.frombuffer(
                bytearray(os.urandom(tensor_bytes)), dtype=torch.bfloat16).reshape(-1, 4096)
                for t in range(per_shard)}
            save_file(tensors, local / name, metadata={"format": "pt"})
            self.safetensors_digests[name] = _ends_digest(tensors)
            weight_map |= dict.fromkeys(tensors, name)
            names.append(name)
            del tensors
        (local / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": shards * per_shard * tensor_bytes},
             "weight_map": weight_map}))
        with self.hdfs.uncapped():
            self.fsshell("-mkdir", "-p", "/bench/st")
            self.fsshell("-put", "-f", *(str(p) for p in sorted(local.iterdir())),
                         "/bench/st/")
        size = sum((local / name).stat().st_size for name in names)
        shutil.rmtree(local)
        return size, names

    def safetensors_api(self, names: list[str]) -> None:
        """The whole sharded checkpoint through its index, as a training script loads it."""
        tensors = ckpt.load_safetensors(f"{self.url}/st/model.safetensors.index.json")
        for name in names:
            prefix = f"layers.{names.index(name)}."
            self._check_safetensors(name, {k: v for k, v in tensors.items()
                                           if k.startswith(prefix)})
        del tensors

    def safetensors_library(self, names: list[str]) -> Callable[[], None]:
        from safetensors.torch import load_file

        def run() -> None:
            with self.mounted(direct_io=False) as mountpoint:
                for name in names:
                    tensors = load_file(mountpoint / "st" / name)
                    self._check_safetensors(name, tensors)
                    del tensors
        return run

    def _check_safetensors(self, name: str, tensors: dict) -> None:
        if _ends_digest(tensors) != self.safetensors_digests[name]:
            raise AssertionError(f"{name}: loaded tensors differ from the saved ones")

    @contextlib.contextmanager
    def mounted(self, direct_io: bool) -> Iterator[Path]:
        """``bootseer ckpt mount`` of the bench directory for the time of the block."""
        mountpoint = self.work / "mnt"
        mountpoint.mkdir(exist_ok=True)
        subprocess.run([sys.executable, "-m", "bootseer", "ckpt", "mount", self.url,
                        str(mountpoint), "--direct-io" if direct_io else "--page-cache"],
                       check=True, capture_output=True)
        try:
            yield mountpoint
        finally:
            subprocess.run([sys.executable, "-m", "bootseer", "ckpt", "umount",
                            str(mountpoint)], check=True)

    def fuse(self, name: str, direct_io: bool) -> Callable[[], None]:
        def run() -> None:
            with self.mounted(direct_io) as mountpoint:
                subprocess.run(["dd", f"if={mountpoint}/{name}", "of=/dev/null", "bs=4M"],
                               check=True, capture_output=True)
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

    def page_cache(self) -> dict:
        """The ``page_cache`` case: loads into host memory from the page cache."""
        paths = loadcases.write_checkpoint(self.work / "local-st", self.args.page_cache_gib << 30,
                                           self.args.safetensors_shards)
        size = sum(path.stat().st_size for path in paths)
        loaders = {"api": loadcases.bootseer(), "library_copy": loadcases.library_copy,
                   "best_practice": loadcases.best_practice,
                   "plain_read": loadcases.plain_read}
        reference = loadcases.library_copy(paths, "cpu")
        for name, load in loaders.items():  # byte-exact, and the files in the page cache
            if name != "plain_read" and not loadcases.same(load(paths, "cpu"), reference):
                raise AssertionError(f"page_cache: {name} loaded different tensors")
        del reference
        out = self.interleaved(loaders, paths, size)
        shutil.rmtree(self.work / "local-st")
        directory = self.work / "local-dcp"
        saved = loadcases.write_dcp(directory, self.args.page_cache_gib << 29)
        dcp_size = sum(path.stat().st_size for path in directory.iterdir())
        dcp_loaders = {"dcp_api": loadcases.dcp_bootseer, "dcp_torch": loadcases.dcp_torch}
        for name, load in dcp_loaders.items():
            if not loadcases.same(load([directory], "cpu"), saved):
                raise AssertionError(f"page_cache: {name} loaded different tensors")
        del saved
        dcp = self.interleaved(dcp_loaders, [directory], dcp_size)
        shutil.rmtree(directory)
        log.info("page cache: %s", {k: v["GBps"] for k, v in {**out, **dcp}.items()})
        return {"bytes": size, "shards": len(paths), "runs": self.args.page_cache_runs,
                "cap": "none: local files already in the page cache, into host memory",
                **out, "dcp_bytes": dcp_size, **dcp}

    def interleaved(self, loaders: dict, paths: list[Path], size: int) -> dict:
        """Each loader ``--page-cache-runs`` times into host memory, rounds interleaved."""
        times: dict[str, list[float]] = {name: [] for name in loaders}
        busy: dict[str, list[float]] = {name: [] for name in loaders}
        for _ in range(self.args.page_cache_runs):
            for name, load in loaders.items():
                cpu0, start = cpu_times(), time.perf_counter()
                tensors = load(paths, "cpu")
                times[name].append(time.perf_counter() - start)
                busy[name].append(busy_fraction(cpu0, cpu_times()))
                del tensors
        return {name: {"median_s": round(statistics.median(t), 3),
                       "GBps": round(size / statistics.median(t) / 1e9, 2),
                       "runs_s": [round(x, 3) for x in t],
                       "cpu_busy_fraction": round(statistics.median(busy[name]), 2)}
                for name, t in times.items()}

    @staticmethod
    def page_cache_ratios(page_cache: dict | None) -> dict:
        def rate(case: str) -> float | None:
            return None if page_cache is None else page_cache[case]["GBps"]

        def over(case: str) -> float | None:
            return None if page_cache is None else round(rate("api") / rate(case), 3)
        return {"page_cache_api_vs_lib": over("library_copy"),
                "page_cache_api_vs_read": over("plain_read"),
                "page_cache_api_vs_best_practice": over("best_practice"),
                "page_cache_dcp_api_vs_torch": None if page_cache is None else round(
                    rate("dcp_api") / rate("dcp_torch"), 3),
                "page_cache": page_cache}

    def run(self) -> dict:
        a = self.args
        wanted = select_cases(a.cases, CASES)
        page_cache = None
        if "page_cache" in wanted:
            log.info("page_cache (%d GiB)", a.page_cache_gib)
            page_cache = self.page_cache()
            if wanted == ["page_cache"]:  # nothing on HDFS: no cluster
                return {**self.recording.header(runs=a.page_cache_runs, caps={}),
                        **self.page_cache_ratios(page_cache)}
        t0 = time.perf_counter()
        self.hdfs.start()
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
            if name in wanted:
                log.info("%s", name)
                results[name] = timed_runs(self.cluster, a.runs, fn).summary(size)
        torch_api = torch_copy = None
        if "torch" in wanted:
            log.info("torch.load through the API")
            torch_api = statistics.median(timed_runs(self.cluster, a.runs, self.torch_api).times)
            log.info("hdfs dfs -get, then torch.load")
            torch_copy = statistics.median(
                timed_runs(self.cluster, a.runs, self.torch_copy_then_load).times)
        sweep = self.sweep(size) if a.sweep_runs else []
        st_size, names = 0, []
        if "safetensors" in wanted:
            log.info("writing the safetensors checkpoint (%d GiB, %d shards)",
                     a.safetensors_gib, a.safetensors_shards)
            st_size, names = self.write_safetensors()
            for name, fn in (("safetensors_api", lambda: self.safetensors_api(names)),
                             ("safetensors_fuse_library", self.safetensors_library(names))):
                log.info("%s", name)
                results[name] = timed_runs(self.cluster, a.runs, fn).summary(st_size)

        mbps = {k: v["MBps"] for k, v in results.items()}
        seconds = {k: v["median_s"] for k, v in results.items()}

        def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
            return round(a / b, digits) if a is not None and b else None
        # HDFS picks a replica at random per read, so on average a DataNode serves
        # 1/replication of the bytes it holds: the busiest one bounds any parallel read.
        placement = self.placement("raw.bin")
        cap = parse_link(a.link).rate_bytes_per_s
        placement_limit = round(size / (max(placement.values()) / a.replication / cap) / MB, 1)
        return {
            **self.recording.header(runs=a.runs, caps=self.hdfs.caps(
                latency="none added (this kernel has no sch_netem)")),
            "cluster": {"datanodes": a.datanodes, "block_size": a.block_size * MIB,
                        "replication": a.replication, "link_cap": a.link,
                        "link_cap_bytes_per_s_per_datanode": cap,
                        "link_delay": "none (this kernel has no sch_netem)",
                        "replica_bytes_per_datanode": placement,
                        "aggregate_cap_MBps": round(a.datanodes * cap / MB, 1),
                        "placement_limit_MBps": placement_limit},
            "checkpoint_bytes": size, "torch_checkpoint_bytes": torch_size,
            "cases": wanted,
            **{f"{case}_MBps": mbps.get(case) for case in CASES[:5]},
            "fuse_page_cache_fetched_vs_size":
                results.get("fuse_page_cache", {}).get("fetched_vs_size"),
            "torch_load_api_s": round(torch_api, 2) if torch_api else None,
            "torch_load_copy_then_load_s": round(torch_copy, 2) if torch_copy else None,
            "api_vs_single": ratio(mbps.get("api"), mbps.get("single_stream"), 2),
            "fuse_vs_single": ratio(mbps.get("fuse"), mbps.get("single_stream"), 2),
            "api_vs_raw": ratio(mbps.get("api"), mbps.get("raw_parallel")),
            "fuse_vs_raw": ratio(mbps.get("fuse"), mbps.get("raw_parallel")),
            "fuse_page_cache_vs_raw": ratio(mbps.get("fuse_page_cache"),
                                            mbps.get("raw_parallel")),
            "raw_vs_placement_limit": ratio(mbps.get("raw_parallel"), placement_limit),
            "api_vs_placement_limit": ratio(mbps.get("api"), placement_limit),
            "torch_api_vs_copy_then_load": ratio(torch_copy, torch_api, 2),
            "safetensors_bytes": st_size, "safetensors_shards": len(names),
            "safetensors_api_s": seconds.get("safetensors_api"),
            "safetensors_api_note": "ckpt.load_safetensors of the checkpoint's index: its "
                                    "shards read together",
            "safetensors_fuse_library_s": seconds.get("safetensors_fuse_library"),
            "safetensors_api_vs_library": ratio(seconds.get("safetensors_fuse_library"),
                                                seconds.get("safetensors_api"), 2),
            "safetensors_api_vs_raw": ratio(mbps.get("safetensors_api"),
                                            mbps.get("raw_parallel")),
            **self.page_cache_ratios(page_cache),
            "goals": {"page_cache_api_vs_lib_ge_1.0": _at_least(
                          self.page_cache_ratios(page_cache)["page_cache_api_vs_lib"], 1.0),
                      "api_vs_raw_ge_0.95": _at_least(ratio(mbps.get("api"),
                                                            mbps.get("raw_parallel")), 0.95),
                      "fuse_vs_raw_ge_0.9": _at_least(ratio(mbps.get("fuse"),
                                                            mbps.get("raw_parallel")), 0.9)},
            "stripe_defaults": {"stripe_mib": StripeConfig().stripe_size // MIB,
                                "concurrency": StripeConfig().max_concurrent_fetches},
            "sweep_best": max(sweep, key=lambda p: p["MBps"]) if sweep else None,
            "sweep": sweep,
            "details": results,
        }


def _at_least(value: float | None, goal: float) -> bool | None:
    return None if value is None else value >= goal


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def _ends_digest(tensors: dict) -> str:
    """sha256 of the first MiB of the first and the last tensor (by name): a check that
    costs nothing next to the load."""
    digest = hashlib.sha256()
    for name in (min(tensors), max(tensors)):
        digest.update(tensors[name].contiguous().view(torch.uint8)[:MIB].numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results/ckpt.json"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--size-gib", type=int, default=2)
    parser.add_argument("--datanodes", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=64, help="MiB")
    parser.add_argument("--replication", type=int, default=3,
                        help="HDFS's default; readers then pick a replica per read")
    parser.add_argument("--link", default="40MB/s", help="per-DataNode egress cap")
    parser.add_argument("--base-port", type=int, default=22000)
    parser.add_argument("--sweep-stripes", type=_ints, default=[2, 4, 8, 16],
                        help="MiB, comma-separated")
    parser.add_argument("--sweep-concurrency", type=_ints, default=[16, 32, 64])
    parser.add_argument("--sweep-runs", type=int, default=2, help="0: no sweep")
    parser.add_argument("--safetensors-gib", type=int, default=8)
    parser.add_argument("--safetensors-shards", type=int, default=8)
    parser.add_argument("--page-cache-gib", type=int, default=2,
                        help="the page_cache case's checkpoint (in memory twice at a time)")
    parser.add_argument("--page-cache-runs", type=int, default=5)
    args = parser.parse_args()
    # At its peak the work directory holds the torch file and the safetensors shards, and
    # HDFS holds both checkpoints and the safetensors, each ``replication`` times. Short of
    # that, the DataNodes refuse blocks 20 minutes in ("could only be replicated to 0 nodes").
    need = ((2 * args.size_gib + args.safetensors_gib) * args.replication
            + args.size_gib + args.safetensors_gib) << 30
    if select_cases(args.cases, CASES) == ["page_cache"]:  # no HDFS: the shards, once
        need = (args.page_cache_gib + args.page_cache_gib // 2) << 30
    free = shutil.disk_usage("/var/tmp").free
    if free < need:
        parser.error(f"needs about {need >> 30} GiB free under /var/tmp for the checkpoints "
                     f"and their {args.replication} HDFS replicas; {free >> 30} GiB are. Free "
                     f"some, or pass a smaller --safetensors-gib or --replication")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-", dir="/var/tmp") as tmp:
        bench = Bench(args, Path(tmp))
        try:
            result = bench.run()
        finally:
            bench.hdfs.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2))


if __name__ == "__main__":
    main()

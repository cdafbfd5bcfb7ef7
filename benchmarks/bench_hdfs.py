"""Baseline HDFS figures on a real local Hadoop 2.7.3 cluster, against their physical limits.

    .venv/bin/python benchmarks/bench_hdfs.py [--out bench-results/hdfs.json] [--runs 3]

Striped checkpoint reads (``stripedfs/``) only mean something relative to what a plain
client gets today and to what the hardware could give. This benchmark starts its own
2-DataNode cluster (base port 21000, state in a temporary directory, so it never touches a
developer's or the test suite's cluster) and measures:

* ``cluster_start_s`` -- warm start of the cluster (jars already cached),
  fresh state dir every run: the fixed cost every HDFS test and benchmark pays.
* ``namenode_rss_mb`` / ``datanode_rss_mb`` -- VmRSS of the cluster's JVMs (PIDs from the
  cluster's process records), sampled after each round of reads; the DataNode runs list
  both DataNodes round by round, ``per_datanode`` splits them.
* ``sequential_read_mb_s`` -- the **baseline**: one object read start to end by one thread
  through ``store.read_range`` in 4 MiB pieces, with each store backend (``hdfs`` =
  hdfs-native, ``webhdfs`` = HdfsCLI), written once with a 64 MiB block size.

  - uncapped: loopback is faster than any network, so the limit is the disk. Its
    **physical limit** ``disk`` is the same bytes read sequentially straight from the
    DataNodes' block files, in the same pieces; ``ratios.uncapped_vs_disk`` is
    backend / disk, taken run by run.
  - capped (``--link``, default 40 MB/s of egress per DataNode, tc on ``lo``): one stream
    is served by one DataNode at a time, so the **physical limit** is the cap itself;
    ``ratios.capped_vs_cap`` is backend / cap, run by run.

* ``link_check`` -- that the cap behaves like one network link per DataNode: under the cap,
  one stream from a file whose only block sits on one DataNode (alternating DataNodes by
  round), vs two concurrent streams from two such files on two different DataNodes.
  Aggregate MB/s and the ratio two/one (physical limit: 2.0, i.e. twice the cap) -- the
  headroom striping is meant to use.

Every read starts cold: the page cache is dropped (``sync; echo 3 > drop_caches``, root)
before each one, as on a node that has just (re)started a job. Timings on these shared
2-core machines are noisy, so every figure is the median of ``--runs`` runs, with the raw
runs alongside, and rounds interleave the backends so drift hits them alike. Units are
decimal: 1 MB = 10**6 bytes (rates and RSS), object and block sizes are in bytes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchlib import CappedCluster, Recording, drop_page_cache, figure

from bootseer.store import Store, open_store
from bootseer_dev.cluster import Cluster, ClusterSpec, LinkCap, parse_link, tc_available
from bootseer_dev.cluster.cluster import _port_free
from bootseer_dev.cluster.jars import ensure_jars

log = logging.getLogger("bench_hdfs")

MiB = 1 << 20
MB = 1e6
DATANODES = 2
REPLICATION = 1            # one replica: each block has exactly one DataNode to come from
BLOCK_SIZE = 64 * MiB
PIECE = 4 * MiB            # read_range size, the store's own IO_CHUNK
UNCAPPED_SIZE = 256 * MiB  # 4 blocks, ~1 s per read at loopback speed
CAPPED_SIZE = 128 * MiB    # 2 blocks, ~3.4 s per read at 40 MB/s
LINK_CHECK_SIZE = 64 * MiB  # exactly one block, so "all on one DataNode" is one placement
PLACEMENT_TRIES = 40       # each write lands on a given DataNode with p = 1/2
BACKENDS = ("hdfs", "webhdfs")
STORE_ROOT = "/bench"
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "bench-results" / "hdfs.json"

Cold = Callable[[], None]


# ----------------------------------------------------------------------------- helpers
def random_chunks(size: int) -> Iterator[bytes]:
    """`size` random bytes in PIECE chunks, so a put never holds the whole object."""
    for _ in range(size // PIECE):
        yield os.urandom(PIECE)


def read_sequentially(store: Store, key: str, size: int) -> None:
    """Read `key` start to end in PIECE ranges, one after the other."""
    for offset in range(0, size, PIECE):
        store.read_range(key, offset, min(PIECE, size - offset))


def read_mb_s(store: Store, key: str, size: int, cold: Cold) -> float:
    """One cold single-stream sequential read of `key`, in MB/s."""
    cold()
    t0 = time.perf_counter()
    read_sequentially(store, key, size)
    return size / (time.perf_counter() - t0) / MB


def concurrent_mb_s(streams: list[tuple[Store, str]], size: int, cold: Cold) -> float:
    """Cold sequential reads of several (store, key) at once, one thread each; aggregate MB/s."""
    cold()
    with ThreadPoolExecutor(len(streams)) as pool:
        t0 = time.perf_counter()
        futures = [pool.submit(read_sequentially, store, key, size) for store, key in streams]
        for future in futures:
            future.result()
        elapsed = time.perf_counter() - t0
    return len(streams) * size / elapsed / MB


def disk_mb_s(block_files: list[Path], cold: Cold) -> float:
    """Cold sequential read of block files straight from disk, in PIECE reads; MB/s."""
    cold()
    total = 0
    t0 = time.perf_counter()
    for path in block_files:
        with open(path, "rb", buffering=0) as fh:
            while chunk := fh.read(PIECE):
                total += len(chunk)
    return total / (time.perf_counter() - t0) / MB


def block_files(cluster: Cluster) -> set[Path]:
    """Every finalized block file (not its .meta) in the DataNodes' data dirs."""
    return {p for p in (cluster.state_dir / "data").rglob("blk_*") if p.name[4:].isdigit()}


def wait_ports_free(spec: ClusterSpec, timeout_s: float = 30.0) -> None:
    """Wait until a stopped cluster's ports can be bound again.

    Cluster.stop() may return while an exiting JVM still holds its listening sockets (it
    stops looking once /proc/PID/cmdline reads empty), and the next start() would then
    refuse the ports as busy.
    """
    deadline = time.monotonic() + timeout_s
    while busy := [p for p in spec.all_ports() if not _port_free(p)]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"ports {busy} still busy {timeout_s:.0f} s after stopping")
        time.sleep(0.1)


def rss_mb(pid: int | None) -> float:
    """VmRSS of a running process, in MB."""
    if pid is None:
        raise RuntimeError("a cluster process has no PID record")
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / MB
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


# ----------------------------------------------------------------------------- measurements
def measure_start(base_port: int, runs: int, tmp: Path) -> list[float]:
    """Seconds from Cluster.start() to 2 live DataNodes, warm cache, fresh state each run."""
    ensure_jars()  # the one-off download is not start-up
    times = []
    for i in range(runs):
        cluster = Cluster(ClusterSpec.with_base_port(
            base_port, datanodes=DATANODES, state_dir=tmp / f"start-{i}",
            block_size=BLOCK_SIZE, replication=REPLICATION))
        try:
            t0 = time.perf_counter()
            cluster.start()
            times.append(time.perf_counter() - t0)
        finally:
            cluster.stop()
        wait_ports_free(cluster.spec)
        log.info("start %d/%d: %.2f s", i + 1, runs, times[-1])
    return times


def place_on_datanode(cluster: Cluster, store: Store, dn: int) -> str:
    """Write single-block objects until one lands on DataNode `dn`; return its key.

    A client on the DataNodes' host gets a random DataNode per block, so this takes a few
    tries; misplaced objects are deleted.
    """
    for attempt in range(PLACEMENT_TRIES):
        key = f"link-check/dn{dn}-{attempt}"
        store.put(key, random_chunks(LINK_CHECK_SIZE))
        if all(b.datanodes == (dn,) for b in cluster.block_locations(f"{STORE_ROOT}/{key}")):
            return key
        store.delete(key)
    raise RuntimeError(f"{PLACEMENT_TRIES} single-block objects, none placed on DataNode {dn}")


def open_backend(cluster: Cluster, backend: str) -> Store:
    base = cluster.namenode_rpc_url if backend == "hdfs" else cluster.webhdfs_url
    return open_store(f"{base}{STORE_ROOT}", replication=REPLICATION, block_size=BLOCK_SIZE)


def measure_reads(cluster: Cluster, cap: LinkCap, runs: int, cold: Cold) -> dict[str, Any]:
    """Write the objects once, then `runs` rounds of every read measurement."""
    os.environ.update(cluster.env())
    # One store per concurrent stream, so two streams never share an HTTP session.
    stores = {b: [open_backend(cluster, b) for _ in range(DATANODES)] for b in BACKENDS}
    writer = stores["hdfs"][0]

    before = block_files(cluster)
    writer.put("uncapped", random_chunks(UNCAPPED_SIZE))
    disk = sorted(block_files(cluster) - before, key=lambda p: int(p.name[4:]))  # file order
    if sum(p.stat().st_size for p in disk) != UNCAPPED_SIZE:
        raise RuntimeError(f"block files of the uncapped object do not add up: {disk}")
    writer.put("capped", random_chunks(CAPPED_SIZE))
    link_keys = [place_on_datanode(cluster, writer, dn) for dn in range(DATANODES)]
    log.info("objects written: uncapped %d blocks on DataNodes %s, capped on %s, link check %s",
             len(disk), [b.datanodes for b in cluster.block_locations(f"{STORE_ROOT}/uncapped")],
             [b.datanodes for b in cluster.block_locations(f"{STORE_ROOT}/capped")], link_keys)

    # Warm-up, untimed and uncapped: every object read in full through each backend, so the
    # JIT has compiled the client's and every DataNode's read path (WebHDFS handler too).
    objects = {"uncapped": UNCAPPED_SIZE, "capped": CAPPED_SIZE,
               **{k: LINK_CHECK_SIZE for k in link_keys}}
    for b in BACKENDS:
        for key, size in objects.items():
            read_sequentially(stores[b][0], key, size)

    seq: dict[str, dict[str, list[float]]] = {
        "uncapped": {"disk": [], **{b: [] for b in BACKENDS}},
        "capped": {b: [] for b in BACKENDS}}
    one: dict[str, list[float]] = {b: [] for b in BACKENDS}
    two: dict[str, list[float]] = {b: [] for b in BACKENDS}
    nn_rss: list[float] = []
    dn_rss: list[list[float]] = [[] for _ in range(DATANODES)]
    for i in range(runs):
        cluster.set_link(None)
        seq["uncapped"]["disk"].append(disk_mb_s(disk, cold))
        for b in BACKENDS:
            seq["uncapped"][b].append(read_mb_s(stores[b][0], "uncapped", UNCAPPED_SIZE, cold))
        cluster.set_link(cap)
        for b in BACKENDS:
            seq["capped"][b].append(read_mb_s(stores[b][0], "capped", CAPPED_SIZE, cold))
            one[b].append(read_mb_s(stores[b][0], link_keys[i % DATANODES], LINK_CHECK_SIZE,
                                    cold))
            two[b].append(concurrent_mb_s(list(zip(stores[b], link_keys)), LINK_CHECK_SIZE,
                                          cold))
        status = cluster.status()
        nn_rss.append(rss_mb(status.namenode_pid))
        for d in status.datanodes:
            dn_rss[d.index].append(rss_mb(d.pid))
        log.info("round %d/%d MB/s: uncapped disk %.0f %s | capped %s | link check %s",
                 i + 1, runs, seq["uncapped"]["disk"][-1],
                 " ".join(f"{b} {seq['uncapped'][b][-1]:.0f}" for b in BACKENDS),
                 " ".join(f"{b} {seq['capped'][b][-1]:.1f}" for b in BACKENDS),
                 " ".join(f"{b} {one[b][-1]:.1f}->{two[b][-1]:.1f}" for b in BACKENDS))
    cluster.set_link(None)

    cap_mb_s = cap.rate_bytes_per_s / MB
    return {
        "namenode_rss_mb": figure(nn_rss, 1),
        "datanode_rss_mb": {**figure([x for r in zip(*dn_rss) for x in r], 1),
                            "per_datanode": [figure(r, 1) for r in dn_rss]},
        "sequential_read_mb_s": {cond: {name: figure(values) for name, values in by.items()}
                                 for cond, by in seq.items()},
        "ratios": {
            "uncapped_vs_disk": {b: figure([x / d for x, d in zip(seq["uncapped"][b],
                                                                   seq["uncapped"]["disk"])])
                                 for b in BACKENDS},
            "capped_vs_cap": {b: figure([x / cap_mb_s for x in seq["capped"][b]])
                              for b in BACKENDS},
        },
        "link_check": {
            "physical_limit_mb_s": {"one_stream": cap_mb_s, "two_streams": DATANODES * cap_mb_s},
            **{b: {"one_stream_mb_s": figure(one[b]), "two_streams_mb_s": figure(two[b]),
                   "ratio_two_over_one": figure([t / o for t, o in zip(two[b], one[b])])}
               for b in BACKENDS},
        },
    }


def run(base_port: int, runs: int, cap: LinkCap) -> dict[str, Any]:
    recording = Recording("hdfs")
    try:
        drop_page_cache()
        cold: Cold = drop_page_cache
    except OSError as exc:
        log.warning("cannot drop the page cache (%s): reads will be warm, not cold", exc)
        cold = os.sync
    with tempfile.TemporaryDirectory(prefix="bench-hdfs-") as tmp:
        start_times = measure_start(base_port, runs, Path(tmp))
        hdfs = CappedCluster(Path(tmp) / "reads", base_port=base_port, cap=cap,
                             block_size=BLOCK_SIZE, datanodes=DATANODES,
                             replication=REPLICATION)
        try:
            hdfs.start()
            reads = measure_reads(hdfs.cluster, cap, runs, cold)
        finally:
            hdfs.stop()
    return {
        **recording.header(runs=runs, caps=hdfs.caps(
            applies_to="capped rounds only (sequential_read_mb_s.capped, link_check)")),
        "page_cache_dropped": cold is drop_page_cache,
        "cluster": {"hadoop": "2.7.3", "datanodes": DATANODES, "replication": REPLICATION,
                    "block_size": BLOCK_SIZE, "base_port": base_port},
        "read_piece_bytes": PIECE,
        "object_sizes": {"uncapped": UNCAPPED_SIZE, "capped": CAPPED_SIZE,
                         "link_check": LINK_CHECK_SIZE},
        "cluster_start_s": figure(start_times, 2),
        **reads,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON result file")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--link", default="40MB/s", help="per-DataNode cap RATE[,DELAY]")
    parser.add_argument("--base-port", type=int, default=21000, help="cluster base port")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if reason := tc_available():
        parser.error(f"the link cap needs tc: {reason}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s", stream=sys.stderr)
    logging.getLogger("hdfs").setLevel(logging.WARNING)  # HdfsCLI logs every request
    # SIGTERM unwinds like Ctrl-C, so the cluster is stopped in the finally.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    result = run(args.base_port, args.runs, parse_link(args.link))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log.info("wrote %s in %.0f s", args.out, result["elapsed_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

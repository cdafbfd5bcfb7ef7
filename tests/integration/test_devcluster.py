"""The dev cluster against a real Hadoop 2.7.3 HDFS: start, status, placement, link cap, stop.

One 2-DataNode cluster per module (start-up ~5 s), in a tmp state dir on free non-default
ports, so it never collides with a cluster someone else runs on the machine. Nothing is
mocked. If the cluster cannot start, the tests fail. (The spec's units and checks:
``unit/test_devcluster_units.py``.)
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bootseer_dev.cluster import (
    Cluster,
    ClusterSpec,
    parse_link,
    tc_available,
)
from bootseer_dev.cluster.cluster import _port_free
from bootseer_dev.cluster.linkcap import DEV, ROOT_HANDLE

pytestmark = pytest.mark.hdfs

MiB = 1 << 20
CAP = parse_link("10MB/s")         # per DataNode: low, so a busy 2-core box keeps up
CAPPED_FILE = 8 * MiB              # ~0.8 s per stream at the cap


def _unavailable(reason: str) -> None:
    """Fail with the reason: a missing component is an error, in CI and out of it."""
    pytest.fail(f"dev cluster unavailable: {reason}", pytrace=False)


def _free_base_port(datanodes: int) -> int:
    """A base port whose whole port layout is free (random, so parallel runs rarely race)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 30000, 100)
        ports = ClusterSpec.with_base_port(base, datanodes=datanodes,
                                           state_dir=Path("/nonexistent")).all_ports()
        if all(_port_free(p) for p in ports):
            return base
    raise RuntimeError("no free port range in 20000-30000")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = ClusterSpec.with_base_port(_free_base_port(2), datanodes=2, block_size=MiB,
                                      state_dir=tmp_path_factory.mktemp("hdfs-state"))
    c = Cluster(spec)
    t0 = time.monotonic()
    try:
        c.start()
    except Exception as exc:  # noqa: BLE001 - any failure to start is reported, not hidden
        c.stop()
        _unavailable(f"{type(exc).__name__}: {exc}")
    print(f"dev cluster up in {time.monotonic() - t0:.1f}s at {c.namenode_rpc_url}")
    yield c
    c.stop()


@pytest.fixture
def running(cluster):
    """The module's cluster, (re)started if an earlier test stopped it (start is idempotent)."""
    cluster.start()
    return cluster


def _on_datanode(cluster: Cluster, client, prefix: str, data: bytes, dn: int) -> str:
    """Write single-block files until one lands on DataNode `dn`.

    Placement for a client on a DataNode host (127.0.0.1 is every DataNode's host) picks a
    random DataNode per block, so "this file lives on dn" takes a few tries at 1/N each.
    """
    for k in range(40):
        path = f"{prefix}-{k}"
        client.write(path, data, overwrite=True, blocksize=max(len(data), MiB))
        if all(b.datanodes == (dn,) for b in cluster.block_locations(path)):
            return path
        client.delete(path)
    raise AssertionError(f"40 single-block files, none placed on DataNode {dn}")


def _read_webhdfs(client, path: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    with client.read(path, chunk_size=MiB) as reader:
        for chunk in reader:
            n += len(chunk)
    return n, time.perf_counter() - t0


_STORE_SCRIPT = r"""
import json, os, sys, threading, time
from bootseer.store import open_store
port, mode = int(sys.argv[1]), sys.argv[2]
store = open_store(f"hdfs://127.0.0.1:{port}/", replication=1)
def read(key, limit=None):
    size = store.stat(key).size if limit is None else limit
    buffer = memoryview(bytearray(4 << 20))
    t0 = time.perf_counter()
    for offset in range(0, size, len(buffer)):
        store.read_range_into(key, offset, buffer[: min(len(buffer), size - offset)])
    return size, time.perf_counter() - t0
out = {}
if mode == "roundtrip":
    data = os.urandom(3 * (1 << 20) + 12345)
    store.put("store-roundtrip", data)
    out["equal"] = store.get("store-roundtrip") == data
    out["size"] = store.stat("store-roundtrip").size
else:
    keys = [p.lstrip("/") for p in sys.argv[3:]]
    for k in keys:  # warm the path to each DataNode: 1 MiB each
        read(k, 1 << 20)
    n, dt = read(keys[0])
    out["single"] = n / dt
    res = {}
    threads = [threading.Thread(target=lambda k=k: res.__setitem__(k, read(k))) for k in keys]
    t0 = time.perf_counter()
    [t.start() for t in threads]
    [t.join() for t in threads]
    out["aggregate"] = sum(v[0] for v in res.values()) / (time.perf_counter() - t0)
print(json.dumps(out))
"""


def _hdfs_store(cluster: Cluster, *args: str) -> dict:
    """Run Bootseer's hdfs:// store in a subprocess with the cluster's client env()."""
    env = {**os.environ, **cluster.env()}
    proc = subprocess.run([sys.executable, "-c", _STORE_SCRIPT,
                           str(cluster.spec.namenode_rpc_port), *args],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _tc_lines(cluster: Cluster) -> list[str]:
    out = subprocess.run(["tc", "class", "show", "dev", DEV], capture_output=True, text=True)
    rec = json.loads((cluster.state_dir / "tc.json").read_text()) \
        if (cluster.state_dir / "tc.json").exists() else {"classes": []}
    return [ln for ln in out.stdout.splitlines() if any(f" {c} " in ln for c in rec["classes"])]


# --------------------------------------------------------------------------- real cluster
def test_status_shows_two_live_datanodes(running):
    st = running.status()
    assert st.namenode_up and st.healthy, st.format()
    assert st.live_datanodes == 2 and st.dead_datanodes == 0
    assert [d.live for d in st.datanodes] == [True, True]
    assert running.namenode_rpc_url == f"hdfs://127.0.0.1:{running.spec.namenode_rpc_port}"
    assert running.spec.namenode_rpc_port != 9000  # never the default: others may use it
    cli = subprocess.run([sys.executable, "-m", "bootseer_dev.cluster", "status",
                          "--state-dir", str(running.state_dir)], capture_output=True, text=True)
    assert cli.returncode == 0 and "2/2 live" in cli.stdout, cli.stdout + cli.stderr


def test_second_start_is_a_noop(running):
    pids = {d.index: d.pid for d in running.status().datanodes}
    assert Cluster(running.spec).start() is False
    assert {d.index: d.pid for d in running.status().datanodes} == pids


def test_multiblock_file_spreads_over_both_datanodes(running):
    client = running.webhdfs_client()
    data = os.urandom(16 * MiB)  # 16 blocks of 1 MiB: all on one DataNode with p = 2**-15
    client.write("/spread", data, overwrite=True)
    blocks = running.block_locations("/spread")
    assert len(blocks) == 16 and all(len(b.datanodes) == 1 for b in blocks)
    assert {b.datanodes[0] for b in blocks} == {0, 1}
    # fsck (the Java tool) sees the same placement.
    fsck = running.fsck("/spread")
    assert "16 block(s)" in fsck
    for i in (0, 1):
        assert f"127.0.0.1:{running.spec.datanode_ports(i).xfer}" in fsck
    with client.read("/spread") as r:
        assert r.read() == data


def test_hdfs_store_roundtrip(running):
    out = _hdfs_store(running, "roundtrip")
    assert out == {"equal": True, "size": 3 * MiB + 12345}


def test_env_cli_prints_exports(running):
    cli = subprocess.run([sys.executable, "-m", "bootseer_dev.cluster", "env",
                          "--state-dir", str(running.state_dir)], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    keys = {ln.split("=", 1)[0].removeprefix("export ") for ln in cli.stdout.splitlines()}
    assert {"JAVA_HOME", "CLASSPATH", "HADOOP_CONF_DIR"} <= keys
    assert "*" not in running.env()["CLASSPATH"]  # an explicit jar list


def test_datanode_restart_keeps_its_blocks(running):
    client = running.webhdfs_client()
    data = os.urandom(2 * MiB)
    path = _on_datanode(running, client, "/restart", data, 1)
    assert running.stop_datanode(1, sig=signal.SIGKILL)
    assert not running.status().datanodes[1].running
    running.start_datanode(1)
    st = running.status()
    assert st.datanodes[1].running and st.live_datanodes == 2
    with client.read(path) as r:
        assert r.read() == data


def test_link_cap_limits_each_datanode(running):
    reason = tc_available()
    if reason:
        _unavailable(f"tc: {reason}")
    client = running.webhdfs_client()
    data = os.urandom(CAPPED_FILE)
    paths = [_on_datanode(running, client, f"/capped{dn}", data, dn) for dn in (0, 1)]
    for path in paths:  # warm each DataNode's WebHDFS path (JIT, its DFSClient) uncapped
        _read_webhdfs(client, path)
    running.set_link(CAP)
    try:
        assert len(_tc_lines(running)) == 2
        cap = CAP.rate_bytes_per_s
        # WebHDFS: one stream from one DataNode runs at about the cap ...
        n, dt = _read_webhdfs(client, paths[0])
        single = n / dt
        assert n == CAPPED_FILE
        assert 0.6 * cap <= single <= 1.15 * cap, f"single stream {single / 1e6:.1f} MB/s"
        # ... and two streams from two DataNodes get about twice that.
        results: dict[str, tuple[int, float]] = {}
        threads = [threading.Thread(target=lambda p=p: results.__setitem__(
            p, _read_webhdfs(running.webhdfs_client(), p))) for p in paths]
        t0 = time.perf_counter()
        [t.start() for t in threads]
        [t.join() for t in threads]
        aggregate = 2 * CAPPED_FILE / (time.perf_counter() - t0)
        assert aggregate >= 1.6 * single, f"{aggregate / 1e6:.1f} vs {single / 1e6:.1f} MB/s"
        # hdfs:// stores read from the transfer port: the same cap holds there.
        pa = _hdfs_store(running, "capped", *paths)
        assert 0.6 * cap <= pa["single"] <= 1.15 * cap, pa
        assert pa["aggregate"] >= 1.6 * pa["single"], pa
        print(f"cap {CAP}: webhdfs single {single / 1e6:.1f} MB/s, two-DN aggregate "
              f"{aggregate / 1e6:.1f} MB/s; hdfs:// single {pa['single'] / 1e6:.1f}, "
              f"aggregate {pa['aggregate'] / 1e6:.1f} MB/s")
    finally:
        running.set_link(None)
    assert _tc_lines(running) == []


def test_stop_removes_processes_and_tc_rules(running):
    if tc_available() is None:
        running.set_link(CAP)
        assert len(_tc_lines(running)) == 2
    pids = [running.status().namenode_pid] + [d.pid for d in running.status().datanodes]
    assert running.stop() is True
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX"
    assert not (running.state_dir / "tc.json").exists()
    tc = subprocess.run(["tc", "filter", "show", "dev", DEV, "parent", ROOT_HANDLE],
                        capture_output=True, text=True)
    ports = {str(running.spec.datanode_ports(i).xfer) for i in (0, 1)}
    assert not any(f"{int(p):04x}0000" in tc.stdout for p in ports)
    st = running.status()
    assert not st.namenode_running and not any(d.running for d in st.datanodes)
    assert running.stop() is False  # nothing left to stop

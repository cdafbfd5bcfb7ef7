"""Shared fixtures and helpers for the Bootseer test suite."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests import store_contract as a module

IN_CI = os.environ.get("CI", "").lower() == "true"


def wait_until(condition: Callable[[], object], seconds: float = 10.0) -> None:
    """Poll ``condition`` until it holds; fail the test after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Keep tests away from the machine's real config, store and caches."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "state"))
    for name in list(os.environ):
        if name.startswith("BOOTSEER_") and name not in ("BOOTSEER_HDFS_CACHE",):
            monkeypatch.delenv(name)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI a skipped test is a failure: a component that cannot start must be loud."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if IN_CI and skipped and exitstatus == 0:
        reporter.write_line(f"CI=true: {len(skipped)} test(s) skipped; failing the run",
                            red=True)
        session.exitstatus = 1


@pytest.fixture(scope="session")
def hdfs_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A real HDFS 2.7.3 cluster (NameNode + 2 DataNodes), started once per session.

    Small blocks (1 MiB) spread every multi-MiB object over both DataNodes; replication 2
    lets a DataNode die mid-read. Ports start at 19000 so a developer's own cluster on the
    default ports is left alone. If it cannot start, the tests that need it fail (in CI and
    out of it) with the cluster's own error and log tail.
    """
    from bootseer_dev.cluster import Cluster, ClusterSpec

    spec = ClusterSpec.with_base_port(
        19000, datanodes=2, replication=2, block_size=1 << 20,
        state_dir=tmp_path_factory.mktemp("hdfs"),
    )
    cluster = Cluster(spec)
    cluster.start()
    os.environ.update({k: v for k, v in cluster.env().items() if not k.startswith("BOOTSEER_")})
    yield cluster
    cluster.stop()


#: In-process swarms listen on addresses of a link of their own: a swarm never dials
#: loopback.
LOCAL_PEER_NET = "198.19.254.0/24"
LOCAL_PEERS = tuple(f"198.19.254.{i}" for i in range(1, 5))


@pytest.fixture(scope="session")
def local_peer_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A link (``bsp2p<pid>``, one end of a veth pair: this kernel has no dummy links)
    holding LOCAL_PEERS in this namespace, for swarms in the test's own process, and a
    peer key for them; the pair is removed at the end."""
    import subprocess

    link = f"bsp2p{os.getpid()}"[:13]  # its own: concurrent runs keep their addresses
    if os.geteuid() != 0:
        reason = "in-process swarms need root to add a dummy link for their addresses"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    subprocess.run(["ip", "link", "add", link, "type", "veth", "peer", "name", link + "1"],
                   check=True)
    try:
        for address in LOCAL_PEERS:
            subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", link], check=True)
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
        key = tmp_path_factory.mktemp("p2pkey") / "p2p.key"
        key.write_bytes(os.urandom(32))
        key.chmod(0o600)
        yield key
    finally:
        subprocess.run(["ip", "link", "del", link], check=True)


@pytest.fixture
def local_swarm(local_peer_key: Path):
    """``local_swarm(i=0, **p2p_overrides)``: a Swarm listening on LOCAL_PEERS[i]."""
    from bootseer.config import P2PConfig
    from bootseer.p2p.swarm import Swarm

    def make(i: int = 0, **overrides) -> Swarm:
        settings = {"networks": (LOCAL_PEER_NET,), **overrides}
        return Swarm(P2PConfig(enabled=True, listen=f"{LOCAL_PEERS[i]}:0",
                               key_file=local_peer_key, **settings))

    return make

"""Shared fixtures and hooks for the Bootseer test suite.

The tests come in three tiers, one directory each; a test's tier marker comes from its
directory (``-m unit``, ``-m "not system"``):

* ``unit/``: no root, no services, no network, no FUSE, no servers in subprocesses; the
  whole tier runs in under a minute as a normal user (``make test-fast``).
* ``integration/``: one real component: HDFS, FUSE, runc, an engine, pip.
* ``system/``: the node agent with engines, the fleet lab, p2p clusters.

Helpers shared by test modules live in ``support/`` (imported as ``support.<module>``),
fixtures here and in a tier's own conftest; a test module never imports another.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # test modules import support.* from here

from support.ci import IN_CI, require  # noqa: E402 (needs the path above)
from support.durations import FileDurations  # noqa: E402
from support.peers import LOCAL_PEER_NET, LOCAL_PEERS  # noqa: E402

TIERS = ("unit", "integration", "system")
#: Fixtures that start HDFS: the shared cluster, and the fleet lab (its nodes' HDFS).
HDFS_FIXTURES = ("hdfs_cluster", "lab")
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets its directory's tier marker; a test that starts HDFS through a fixture
    (directly or through another one) gets ``hdfs``, so ``-m "not hdfs"`` starts none."""
    for item in items:
        tier = Path(item.path).relative_to(TESTS).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives under one of {TIERS}")
        item.add_marker(tier)
        if any(name in HDFS_FIXTURES for name in getattr(item, "fixturenames", ())):
            item.add_marker("hdfs")
        if item.get_closest_marker("gpu") and not _has_cuda():
            item.add_marker(pytest.mark.skip(reason=NO_GPU))


#: Why a GPU test did not run: the one skip CI allows, because CI can have no GPU.
NO_GPU = ("no CUDA device: CI machines have none; these run on a GPU machine "
          "(make test-gpu)")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _no_environment_left_mounted(tmp_path_factory: pytest.TempPathFactory):
    """A restore as root mounts the environment (bootseer.snapshot.mount): one a test left
    mounted under the session's temporary directories is unmounted after it."""
    yield
    if os.geteuid() != 0:
        return
    from bootseer.mounts import overlays, unmount

    base = str(tmp_path_factory.getbasetemp()) + "/"
    for mount in reversed(overlays()):
        if mount.target.startswith(base) and "/envs/" in (mount.upper or ""):
            unmount(Path(mount.target))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(FileDurations(), "file-durations")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI a skipped test is a failure: a component that cannot start must be loud. The
    exception is a GPU test on a machine without one, reported as not run."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    not_run = [report for report in skipped if "gpu" in report.keywords]
    if not_run and reporter:
        reporter.ensure_newline()
        reporter.write_line(f"{len(not_run)} GPU test(s) not run: {NO_GPU}", yellow=True)
    skipped = [report for report in skipped if "gpu" not in report.keywords]
    if IN_CI and skipped and exitstatus == 0:
        reporter.write_line(f"CI=true: {len(skipped)} test(s) skipped; failing the run",
                            red=True)
        session.exitstatus = 1


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


@pytest.fixture
def dirs(tmp_path: Path):
    """A test's working directories, made empty: ``store`` (a ``file://`` store), ``cache``
    (the caller's cache), ``agent-cache`` (the node agent's), ``image`` (images written
    there), ``mnt`` (a mount point: unmounted afterwards if still mounted), ``ref`` (a
    reference extraction) and ``run`` (sockets)."""
    paths = {name: tmp_path / name
             for name in ("store", "cache", "agent-cache", "image", "mnt", "ref", "run")}
    for path in paths.values():
        path.mkdir()
    yield paths
    from bootseer.mounts import is_mounted

    if is_mounted(paths["mnt"]):
        subprocess.run(["umount", "-l", str(paths["mnt"])], check=False)


@pytest.fixture
def nothing_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run in an empty working directory and check it is still empty afterwards."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    yield work
    assert list(work.iterdir()) == []


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


def _remove_links_of_dead_runs() -> None:
    """A run that crashed (no teardown) left its ``bsp2p<pid>`` link and the LOCAL_PEERS
    on it: gone, they would make the lab's "nothing outside is reachable" check reach
    them. Only links whose run's pid is gone are removed (each link's peer is its name
    and "1": removing the link removes both)."""
    names = {path.name for path in Path("/sys/class/net").iterdir()}
    for name in names:
        pid = name.removeprefix("bsp2p")
        if pid != name and pid.isdigit() and name + "1" in names \
                and not Path(f"/proc/{pid}").exists():
            subprocess.run(["ip", "link", "del", name], check=False)


@pytest.fixture(scope="session")
def local_peer_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A link (``bsp2p<pid>``, one end of a veth pair: this kernel has no dummy links)
    holding LOCAL_PEERS in this namespace, for swarms in the test's own process, and a
    peer key for them; the pair is removed at the end."""
    link = f"bsp2p{os.getpid()}"[:13]  # its own: concurrent runs keep their addresses
    require(os.geteuid() != 0 and "adding a link for their addresses needs root",
            "in-process swarms")
    _remove_links_of_dead_runs()
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

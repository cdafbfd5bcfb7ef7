"""The emulated GPU nodes' node agents: one `bootseer agent` per node, in its namespace.

Each node has a directory of its own in the lab's state dir (`nodes/n<i>/`): the agent's
config file (the lab's store, the node's cache dir, its socket, /metrics on the node's
address, with `--p2p` its peer-to-peer session there too), the socket, the cache and the
log. The agent is started in the node's cgroup and network namespace only
(`bootseer_dev.cgroups.placed_argv`): its store traffic leaves through the node's capped
link, while its FUSE mounts stay in the host's mount namespace, where `bootseer-runtime`
and runc, started with the node's config, find them as on a production node. Everything
of a node (agent, engine and its containers, commands run on it) is in the node's cgroup:
its CPU is counted apart, and capped with ``node_cpu``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bootseer_dev.cgroups import placed_argv
from bootseer_dev.cluster.process import ProcessRecord, launch, log_tail, why_not_running

from .spec import LAB_NET, METRICS_PORT, P2P_PORT, LabSpec
from .state import LabState

__all__ = ["AgentStartError", "NodeFiles", "agent_env", "agent_health", "on_node",
           "start_agents", "start_engines"]

#: A Unix socket path is at most 107 bytes.
MAX_SOCKET_PATH = 107


def on_node(spec: LabSpec, i: int) -> list[str]:
    """A prefix that runs a command on node i: in its cgroup and its network namespace."""
    return placed_argv(spec.node_cgroup(i), spec.node(i).netns)


class AgentStartError(RuntimeError):
    """A node's agent did not come up; the message has its log's tail."""


@dataclass(frozen=True)
class NodeFiles:
    """Where node i's agent keeps its files."""

    root: Path

    @classmethod
    def of(cls, spec: LabSpec, i: int) -> NodeFiles:
        return cls(spec.state_dir / "nodes" / f"n{i}")

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def socket(self) -> Path:
        return self.root / "agent.sock"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    @property
    def log(self) -> Path:
        return self.root / "agent.log"

    @property
    def docker_root(self) -> Path:
        """The node's Docker engine (``--engines``): its data, exec root, socket, log."""
        return self.root / "docker"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.docker_root / 'docker.sock'}"


def _write_config(spec: LabSpec, i: int, files: NodeFiles, python_serving: bool) -> None:
    # json.dumps of a str is a valid TOML basic string.
    files.root.mkdir(parents=True, exist_ok=True)
    files.config.write_text(
        f"store = {json.dumps(spec.store_url())}\n"
        f"cache_dir = {json.dumps(str(files.cache_dir))}\n"
        "[agent]\n"
        f"socket = {json.dumps(str(files.socket))}\n"
        f"metrics_listen = {json.dumps(f'{spec.node(i).address}:{METRICS_PORT}')}\n"
        f"node_name = {json.dumps(spec.node(i).role)}\n"  # in job reports
        "[image]\n"  # every start on a lab node may record its image's hot list
        "record_images = [\"*\"]\n"
        + ("passthrough = false\nkernel_metadata = false\n" if python_serving else "")
        + "[checkpoint]\n"  # containers on the lab's nodes may mount the lab's HDFS
        f"allowed = {json.dumps([spec.checkpoint_prefix()] if spec.datanodes else [])}\n"
        + ("[p2p]\n"  # the nodes of a job fetch from each other, on the lab switch
           "enabled = true\n"
           f"listen = {json.dumps(f'{spec.node(i).address}:{P2P_PORT}')}\n"
           f"seed_after_start = {spec.seed_after_start}\n"
           f"key_file = {json.dumps(str(_peer_key(spec)))}\n"
           f"networks = {json.dumps([str(LAB_NET)])}\n"
           # the lab's checkpoints may be shared between the nodes of a job
           f"checkpoints = {json.dumps([spec.checkpoint_prefix()] if spec.datanodes else [])}\n"
           if spec.p2p else ""))


def _peer_key(spec: LabSpec) -> Path:
    """The lab's peer key (``p2p.key_file``), the same for every node: made once, 0600."""
    path = spec.state_dir / "p2p.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with open(fd, "wb") as f:
            f.write(os.urandom(32))
    return path


def agent_env(client_env: dict[str, str]) -> dict[str, str]:
    """The agents' environment: this one plus the store's client settings, without any
    BOOTSEER_* setting (those would override the node's config file)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env.update({k: v for k, v in client_env.items() if not k.startswith("BOOTSEER_")})
    return env


def agent_health(files: NodeFiles, timeout: float = 2.0) -> dict | None:
    """The agent's /v1/health answer, or None if nothing answers on its socket."""
    from bootseer.agents.client import AgentClient, AgentUnavailable

    if not files.socket.exists():
        return None
    try:
        with AgentClient(files.socket, timeout=timeout, answer_timeout=timeout) as client:
            return client.health()
    except AgentUnavailable:
        return None


def start_agents(spec: LabSpec, state: LabState, env: dict[str, str],
                 timeout_s: float = 60.0, indices: list[int] | None = None, *,
                 python_serving: bool = False) -> None:
    """Start the agents of ``indices`` (default: every node), record them, and wait (at
    most timeout_s) until each one answers its health check with its own pid. With
    ``python_serving``, their mounts' servers answer every read and lookup themselves (no
    passthrough, no metadata image): how a node served images before the kernel did, for
    benchmarks to compare with."""
    started: list[tuple[NodeFiles, ProcessRecord]] = []
    for i in range(spec.nodes) if indices is None else indices:
        files = NodeFiles.of(spec, i)
        if len(str(files.socket)) > MAX_SOCKET_PATH:
            raise AgentStartError(f"socket path {files.socket} is longer than "
                                  f"{MAX_SOCKET_PATH} bytes: use a shorter --state-dir")
        _write_config(spec, i, files, python_serving)
        files.socket.unlink(missing_ok=True)
        argv = [*on_node(spec, i), sys.executable, "-m", "bootseer",
                "--config", str(files.config), "agent", "--socket", str(files.socket)]
        # The socket path names this lab's node: it is the marker that proves a pid ours.
        rec = launch(f"agent-n{i}", argv, files.log, str(files.socket), env=env)
        state.add(state.processes, rec)
        started.append((files, rec))
    deadline = time.monotonic() + timeout_s
    for files, rec in started:
        while True:
            why = why_not_running(rec)
            if why:
                raise AgentStartError(f"{rec.role} exited ({why}); {files.log}:\n"
                                      f"{log_tail(files.log)}")
            health = agent_health(files)
            if health and health.get("pid") == rec.pid:
                break
            if time.monotonic() > deadline:
                raise AgentStartError(f"{rec.role} did not answer on {files.socket} within "
                                      f"{timeout_s:.0f}s; {files.log}:\n{log_tail(files.log)}")
            time.sleep(0.1)


def start_engines(spec: LabSpec, state: LabState, timeout_s: float = 60.0) -> None:
    """Start a Docker engine on every node (``--engines``), record it, and wait until each
    answers on its socket.

    Each engine runs in its node's network namespace (its pulls cross the node's cap),
    with its data under the node's directory, Bootseer's runtime as deployed
    (``deploy/docker-daemon.json``: ``--runtime bootseer`` is ``bootseer-runtime``), and
    the lab's registry as an insecure one (plain HTTP). ``BOOTSEER_CONFIG`` in its
    environment reaches the runtime it starts, which so asks the node's own agent.
    """
    from bootseer_dev.engines import deployed_daemon_config, dockerd_argv

    runtime = Path(sys.executable).parent / "bootseer-runtime"
    config = deployed_daemon_config(runtime) | {
        "insecure-registries": [spec.registry_address] if spec.origins else [],
        # The node's containers in the node's cgroup (cgroupfs: a path, not a slice).
        "exec-opts": ["native.cgroupdriver=cgroupfs"]}
    started = []
    for i in range(spec.nodes):
        files = NodeFiles.of(spec, i)
        node_config = config | {"cgroup-parent": "/" + spec.node_cgroup(i)}
        argv = [*on_node(spec, i), *dockerd_argv(files.docker_root, node_config)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
        env["BOOTSEER_CONFIG"] = str(files.config)
        rec = launch(f"dockerd-n{i}", argv, files.docker_root / "dockerd.log",
                     files.docker_host, env=env)
        state.add(state.processes, rec)
        started.append((files, rec))
    deadline = time.monotonic() + timeout_s
    for files, rec in started:
        while subprocess.run(["docker", "-H", files.docker_host, "version"],
                             capture_output=True, stdin=subprocess.DEVNULL).returncode:
            why = why_not_running(rec)
            if why or time.monotonic() > deadline:
                raise AgentStartError(f"{rec.role} did not answer on {files.docker_host} "
                                      f"({why or f'{timeout_s:.0f}s'}); {rec.log}:\n"
                                      f"{log_tail(Path(rec.log))}")
            time.sleep(0.2)

"""Real engines on this machine, each private to its caller: dockerd, docker-registry and
the Bootseer node agent.

The tests and ``bench-image`` start the same components the same way, so that what a test
checks is what the benchmark measures: a Docker engine with its own data root, exec root
and socket (and no firewall or bridge changes, so it disturbs nothing else on the host);
a registry (Debian's ``docker-registry``, distribution 2.8) on a loopback port with a
filesystem store; a ``bootseer agent`` on a socket of its own. Each start waits until the
component answers, or raises :class:`EngineUnavailable` with its log's tail, so that a
caller can say why (the tests fail in CI and skip elsewhere; the benchmark stops).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Dockerd", "EngineUnavailable", "Registry", "deployed_daemon_config", "dockerd_argv",
           "free_port", "registry_config", "start_agent"]

#: Seconds a component may take to answer after it was started.
START_TIMEOUT = 60.0
#: Docker's configuration as Bootseer deploys it (the runtime ``bootseer``).
DEPLOYED_DAEMON_JSON = Path(__file__).resolve().parents[2] / "deploy" / "docker-daemon.json"


class EngineUnavailable(RuntimeError):
    """A real component could not be started here; the message says why."""


def deployed_daemon_config(runtime: Path) -> dict:
    """``deploy/docker-daemon.json`` with the runtime ``bootseer`` at ``runtime`` (this
    environment's ``bootseer-runtime``), so that engines here run as deployed ones do."""
    config = json.loads(DEPLOYED_DAEMON_JSON.read_text())
    config["runtimes"]["bootseer"]["path"] = str(runtime)
    return config


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``argv`` with its output in ``log`` (a file, not a pipe nobody reads: a component
    that logs a lot must not block on it)."""
    try:
        with open(log, "wb") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    except FileNotFoundError as exc:
        raise EngineUnavailable(f"{argv[0]}: {exc} (scripts/install-system-deps.sh "
                                "installs it)") from exc


def _wait_up(up: Callable[[], bool], what: str, proc: subprocess.Popen, log: Path,
             timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not up():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            raise EngineUnavailable(f"{what} did not start: "
                                    f"{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen, timeout: float) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def registry_config(root: Path, addr: str) -> Path:
    """``root/config.yml`` for a docker-registry with its filesystem store in
    ``root/data``, serving plain HTTP on ``addr`` (``host:port``)."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n"
                      f"    rootdirectory: {root}/data\n"
                      f"http:\n  addr: {addr}\n")
    return config


@dataclass
class Registry:
    """docker-registry serving ``root/data`` over plain HTTP on 127.0.0.1:``port`` (Docker
    and skopeo talk to a loopback registry without TLS when told ``insecure``)."""

    root: Path
    port: int
    proc: subprocess.Popen

    @classmethod
    def start(cls, root: Path) -> Registry:
        port = free_port()
        config = registry_config(root, f"127.0.0.1:{port}")
        log = root / "registry.log"
        proc = _spawn(["docker-registry", "serve", str(config)], log)

        def up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        _wait_up(up, "docker-registry", proc, log)
        return cls(root, port, proc)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def push(self, layout: Path, ref: str) -> str:
        """Copy the OCI layout's image as it is (same blobs, same digests) to ``ref``
        (``repo:tag``) with skopeo; the image's name in this registry."""
        name = f"{self.address}/{ref}"
        result = subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                                 f"oci:{layout}", f"docker://{name}"],
                                capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise EngineUnavailable(f"skopeo could not push to {name}: {result.stderr}")
        return name

    def stop(self) -> None:
        _stop(self.proc, 30)


def dockerd_argv(root: Path, config: dict, data_root: Path | None = None) -> list[str]:
    """A private engine's command line: ``config`` written to ``root/daemon.json``; data
    (images, containers) in ``data_root`` (default ``root/data``), exec root, pid file and
    socket ``root/docker.sock`` under ``root``; no firewall or bridge changes."""
    root.mkdir(parents=True, exist_ok=True)
    config_file = root / "daemon.json"
    config_file.write_text(json.dumps(config))
    return ["dockerd", "--config-file", str(config_file),
            "--data-root", str(data_root or root / "data"),
            "--exec-root", str(root / "exec"), "--pidfile", str(root / "docker.pid"),
            "-H", f"unix://{root / 'docker.sock'}", "--iptables=false", "--bridge=none"]


@dataclass
class Dockerd:
    """A Docker engine with private roots under ``root`` and the socket ``root/docker.sock``.

    ``config`` is its ``daemon.json`` (:func:`deployed_daemon_config` for the runtime
    ``bootseer``); ``env`` reaches the engine and so the runtimes it starts (the agent's
    socket). ``data_root`` (images, containers) defaults to ``root/data``.
    """

    root: Path
    proc: subprocess.Popen

    @classmethod
    def start(cls, root: Path, *, data_root: Path | None = None,
              config: dict | None = None, env: dict[str, str] | None = None) -> Dockerd:
        sock, log = root / "docker.sock", root / "dockerd.log"
        proc = _spawn(dockerd_argv(root, config or {}, data_root), log, env)
        dockerd = cls(root, proc)
        _wait_up(lambda: sock.exists() and dockerd.docker("version", check=False).returncode == 0,
                 "dockerd", proc, log)
        return dockerd

    @property
    def host(self) -> str:
        return f"unix://{self.root / 'docker.sock'}"

    def docker(self, *args: str | Path, check: bool = True,
               timeout: float = 600) -> subprocess.CompletedProcess:
        """The docker CLI against this engine."""
        result = subprocess.run(["docker", "-H", self.host, *map(str, args)],
                                capture_output=True, text=True, timeout=timeout,
                                stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise RuntimeError(f"docker {' '.join(map(str, args))} exited "
                               f"{result.returncode}: {result.stderr[-3000:]}")
        return result

    def stop(self) -> None:
        _stop(self.proc, 60)


def start_agent(sock: Path, env: dict[str, str], *, timeout: float = 30,
                spares_warm: bool = False, prefix: Sequence[str] = ()) -> subprocess.Popen:
    """``bootseer agent`` on ``sock`` with ``env`` added, once it answers there (a socket
    a killed agent left behind does not count); with ``spares_warm``, once its spare
    servers are warm and its own store connection is made, as on a node whose agent has
    been up a while (benchmarks: a JVM still starting would compete with, or delay, the
    start being timed). ``prefix``: a command line the agent's is appended to (one that
    execs it, e.g. into a cgroup). Its log is
    ``proc.log``, next to the socket."""
    from bootseer.agents.client import AgentClient, AgentUnavailable

    sock.parent.mkdir(parents=True, exist_ok=True)
    log = sock.parent / f"agent-{time.monotonic_ns()}.log"
    proc = _spawn([*prefix, sys.executable, "-m", "bootseer", "agent", "--socket", str(sock)],
                  log, env)
    proc.log = log  # type: ignore[attr-defined]

    def up() -> bool:
        if not sock.exists():
            return False
        try:
            with AgentClient(sock) as client:
                health = client.health()
        except AgentUnavailable:
            return False
        spares = health["spares"]
        return health["pid"] == proc.pid and (
            not spares_warm or (spares["ready"] >= spares["size"]
                                and health["store_connected"]))

    _wait_up(up, "bootseer agent", proc, log, timeout)
    return proc

"""Bring a real Apache Hadoop 2.7.3 HDFS cluster up and down on 127.0.0.1.

(Or on other addresses, each server in a network namespace of its own, as the fleet lab
places it: ClusterSpec.namenode_host, datanode_hosts, netns and cgroups.)

One NameNode and N DataNodes, each a JVM in its own process group with its log in the state
dir. "Up" means what a client needs: the NameNode answers JMX and counts N live DataNodes.
Every start formats a fresh, empty filesystem: the cluster is a test fixture, not a store
of record. Restarting a single DataNode (fault tests) keeps its blocks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

from bootseer.filelock import file_lock

from .. import netns
from ..cgroups import placed_argv
from . import linkcap
from .config import datanode_overrides, write_configs
from .jars import ensure_jars, server_classpath
from .paths import java_home
from .process import (
    ProcessRecord,
    is_alive_and_ours,
    launch,
    load_record,
    log_tail,
    marker_for,
    terminate,
    why_not_running,
)
from .spec import ClusterSpec
from .units import LinkCap

__all__ = ["Cluster", "ClusterError", "ClusterStatus", "DataNodeStatus", "BlockLocation"]

log = logging.getLogger(__name__)

NAMENODE_CLASS = "org.apache.hadoop.hdfs.server.namenode.NameNode"
DATANODE_CLASS = "org.apache.hadoop.hdfs.server.datanode.DataNode"
FSCK_CLASS = "org.apache.hadoop.hdfs.tools.DFSck"
# Small heaps and the serial collector: fewer GC threads and less RSS on 2-core machines.
JVM_COMMON = ("-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true")

# Never route 127.0.0.1 through an http_proxy from the environment.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ClusterError(RuntimeError):
    """The cluster could not be started/stopped; the message carries the log tail."""


@dataclass
class DataNodeStatus:
    index: int
    pid: int | None
    running: bool           # our JVM is alive
    live: bool              # the NameNode counts it as live
    xfer_port: int
    http_port: int
    ipc_port: int
    log: str


@dataclass
class ClusterStatus:
    """A snapshot of the cluster as the processes and the NameNode's JMX see it."""

    state_dir: str
    namenode_pid: int | None
    namenode_running: bool
    namenode_up: bool        # JMX answered
    live_datanodes: int
    dead_datanodes: int
    expected_datanodes: int
    namenode_rpc_url: str
    namenode_http_url: str
    namenode_log: str
    datanodes: list[DataNodeStatus] = field(default_factory=list)
    link: str | None = None

    @property
    def healthy(self) -> bool:
        return (self.namenode_up and self.live_datanodes == self.expected_datanodes
                and all(d.running for d in self.datanodes))

    def format(self) -> str:
        nn = "up" if self.namenode_up else ("running, not answering" if self.namenode_running
                                            else "down")
        lines = [f"state dir : {self.state_dir}",
                 f"NameNode  : {nn} (pid {self.namenode_pid}) rpc {self.namenode_rpc_url} "
                 f"http {self.namenode_http_url}",
                 f"            log {self.namenode_log}",
                 f"DataNodes : {self.live_datanodes}/{self.expected_datanodes} live, "
                 f"{self.dead_datanodes} dead",
                 f"link cap  : {self.link or 'none'} per DataNode"]
        for d in self.datanodes:
            state = "live" if d.live else ("running" if d.running else "down")
            lines.append(f"  dn{d.index}: {state:7s} pid {d.pid} xfer {d.xfer_port} "
                         f"http {d.http_port} ipc {d.ipc_port} log {d.log}")
        return "\n".join(lines)


@dataclass(frozen=True)
class BlockLocation:
    """One block of a file and the DataNode indexes holding a replica of it."""

    offset: int
    length: int
    datanodes: tuple[int, ...]


def _port_free(port: int, host: str = "127.0.0.1", namespace: str | None = None) -> bool:
    def bind() -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                return False
        return True

    return netns.call_in(namespace, bind) if namespace else bind()


class Cluster:
    """A local HDFS cluster described by a ClusterSpec and living in spec.state_dir.

    Cluster(spec).start() brings it up (a no-op if it already runs); Cluster.from_state_dir()
    re-attaches to a running one (what the CLI's stop/status/env do).
    """

    def __init__(self, spec: ClusterSpec | None = None) -> None:
        self.spec = spec or ClusterSpec()
        self.state_dir = self.spec.state_dir
        self._jdk: Path | None = None

    # ----------------------------------------------------------------- paths and URLs
    @classmethod
    def from_state_dir(cls, state_dir: Path | str | None = None) -> Cluster:
        """Attach to the cluster whose spec.json is in state_dir (default state dir if None)."""
        state = Path(state_dir) if state_dir else ClusterSpec().state_dir
        path = state / "spec.json"
        if not path.is_file():
            raise ClusterError(f"no dev cluster in {state} (no spec.json); start one first")
        spec = ClusterSpec.from_json(path.read_text())
        spec.state_dir = state.absolute()
        return cls(spec)

    @property
    def pid_dir(self) -> Path:
        return self.state_dir / "pids"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def _tc_path(self) -> Path:
        return self.state_dir / "tc.json"

    @property
    def namenode_rpc_url(self) -> str:
        return f"hdfs://{self.spec.namenode_host}:{self.spec.namenode_rpc_port}"

    @property
    def webhdfs_url(self) -> str:
        return f"webhdfs://{self.spec.namenode_host}:{self.spec.namenode_http_port}"

    @property
    def namenode_http_url(self) -> str:
        """http://HOST:PORT -- what hdfs.InsecureClient wants."""
        return f"http://{self.spec.namenode_host}:{self.spec.namenode_http_port}"

    def log_path(self, role: str) -> Path:
        return self.log_dir / f"{role}.log"

    @property
    def jdk(self) -> Path:
        if self._jdk is None:
            self._jdk = java_home()
        return self._jdk

    # ----------------------------------------------------------------- processes
    def _record(self, role: str) -> ProcessRecord | None:
        return load_record(self.pid_dir / f"{role}.json")

    def _roles(self) -> list[str]:
        return ["namenode"] + [f"datanode-{i}" for i in range(self.spec.datanodes)]

    def _java(self, role: str, main: str, args: list[str], heap_mb: int) -> list[str]:
        cp = os.pathsep.join(map(str, server_classpath(self.state_dir / "conf")))
        return [str(self.jdk / "bin" / "java"), f"-Xmx{heap_mb}m", *JVM_COMMON,
                f"-Dhadoop.log.dir={self.log_dir}", f"-Dhadoop.home.dir={self.state_dir}",
                marker_for(self.state_dir, role), "-cp", cp, main, *args]

    def _in_netns(self, role: str) -> list[str]:
        """The prefix that starts `role` in its network namespace (none on loopback)."""
        return placed_argv(None, self.spec.netns.get(role))

    def _launch(self, role: str, main: str, args: list[str], heap_mb: int) -> ProcessRecord:
        placed = placed_argv(self.spec.cgroups.get(role), self.spec.netns.get(role))
        rec = launch(role, placed + self._java(role, main, args, heap_mb),
                     self.log_path(role),
                     marker_for(self.state_dir, role), env=self._server_env())
        rec.save(self.pid_dir)
        return rec

    def _server_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("CLASSPATH", "HADOOP_CONF_DIR")}
        env["JAVA_HOME"] = str(self.jdk)
        return env

    def _launch_datanode(self, i: int) -> ProcessRecord:
        args: list[str] = []
        for k, v in datanode_overrides(self.spec, i).items():
            args += ["-D", f"{k}={v}"]
        return self._launch(f"datanode-{i}", DATANODE_CLASS, args, self.spec.datanode_heap_mb)

    # ----------------------------------------------------------------- JMX / health
    def _get_json(self, path: str, timeout: float = 2.0) -> dict:
        def get() -> dict:
            with _HTTP.open(f"{self.namenode_http_url}{path}", timeout=timeout) as resp:
                return json.loads(resp.read())

        # In the lab the NameNode is reachable only from inside its network namespace.
        name = self.spec.netns.get("namenode")
        return netns.call_in(name, get) if name else get()

    def jmx(self, query: str = "Hadoop:service=NameNode,name=FSNamesystemState") -> dict:
        """The first bean matching `query` from the NameNode's /jmx servlet."""
        beans = self._get_json("/jmx?qry=" + urllib.parse.quote(query, safe=":=,"))["beans"]
        if not beans:
            raise ClusterError(f"NameNode JMX has no bean {query!r} yet")
        return beans[0]

    def _live_xfer_ports(self) -> set[int] | None:
        try:
            info = self.jmx("Hadoop:service=NameNode,name=NameNodeInfo")
        except (OSError, ValueError, ClusterError):
            return None
        live = json.loads(info.get("LiveNodes") or "{}")
        ports = set()
        for node in live.values():
            addr = node.get("xferaddr", "")
            if ":" in addr:
                ports.add(int(addr.rsplit(":", 1)[1]))
        return ports

    def status(self) -> ClusterStatus:
        """Processes from the PID records, liveness from the NameNode's JMX."""
        nn = self._record("namenode")
        nn_running = bool(nn and is_alive_and_ours(nn))
        live = dead = 0
        up = False
        if nn_running:
            try:
                bean = self.jmx()
                live, dead, up = int(bean["NumLiveDataNodes"]), int(bean["NumDeadDataNodes"]), True
            except (OSError, ValueError, KeyError, ClusterError):
                pass
        live_ports = self._live_xfer_ports() if up else set()
        dns = []
        for i in range(self.spec.datanodes):
            rec, p = self._record(f"datanode-{i}"), self.spec.datanode_ports(i)
            dns.append(DataNodeStatus(
                index=i, pid=rec.pid if rec else None,
                running=bool(rec and is_alive_and_ours(rec)),
                live=p.xfer in (live_ports or set()), xfer_port=p.xfer, http_port=p.http,
                ipc_port=p.ipc, log=str(self.log_path(f"datanode-{i}"))))
        tc = linkcap.TcRecord.load(self._tc_path)
        return ClusterStatus(
            state_dir=str(self.state_dir), namenode_pid=nn.pid if nn else None,
            namenode_running=nn_running, namenode_up=up, live_datanodes=live,
            dead_datanodes=dead, expected_datanodes=self.spec.datanodes,
            namenode_rpc_url=self.namenode_rpc_url, namenode_http_url=self.namenode_http_url,
            namenode_log=str(self.log_path("namenode")), datanodes=dns,
            link=str(self.spec.link) if tc and self.spec.link else None)

    def wait_for_live_datanodes(self, n: int | None = None, timeout_s: float | None = None,
                                roles: list[str] | None = None) -> float:
        """Block until the NameNode counts `n` live DataNodes; return the seconds waited.

        Fails early (with the log tail) if one of `roles` dies while we wait.
        """
        n = self.spec.datanodes if n is None else n
        timeout_s = self.spec.start_timeout_s if timeout_s is None else timeout_s
        roles = self._roles() if roles is None else roles
        t0 = time.monotonic()
        last = "NameNode JMX not answering yet"
        while True:
            for role in roles:
                rec = self._record(role)
                why = "no PID record" if rec is None else why_not_running(rec)
                if why:
                    raise ClusterError(f"{role} exited during start-up ({why}); last lines of "
                                       f"{self.log_path(role)}:\n{log_tail(self.log_path(role))}")
            try:
                bean = self.jmx()
                live = int(bean["NumLiveDataNodes"])
                if live == n:
                    return time.monotonic() - t0
                last = f"NumLiveDataNodes={live}, want {n}"
            except (OSError, ValueError, KeyError, ClusterError) as exc:
                last = f"NameNode JMX: {exc}"
            if time.monotonic() - t0 > timeout_s:
                tails = "\n".join(f"--- {r} ({self.log_path(r)}):\n{log_tail(self.log_path(r), 25)}"
                                  for r in roles)
                raise ClusterError(f"cluster not ready after {timeout_s:.0f}s ({last})\n{tails}")
            time.sleep(0.2)

    def _role_ports(self) -> list[tuple[str, str, int]]:
        """(role, host, port) of every port the cluster listens on."""
        nn = [("namenode", self.spec.namenode_host, p)
              for p in (self.spec.namenode_rpc_port, self.spec.namenode_http_port)]
        dns = [(f"datanode-{i}", self.spec.datanode_host(i), p)
               for i in range(self.spec.datanodes)
               for p in dataclasses.astuple(self.spec.datanode_ports(i))]
        return nn + dns

    # ----------------------------------------------------------------- start / stop
    def _running_records(self) -> list[ProcessRecord]:
        recs = []
        for path in sorted(self.pid_dir.glob("*.json")) if self.pid_dir.is_dir() else []:
            rec = load_record(path)
            if rec and is_alive_and_ours(rec):
                recs.append(rec)
        return recs

    def start(self, timeout_s: float | None = None) -> bool:
        """Start the cluster; False (and nothing done) if it already runs healthy.

        Stale state (dead PIDs, a half-started cluster, leftover tc rules) is cleaned up
        first. Raises ClusterError with the relevant log tail if the cluster does not come up.
        """
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with file_lock(self.state_dir / ".lock"):
            return self._start_locked(timeout_s)

    def _start_locked(self, timeout_s: float | None) -> bool:
        t0 = time.monotonic()
        spec_path = self.state_dir / "spec.json"
        if spec_path.is_file():
            try:
                old = Cluster.from_state_dir(self.state_dir)
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("unreadable %s (%s); treating the state dir as stale", spec_path, exc)
                old = Cluster(replace(self.spec))
            if old._running_records():
                st = old.status()
                if st.healthy:
                    if old.spec.same_cluster_as(replace(self.spec, link=old.spec.link)):
                        if old.spec.link != self.spec.link:
                            self._set_link_locked(self.spec.link)
                        log.info("HDFS already running in %s (%s); start is a no-op",
                                 self.state_dir, self.namenode_rpc_url)
                        return False
                    raise ClusterError(f"a different cluster is running in {self.state_dir} "
                                       f"({old.namenode_rpc_url}, {old.spec.datanodes} "
                                       "DataNodes); stop it first")
                log.warning("cluster in %s is unhealthy; restarting it", self.state_dir)
            elif any(self.pid_dir.glob("*.json")):
                log.info("cleaning up stale PID records in %s (processes gone)", self.state_dir)
            old._stop_locked()
        elif self._tc_path.exists():
            linkcap.remove_link_cap(self._tc_path)

        busy = [f"{host}:{p}" for role, host, p in self._role_ports()
                if not _port_free(p, host, self.spec.netns.get(role))]
        if busy:
            raise ClusterError(f"ports {busy} are in use (another cluster? pick "
                               "other ports, e.g. --base-port)")
        if self.spec.link:
            reason = linkcap.tc_available()
            if reason:
                raise ClusterError(f"--link needs tc: {reason}")

        ensure_jars()
        t_fetch = time.monotonic() - t0

        for sub in ("name", "data", "tmp", "pids"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for f in self.log_dir.glob("*.log"):
            f.unlink()
        write_configs(self.spec)
        (self.state_dir / "spec.json").write_text(self.spec.to_json())

        fmt = self._java("format", NAMENODE_CLASS, ["-format", "-force", "-nonInteractive"],
                         self.spec.namenode_heap_mb)
        with open(self.log_path("format"), "wb") as out:
            proc = subprocess.run(fmt, stdout=out, stderr=subprocess.STDOUT, timeout=120,
                                  env=self._server_env(), stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise ClusterError(f"NameNode -format failed (rc={proc.returncode}); last lines of "
                               f"{self.log_path('format')}:\n{log_tail(self.log_path('format'))}")

        try:
            if self.spec.link:
                # Before the JVMs: a tc failure (e.g. no netem for a delay) then costs nothing.
                # Transfer port only: WebHDFS bytes pass it too (see linkcap's docstring).
                ports = [[self.spec.datanode_ports(i).xfer] for i in range(self.spec.datanodes)]
                linkcap.apply_link_cap(self.spec.link, ports, self._tc_path)
            self._launch("namenode", NAMENODE_CLASS, [], self.spec.namenode_heap_mb)
            for i in range(self.spec.datanodes):
                self._launch_datanode(i)
            self.wait_for_live_datanodes(timeout_s=timeout_s)
        except BaseException:
            self._stop_locked()
            raise
        log.info("HDFS up in %.1fs (jars %.1fs): %s, %s, %d DataNode(s)%s; logs in %s",
                 time.monotonic() - t0, t_fetch, self.namenode_rpc_url, self.webhdfs_url,
                 self.spec.datanodes, f", link cap {self.spec.link}" if self.spec.link else "",
                 self.log_dir)
        return True

    def stop(self) -> bool:
        """Stop the processes this state dir started and remove its tc rules; True if any ran."""
        if not self.state_dir.is_dir():
            return False
        with file_lock(self.state_dir / ".lock"):
            return self._stop_locked()

    def _stop_locked(self) -> bool:
        removed_tc = linkcap.remove_link_cap(self._tc_path) if self._tc_path.exists() else False
        stopped = False
        # DataNodes first, so they do not spend the NameNode's last seconds retrying.
        records = [load_record(p) for p in sorted(self.pid_dir.glob("*.json"))] \
            if self.pid_dir.is_dir() else []
        records = sorted((r for r in records if r), key=lambda r: r.role == "namenode")
        for rec in records:
            stopped |= terminate(rec)
            (self.pid_dir / f"{rec.role}.json").unlink(missing_ok=True)
        if stopped or removed_tc:
            log.info("stopped HDFS in %s", self.state_dir)
        return stopped

    def set_link(self, cap: LinkCap | None) -> None:
        """Change (or with None remove) the per-DataNode link cap of the running cluster.

        Lets one cluster serve capped and uncapped measurements without a restart.
        """
        with file_lock(self.state_dir / ".lock"):
            self._set_link_locked(cap)

    def _set_link_locked(self, cap: LinkCap | None) -> None:
        if self._tc_path.exists():
            linkcap.remove_link_cap(self._tc_path)
        self.spec.link = None
        (self.state_dir / "spec.json").write_text(self.spec.to_json())
        if cap:
            ports = [[self.spec.datanode_ports(i).xfer] for i in range(self.spec.datanodes)]
            linkcap.apply_link_cap(cap, ports, self._tc_path)
            self.spec.link = cap
            (self.state_dir / "spec.json").write_text(self.spec.to_json())

    def datanode_sent_bytes(self) -> list[int]:
        """Bytes each DataNode has served through its capped link so far (its tc class's
        counter; empty without a cap). Differences between two calls say which DataNodes
        a read used."""
        return linkcap.sent_bytes(self._tc_path)

    # ----------------------------------------------------------------- fault injection
    def stop_datanode(self, i: int, sig: int = signal.SIGTERM) -> bool:
        """Stop DataNode i (SIGTERM, or sig=signal.SIGKILL to emulate a crash); keeps its
        blocks. The NameNode declares it dead after ~2*heartbeat_recheck + 10 s."""
        self.spec.datanode_ports(i)  # IndexError for a bad index
        rec = self._record(f"datanode-{i}")
        return bool(rec and terminate(rec, sig=sig))

    def start_datanode(self, i: int, wait: bool = True, timeout_s: float | None = None) -> None:
        """(Re)start DataNode i on its old ports and data dir; wait until it is live again."""
        p = self.spec.datanode_ports(i)
        rec = self._record(f"datanode-{i}")
        if rec and is_alive_and_ours(rec):
            raise ClusterError(f"DataNode {i} is already running (pid {rec.pid})")
        deadline = time.monotonic() + 10
        host, name = self.spec.datanode_host(i), self.spec.netns.get(f"datanode-{i}")
        while not all(_port_free(x, host, name) for x in (p.xfer, p.http, p.ipc)):
            if time.monotonic() > deadline:
                raise ClusterError(f"ports of DataNode {i} ({p}) still busy")
            time.sleep(0.1)
        log_path = self.log_path(f"datanode-{i}")
        offset = log_path.stat().st_size if log_path.exists() else 0
        self._launch_datanode(i)
        if wait:
            self._wait_datanode_live(i, timeout_s or self.spec.start_timeout_s, offset)

    def _wait_datanode_live(self, i: int, timeout_s: float, log_offset: int) -> None:
        role, xfer = f"datanode-{i}", self.spec.datanode_ports(i).xfer
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            rec = self._record(role)
            if rec is None or not is_alive_and_ours(rec):
                raise ClusterError(f"{role} exited; last lines of {self.log_path(role)}:\n"
                                   f"{log_tail(self.log_path(role))}")
            # After a crash the NameNode still lists the old incarnation as live until it
            # times out, so "live" alone proves nothing: wait for this run's registration.
            with open(self.log_path(role), "rb") as fh:
                fh.seek(log_offset)
                registered = b"successfully registered with NN" in fh.read()
            if registered and xfer in (self._live_xfer_ports() or set()):
                return
            time.sleep(0.2)
        raise ClusterError(f"{role} not live after {timeout_s:.0f}s:\n"
                           f"{log_tail(self.log_path(role))}")

    # ----------------------------------------------------------------- clients
    def classpath(self) -> list[Path]:
        """Client CLASSPATH entries: client-conf (site files, quiet log4j) then every jar."""
        return [self.state_dir / "client-conf", *ensure_jars()]

    def env(self) -> dict[str, str]:
        """Environment for clients: ``HADOOP_CONF_DIR`` for ``hdfs://`` stores
        (hdfs-native reads the site files there), and JAVA_HOME with CLASSPATH (an explicit
        jar list) for Hadoop's own Java tools (FsShell, fsck) run against the cluster."""
        return {
            "JAVA_HOME": str(self.jdk),
            "CLASSPATH": os.pathsep.join(map(str, self.classpath())),
            "HADOOP_CONF_DIR": str(self.state_dir / "client-conf"),
            "BOOTSEER_HDFS_STATE": str(self.state_dir),
            "BOOTSEER_HDFS_URL": self.namenode_rpc_url,
            "BOOTSEER_WEBHDFS_URL": self.webhdfs_url,
            "BOOTSEER_WEBHDFS_HTTP": self.namenode_http_url,
        }

    def webhdfs_client(self, **kwargs):
        """An hdfs.InsecureClient (WebHDFS) on this cluster."""
        from hdfs import InsecureClient

        return InsecureClient(self.namenode_http_url, **kwargs)

    def block_locations(self, path: str) -> list[BlockLocation]:
        """Which DataNode (index) holds each block of `path`, via WebHDFS GET_BLOCK_LOCATIONS."""
        q = urllib.parse.quote(path if path.startswith("/") else "/" + path)
        data = self._get_json(f"/webhdfs/v1{q}?op=GET_BLOCK_LOCATIONS&offset=0&length={1 << 62}",
                              timeout=10)
        by_port = {self.spec.datanode_ports(i).xfer: i for i in range(self.spec.datanodes)}
        out = []
        for blk in data["LocatedBlocks"]["locatedBlocks"]:
            dns = tuple(sorted(by_port.get(int(loc["xferPort"]), -1) for loc in blk["locations"]))
            out.append(BlockLocation(int(blk["startOffset"]), int(blk["block"]["numBytes"]), dns))
        return out

    def fsck(self, path: str = "/", *args: str) -> str:
        """`hdfs fsck PATH -files -blocks -locations` (plus args) with the Java classpath."""
        cp = os.pathsep.join(map(str, self.classpath()))
        cmd = [*self._in_netns("namenode"), str(self.jdk / "bin" / "java"), "-Xmx256m",
               *JVM_COMMON, "-cp", cp, FSCK_CLASS, path, "-files", "-blocks", "-locations",
               *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                              env=self._server_env())
        return proc.stdout + (proc.stderr if proc.returncode else "")

"""A lab of N emulated GPU nodes and an HDFS dev cluster on one machine: up, status, down.

`up` builds the network (`topology`), caps every node's, DataNode's and origin's link
both ways (`shaping`), makes a cgroup for each node and each origin (`bootseer_dev.cgroups`:
its CPU counted apart, capped with ``node_cpu`` or ``origin_cpu``), starts the dev
cluster's NameNode and DataNodes each in its namespace and group on its lab address
(`bootseer_dev.cluster`, placed by ClusterSpec.netns and ClusterSpec.cgroups), the
registry and the wheel index (`origins`), then one node agent per node (`nodes`).
Everything is recorded in the state dir as it is made (`state`); a failure half-way takes
down what was made. `down` removes exactly what the record names, plus whatever process
still runs in one of the lab's namespaces or cgroups (a FUSE server an agent started, a
container): nothing else can be in namespaces or groups the lab created.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bootseer_dev import netns
from bootseer_dev.cgroups import Hierarchies
from bootseer_dev.cluster import Cluster, ClusterSpec, ClusterStatus
from bootseer_dev.cluster.process import ProcessRecord, is_alive_and_ours, terminate
from bootseer_dev.cluster.units import format_rate

from . import shaping, topology
from .nodes import NodeFiles, agent_env, agent_health, on_node, start_agents, start_engines
from .origins import start_origins
from .spec import LabSpec, Member
from .state import Iface, LabState

__all__ = ["Lab", "LabError", "LabStatus", "MemberStatus"]

log = logging.getLogger(__name__)

#: Seconds a process in a lab namespace gets after SIGTERM, then after SIGKILL.
STRAGGLER_GRACE_S = 5.0
#: The dev cluster's JVMs are small: four of them and N agents share two cores.
HDFS_HEAP_MB = 256


class LabError(RuntimeError):
    """The lab cannot be brought up, found, or taken down; the message says why."""


@dataclass
class MemberStatus:
    """One member of the lab as tc and (for nodes) its agent see it."""

    role: str
    netns: str
    address: str
    cap: str                      # "25MB/s" or "none"
    present: bool                 # its namespace exists
    sent: int | None = None       # bytes through its egress cap
    received: int | None = None   # bytes through its ingress cap (the switch end)
    agent_pid: int | None = None
    agent_up: bool | None = None  # answers /v1/health with its pid
    cpu_s: float | None = None    # CPU-seconds of every process of the member so far


@dataclass
class LabStatus:
    """The whole lab for `status`."""

    name: str
    state_dir: str
    store: str
    origins: str                  # "registry ADDR, index URL" or "none"
    scale_down: str
    node_cpu: str = "no quota"    # each node's cgroup quota
    origin_cpu: str = "no quota"  # each origin's
    members: list[MemberStatus] = field(default_factory=list)
    hdfs: ClusterStatus | None = None

    @property
    def healthy(self) -> bool:
        return (all(m.present and m.agent_up is not False for m in self.members)
                and (self.hdfs is None or self.hdfs.healthy))

    def format(self) -> str:
        lines = [f"lab       : {self.name} ({'healthy' if self.healthy else 'NOT healthy'}), "
                 f"state {self.state_dir}",
                 f"store     : {self.store}",
                 f"origins   : {self.origins}",
                 f"scale-down: {self.scale_down}",
                 f"node CPU  : {self.node_cpu}; origin CPU: {self.origin_cpu}",
                 "no latency: this kernel lacks sch_netem; links are rate caps only"]
        for m in self.members:
            traffic = ("" if m.sent is None else
                       f" sent {m.sent / 1e6:.1f}MB recv {(m.received or 0) / 1e6:.1f}MB")
            agent = ("" if m.agent_pid is None else
                     f" agent pid {m.agent_pid} {'up' if m.agent_up else 'DOWN'}")
            cpu = "" if m.cpu_s is None else f" cpu {m.cpu_s:.1f}s"
            lines.append(f"  {m.role:12s} {m.address:15s} {m.netns:16s} cap {m.cap}"
                         f"{traffic}{agent}{cpu}{'' if m.present else ' (namespace missing)'}")
        if self.hdfs:
            lines += ["HDFS:", *("  " + line for line in self.hdfs.format().splitlines())]
        return "\n".join(lines)


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below root, deepest first (from /proc/self/mountinfo)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if point == str(root) or point.startswith(f"{root}/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def _quota(cores: float | None) -> str:
    return "no quota" if cores is None else f"{cores:g} cores each (cgroup quota)"


def _end(pids: list[int], sig: int, grace_s: float) -> list[int]:
    """Signal pids; those still alive after grace_s."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        for pid in alive:
            try:
                os.waitpid(pid, os.WNOHANG)  # our own child: reap it
            except ChildProcessError:
                pass
        alive = [p for p in alive if Path(f"/proc/{p}").exists()
                 and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    return alive


class Lab:
    """The lab whose state dir is spec.state_dir."""

    def __init__(self, spec: LabSpec) -> None:
        self.spec = spec
        self.state = LabState.load(spec.state_dir / "state.json")

    @classmethod
    def attach(cls, state_dir: Path) -> Lab:
        """The lab `up` recorded in state_dir."""
        path = Path(state_dir) / "lab.json"
        if not path.is_file():
            raise LabError(f"no lab in {state_dir} (no lab.json); `up` one first")
        spec = LabSpec.from_json(path.read_text())
        spec.state_dir = Path(state_dir).absolute()
        return cls(spec)

    # ------------------------------------------------------------------ the parts
    @property
    def cluster(self) -> Cluster | None:
        """The lab's HDFS dev cluster (None without DataNodes)."""
        if not self.spec.datanodes:
            return None
        spec, nn = self.spec, self.spec.namenode
        dns = [spec.datanode(j) for j in range(spec.datanodes)]
        return Cluster(ClusterSpec.with_base_port(
            spec.hdfs_base_port, datanodes=spec.datanodes, state_dir=spec.state_dir / "hdfs",
            block_size=spec.block_size, namenode_heap_mb=HDFS_HEAP_MB,
            datanode_heap_mb=HDFS_HEAP_MB, namenode_host=nn.address,
            datanode_hosts=[d.address for d in dns],
            netns={m.role: m.netns for m in [nn, *dns]},
            cgroups={m.role: spec.origin_cgroup(m.role) for m in [nn, *dns]}))

    def client_env(self) -> dict[str, str]:
        """What a store client needs in its environment (hdfs:// stores: the site files)."""
        cluster = self.cluster
        return cluster.env() if cluster else {}

    def agent_record(self, i: int) -> ProcessRecord:
        """The record of node i's agent (its pid)."""
        for rec in self.state.processes:
            if rec.role == f"agent-n{i}":
                return rec
        raise LabError(f"no agent of node {i} is recorded")

    def node_files(self, i: int) -> NodeFiles:
        return NodeFiles.of(self.spec, i)

    @property
    def cgroups(self) -> Hierarchies:
        """This machine's cgroup hierarchies, where the nodes' groups are."""
        return Hierarchies.find()

    def node_cpu_s(self) -> list[float]:
        """CPU-seconds each node's processes (agent, servers, engine, containers, commands
        run on it) have used since `up`, node by node."""
        cgroups = self.cgroups
        return [cgroups.usage_s(self.spec.node_cgroup(i)) for i in range(self.spec.nodes)]

    def origin_cpu_s(self) -> dict[str, float]:
        """CPU-seconds each origin's server (NameNode, DataNodes, registry, index) has used
        since `up`, by role."""
        cgroups = self.cgroups
        return {role: cgroups.usage_s(self.spec.origin_cgroup(role))
                for role in self.spec.origin_roles()}

    def member(self, role: str) -> Member:
        for m in self.spec.members():
            if m.role == role:
                return m
        raise LabError(f"the lab has no {role}")

    def ifaces(self, member: Member) -> tuple[Iface, Iface]:
        """(member's end, switch end) of its link: its egress and its ingress cap."""
        return Iface(member.netns, topology.NODE_DEV), Iface(self.spec.switch_netns,
                                                             member.port)

    def link_bytes(self, role: str) -> tuple[int, int]:
        """(sent, received) bytes through the caps of role's link (tc's counters)."""
        egress, ingress = self.ifaces(self.member(role))
        return shaping.sent_bytes(egress), shaping.sent_bytes(ingress)

    def port_bytes(self) -> dict[str, tuple[int, int]]:
        """(sent, received) bytes of every member so far, from its switch port's interface
        counters (what it sent, the port received), all in one read: cheap enough to
        sample while a benchmark runs (:func:`link_bytes` runs ``tc`` per link)."""
        text = netns.call_in(self.spec.switch_netns,
                             lambda: Path("/proc/thread-self/net/dev").read_text())
        counters = {}
        for line in text.splitlines()[2:]:
            dev, _, fields = line.partition(":")
            values = fields.split()
            counters[dev.strip()] = (int(values[0]), int(values[8]))  # rx, tx bytes
        return {m.role: counters[m.port] for m in self.spec.members()}

    def run(self, i: int, argv: list[str], timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """argv "on node i": in its network namespace, with the store's client
        environment and the node's config (BOOTSEER_CONFIG: its store, cache, agent)."""
        full_env = agent_env(self.client_env()) | {
            "BOOTSEER_CONFIG": str(self.node_files(i).config)} | (env or {})
        return subprocess.run([*on_node(self.spec, i), *argv],
                              capture_output=True, text=True, timeout=timeout, env=full_env,
                              stdin=subprocess.DEVNULL)

    def docker(self, i: int, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """The docker CLI against node i's engine (``engines``): what it starts runs in
        the node's network namespace, on the node's agent."""
        if not self.spec.engines:
            raise LabError("this lab has no engines (`up --engines`)")
        return subprocess.run([*self.cgroups.enter_argv(self.spec.node_cgroup(i)), "docker",
                               "-H", self.node_files(i).docker_host, *args],
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def restart_agents(self, indices: list[int], timeout_s: float = 120.0, *,
                       python_serving: bool = False) -> None:
        """Stop the agents of ``indices``, empty their caches, start them again: the nodes
        are cold again (nothing staged, no mounts), as after a reboot; ``python_serving``:
        see :func:`~bootseer_dev.fleet.nodes.start_agents`."""
        for i in indices:
            rec = self.agent_record(i)
            terminate(rec)
            self.state.processes.remove(rec)
            cache = self.node_files(i).cache_dir
            for point in _mounts_under(cache):
                subprocess.run(["umount", "-l", point], check=False, capture_output=True,
                               timeout=30)
            if cache.exists():
                shutil.rmtree(cache)
        self.state.save()
        start_agents(self.spec, self.state, agent_env(self.client_env()), timeout_s, indices,
                     python_serving=python_serving)

    # ------------------------------------------------------------------ up / down
    def up(self, timeout_s: float = 120.0) -> None:
        """Build the lab; on any failure take down what was made and re-raise."""
        for reason in (netns.netns_available(), shaping.tc_available()):
            if reason:
                raise LabError(f"the lab cannot run here: {reason}")
        if self.state.path.is_file():
            raise LabError(f"a lab is recorded in {self.spec.state_dir}: `down` it first")
        self.spec.state_dir.mkdir(parents=True, exist_ok=True)
        (self.spec.state_dir / "lab.json").write_text(self.spec.to_json())
        self.state = LabState(self.state.path, mount_roots=[str(self.spec.state_dir / "nodes")])
        self.state.save()
        t0 = time.monotonic()
        try:
            topology.build(self.spec, self.state)
            cgroups = self.cgroups
            self.state.add(self.state.cgroups, self.spec.cgroup)
            for i in range(self.spec.nodes):
                cgroups.create(self.spec.node_cgroup(i), self.spec.node_cpu)
            for role in self.spec.origin_roles():
                cgroups.create(self.spec.origin_cgroup(role), self.spec.origin_cpu)
            for member in self.spec.members():
                if member.cap:
                    for iface in self.ifaces(member):
                        shaping.cap_iface(iface, member.cap, self.state)
            cluster = self.cluster
            if cluster:
                self.state.hdfs_state = str(cluster.state_dir)
                self.state.save()
                cluster.start(timeout_s=timeout_s)
            if self.spec.origins:
                start_origins(self.spec, self.state, timeout_s)
            start_agents(self.spec, self.state, agent_env(self.client_env()), timeout_s)
            if self.spec.engines:
                start_engines(self.spec, self.state, timeout_s)
        except BaseException:
            log.error("lab %s did not come up; taking down what was made", self.spec.name)
            self.down()
            raise
        log.info("lab %s up in %.1fs: %d nodes at %s, %d DataNodes at %s, store %s",
                 self.spec.name, time.monotonic() - t0, self.spec.nodes,
                 format_rate(self.spec.node_link.rate_bytes_per_s), self.spec.datanodes,
                 format_rate(self.spec.datanode_link.rate_bytes_per_s), self.spec.store_url())

    def down(self) -> bool:
        """Remove every process, mount, qdisc, link and namespace the record names (and
        any process left in the lab's namespaces); False if nothing was recorded."""
        state = LabState.load(self.state.path)
        if not self.state.path.is_file():
            return False
        for rec in state.processes:
            terminate(rec)
        if state.hdfs_state and (Path(state.hdfs_state) / "spec.json").is_file():
            Cluster.from_state_dir(state.hdfs_state).stop()
        for root in state.mount_roots:
            for point in _mounts_under(Path(root)):
                subprocess.run(["umount", "-l", point], check=False, capture_output=True,
                               timeout=30)
                log.info("unmounted %s", point)
        live = [n for n in state.namespaces if netns.exists(n)]
        stragglers = sorted({p for n in live for p in netns.pids(n)} - {os.getpid()})
        if stragglers:
            log.warning("ending processes left in the lab's namespaces: %s", stragglers)
            left = _end(_end(stragglers, signal.SIGTERM, STRAGGLER_GRACE_S), signal.SIGKILL,
                        STRAGGLER_GRACE_S)
            if left:
                raise LabError(f"processes {left} in the lab's namespaces survived SIGKILL; "
                               "the record is kept, run `down` again")
        if state.cgroups:  # containers run in namespaces of their own: found by group
            cgroups = self.cgroups
            for group in state.cgroups:
                left = _end(_end(cgroups.pids(group), signal.SIGTERM, STRAGGLER_GRACE_S),
                            signal.SIGKILL, STRAGGLER_GRACE_S)
                if left:
                    raise LabError(f"processes {left} in the lab's cgroup {group} survived "
                                   "SIGKILL; the record is kept, run `down` again")
                cgroups.remove(group)
        for iface in state.qdiscs:
            shaping.uncap_iface(iface)
        topology.teardown(state)
        self.state.path.unlink(missing_ok=True)
        self.state = LabState(self.state.path)
        log.info("lab %s is down", self.spec.name)
        return True

    # ------------------------------------------------------------------ status
    def status(self) -> LabStatus:
        st = LabStatus(name=self.spec.name, state_dir=str(self.spec.state_dir),
                       store=self.spec.store_url(), scale_down=self.spec.scale_down(),
                       origins=(f"registry {self.spec.registry_address}, index "
                                f"{self.spec.index_url}" if self.spec.origins else "none"),
                       node_cpu=_quota(self.spec.node_cpu),
                       origin_cpu=_quota(self.spec.origin_cpu))
        agents = {rec.role: rec for rec in self.state.processes}
        for member in self.spec.members():
            ms = MemberStatus(role=member.role, netns=member.netns, address=member.address,
                              cap=str(member.cap) if member.cap else "none",
                              present=netns.exists(member.netns))
            if ms.present and member.cap:
                ms.sent, ms.received = self.link_bytes(member.role)
            node = member.role.startswith("node-")
            if node:
                i = int(member.role.split("-")[1])
                rec = agents.get(f"agent-n{i}")
                ms.agent_pid = rec.pid if rec else None
                health = agent_health(self.node_files(i)) if rec and is_alive_and_ours(rec) \
                    else None
                ms.agent_up = bool(health and health.get("pid") == rec.pid)
            if self.spec.cgroup in self.state.cgroups:
                group = self.spec.node_cgroup(i) if node else \
                    self.spec.origin_cgroup(member.role)
                ms.cpu_s = round(self.cgroups.usage_s(group), 2)
            st.members.append(ms)
        cluster = self.cluster
        if cluster and (cluster.state_dir / "spec.json").is_file() and \
                netns.exists(self.spec.namenode.netns):
            st.hdfs = Cluster.from_state_dir(cluster.state_dir).status()
        return st

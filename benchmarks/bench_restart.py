"""``make bench-restart``: a whole job restarting on N = 1, 2, 4, 8, 16 lab nodes at once.

The lab is the fleet lab (``python -m bootseer_dev.fleet``, built and taken down by this
run): N emulated GPU nodes, each a network namespace with its NIC capped both ways, its
own node agent and its own Docker engine with Bootseer's runtime as deployed; an HDFS
dev cluster of ``--datanodes`` DataNodes, a docker-registry and a wheel index, each on a
capped link of its own. No latency is added (the kernel has no ``sch_netem``).

Every node runs the same real job, all nodes spawned at the same instant t0:

* the image: Debian bookworm minbase + python3 (``bootseer_dev.image``);
* the environment: a venv with numpy 2.2.6 and nvidia-cuda-runtime 13.0.96 from the lab's
  wheel index, at the same path on every node (each node's own directory is bind-mounted
  there in a private mount namespace, so that the snapshot key is the job's, not the
  node's), given to the container read-only;
* the checkpoint: 2 data-parallel groups x 2 shards x 16 MiB in HDFS; node i reads group
  ``i % 2`` (the same shards as every other replica of its group) and checks each
  shard's sha256;
* the workload (``job.py``, in the container): import numpy from the environment, read
  and verify the checkpoint, touch the ready file, exit.

Cases (each on cold nodes: fresh agent caches, fresh environments, a dropped page cache):

* ``baseline``: what a user runs today: ``docker pull`` from the registry, ``python -m
  venv`` + ``pip install`` from the index, ``docker run``; the checkpoint read as one
  stream (WebHDFS, one HTTP stream per shard, in order);
* ``bootseer_cold``: the first start: ``bootseer env run`` runs pip and publishes the
  snapshot; ``docker run --runtime bootseer`` of the stub image mounts the lazy image
  (no hot list yet: it records one) and the checkpoint mount (striped reads); every later
  case starts on the list the round's cold starts recorded and records none
  (``BOOTSEER_RECORD=never``), as a restart of a job whose list has converged (left to
  ``auto``, N = 1's later starts recorded, a list of one recording being young, and were
  served by Python: 0.3 CPU-s more and 25% slower than N = 4's, which found a list of 4);
* ``bootseer_prestaged``: ``bootseer warm`` of the hot pack, the snapshot and the
  checkpoint finished before t0 (a scheduler that knows the next nodes), then the start,
  whose container gets the environment from the node agent (``BOOTSEER_ENVS``: the tree
  the warm unpacked, laid in its root; nothing restored on the node);
* ``bootseer_prestaged_served``: the same, the image served as before Bootseer had the
  kernel serve it: the agents' ``image.passthrough`` and ``image.kernel_metadata`` off, so
  that their mounts' servers answer every lookup and read in Python (checkpoint copies are
  still read by the kernel): what kernel-side serving saves a node in CPU
  (``prestaged_node_cpu_saved_s``);
* ``bootseer_prestaged_env_extracted`` (only when named in ``--cases``): as
  ``bootseer_prestaged``, but the environment restored on the node by ``bootseer env run``
  and bound into the container, as the other cases do, where ``bootseer_prestaged``'s
  containers get the warmed tree from the node agent (``BOOTSEER_ENVS``): what that mount
  saves a node (``prestaged_env_node_cpu_saved_s``);
* ``bootseer``: a later restart: ``bootseer warm`` is issued on every node at t0, beside
  the start; a node is ready when both are done; the container gets the environment from
  the node agent, as ``bootseer_prestaged``'s (the warm unpacks it once: a start that
  needs the tree first waits for that build, or builds it while the warm waits);
* ``bootseer_p2p``: the warm issued at t0 as one job's (``--job --nodes N``), the start
  once it returned (a start racing its warm reads what is not yet local from the store
  itself): the nodes' agents share the hot pack, the snapshot shards and the checkpoint
  peer-to-peer (libtorrent; each piece from the store about once), and the container gets
  the environment the warm unpacked from the node agent, as ``bootseer_prestaged``'s;
* ``bootseer_fanout`` (largest N only): ``bootseer job fanout`` raised the replication of
  everything the job reads (HDFS ``setReplication``, waited for), then as ``bootseer``.

Before the timed runs, one untimed round (a baseline and a cold start on one node) pays
the one-time costs of a fresh lab (first pull, first WebHDFS read, JIT warm-up of the
DataNodes). Before each t0 the run waits (at most 2 min) until the machine's CPU busy
fraction over 2 s is at most 0.2, and records the last reading (``cpu_busy_idle``: the
lab's own load at rest).

Per case and N: the job's time-to-ready (slowest node), p50/p99/max over nodes, the
slowest node's phases, the bytes every origin sent (tc's counters on its capped link:
each DataNode, the registry, the index) and their max/mean, the fan-out factor (origin
bytes / the same case's N = 1 origin bytes), the CPU-seconds each node used (its
cgroup's: :mod:`bootseer_dev.cgroups`), each origin's CPU and link use against its quota
and cap (:class:`LabMeter`: which of the two bounds it) and the machine's CPU busy
fraction. ``--node-cpu`` puts every node under a CPU quota of its own during the timed
starts, and ``--origin-cpu`` every origin throughout, the same at every N. The fleet
simulator (``bootseer_dev.fleetsim``) is calibrated from the N = 1 runs, validated against
every N and extrapolated to production scale (its section of the JSON, and a PNG).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import (
    Recording,
    RunFailed,
    busy_fraction,
    cpu_times,
    drop_page_cache,
    select_cases,
)

from bootseer.agents.client import AgentClient
from bootseer.prefetch.image_source import open_image
from bootseer_dev import netns
from bootseer_dev.cluster import parse_link
from bootseer_dev.fleet import Lab, LabSpec, index_dir
from bootseer_dev.image import build_image, place, read_build_info
from bootseer_dev.image.oci import append_layer

log = logging.getLogger("bench-restart")
MB, MIB = 1e6, 1 << 20
CASES = ("baseline", "bootseer_cold", "bootseer_prestaged", "bootseer_prestaged_served",
         "bootseer", "bootseer_p2p", "bootseer_fanout")
#: Run only when named in --cases: bootseer_prestaged with its environment extracted on the
#: node (``env run``) as before the agent mounted it (what the mount saves a node in CPU).
EXTRA_CASES = ("bootseer_prestaged_env_extracted",)
#: Cases whose warm is done before t0.
PRESTAGED = ("bootseer_prestaged", "bootseer_prestaged_served",
             "bootseer_prestaged_env_extracted")
#: Cases whose containers get the environment from the node agent (``BOOTSEER_ENVS``): the
#: snapshot's tree, unpacked on the node once, by the warm (before t0, beside the start,
#: or, for bootseer_p2p, the job's warm the start waits for) or by the start's mount if it
#: gets there first, laid in their root; nothing is restored on the node at the start.
#: The others restore it with ``bootseer env run``.
ENV_FROM_AGENT = ("bootseer_prestaged", "bootseer_prestaged_served", "bootseer",
                  "bootseer_p2p", "bootseer_fanout")
#: What bootseer_p2p's nodes fetch through their swarm (all of its warm), in the lab dict
#: for the simulator.
P2P_SHARED = ("image_hot", "env_snapshot", "checkpoint")
#: Cases whose warm is issued at t0, beside the start.
WARM_AT_T0 = ("bootseer", "bootseer_fanout")
IMAGE = "job"                       # the lazy image's name in the store
STUB = "bootseer/job:1"             # its stub in each node's engine
REGISTRY_REF = "job/python:1"       # the same image in the lab's registry
WHEELS = ("numpy==2.2.6", "nvidia-cuda-runtime==13.0.96")
GROUPS, SHARDS, SHARD_BYTES = 2, 2, 16 * MIB
#: At ``--artifact-scale K`` every artifact grows by K - 1 times these (random bytes: they
#: compress to themselves): a file in the image the job reads whole at its start (about
#: the hot pack), a wheel in the environment (about its snapshot); the checkpoint's shards
#: are K times SHARD_BYTES.
IMAGE_BALLAST, ENV_BALLAST = 8 * MIB, 20 * MIB
BALLAST_FILE, BALLAST_WHEEL = "/opt/bench-ballast.bin", "bench_ballast"
PYTHON = "/usr/bin/python3"         # Debian's, as in the image: the venv runs in both
LATENCY = "none added: kernel has no sch_netem"
#: The lab meter's sampling period, and the window its peaks are taken over.
METER_S = 0.5
METER_WINDOW_S = 2.0
ORIGINS_NOTE = ("each origin's CPU (its cgroup's: cpu_s, cores_mean over the case, "
                "cores_peak over 2 s windows) against its quota (quota_cores, null: none), "
                "and for those on a capped link the bytes it sent (sent_bytes: its switch "
                "port's counter, frames and all; origin_bytes is tc's) and their "
                "share of the cap (link_mean, link_peak): an origin near its cap and far from "
                "its quota is bound by its link, not its CPU")
NODE_CPU_NOTE = ("CPU-seconds per node during a case's starts (t0 to the last node ready; "
                 "the only time node_cpu_quota_cores, if any, applies), "
                 "from each node's cgroup: its agent and servers, its Docker engine and "
                 "containers, the commands run on it; medians over the case's nodes. Each "
                 "node's 'phases': its CPU-seconds and the bytes its port received in each "
                 "phase of its start (samples every 0.5 s, read at its marks)")
#: Seconds over which the machine's CPU busy fraction is read just before t0; a run
#: starts once it is at most QUIET_BUSY, or after QUIET_WAIT_S.
IDLE_PROBE_S = 2.0
QUIET_BUSY = 0.2
QUIET_WAIT_S = 120.0
JOB_PY = '''\
import hashlib, json, os, sys, time, urllib.request
if os.path.exists("/opt/bench-ballast.bin"):  # --artifact-scale: the image's extra bytes
    with open("/opt/bench-ballast.bin", "rb") as f:
        while f.read(1 << 20):
            pass
marks = {"started": time.time()}
import numpy  # from the job's environment
marks["imported"] = time.time()
for source, digest in json.loads(sys.argv[1]):
    h = hashlib.sha256()
    with (urllib.request.urlopen(source) if source.startswith("http") else
          open(source, "rb")) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    if h.hexdigest() != digest:
        sys.exit(f"{source}: sha256 {h.hexdigest()} is not {digest}")
marks["checkpoint"] = time.time()
if os.environ.get("BOOTSEER_READY_FILE"):
    open(os.environ["BOOTSEER_READY_FILE"], "w").close()
marks["ready"] = time.time()
print(json.dumps(marks))
'''


@dataclass
class NodeRun:
    """One node's start: when each step ended (seconds since t0), or why it failed."""

    node: int
    marks: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    #: A warm issued at t0: where its time went, part by part (it stages them in turn).
    warm_parts: list[dict[str, Any]] | None = None

    @property
    def ready(self) -> float | None:
        """Time-to-ready: the start's ready mark, or the warm's end if that came later."""
        if self.error or "ready" not in self.marks:
            return None
        return max(self.marks["ready"], self.marks.get("warm", 0.0))


@dataclass(frozen=True)
class Sample:
    """The lab at one instant: CPU-seconds of each member's cgroup, and the (sent,
    received) bytes of its switch port, so far."""

    t: float
    cpu: dict[str, float]
    ports: dict[str, tuple[int, int]]


class LabMeter:
    """Every origin's and node's CPU (their cgroups') and bytes (the switch's counters),
    sampled every :data:`METER_S` from t0 until the last node is ready: what bounds an
    origin, its quota or its link (which of the two it came near: peaks over
    :data:`METER_WINDOW_S`, means over the case), and what each node spent, in CPU and
    bytes, in each phase of its start (between its marks)."""

    def __init__(self, lab: Lab, n: int) -> None:
        self.lab, self.n = lab, n
        self.samples: list[Sample] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lab-meter", daemon=True)

    def _sample(self) -> None:
        nodes = self.lab.node_cpu_s()
        cpu = {**self.lab.origin_cpu_s(), **{f"node-{i}": nodes[i] for i in range(self.n)}}
        self.samples.append(Sample(time.time(), cpu, self.lab.port_bytes()))

    def _run(self) -> None:
        while not self._done.wait(METER_S):
            self._sample()

    def __enter__(self) -> LabMeter:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self._sample()

    def _at(self, t: float, value: Callable[[Sample], float]) -> float:
        """``value`` at time t, linear between the samples around it."""
        samples = self.samples
        if t <= samples[0].t:
            return value(samples[0])
        for a, b in zip(samples, samples[1:]):
            if t <= b.t:
                share = (t - a.t) / (b.t - a.t) if b.t > a.t else 1.0
                return value(a) + (value(b) - value(a)) * share
        return value(samples[-1])

    def origins(self, spec: LabSpec) -> dict[str, dict[str, float | None]]:
        """Per origin: CPU-seconds, mean and peak cores against its quota; for one on a
        capped link, the bytes it sent and their mean and peak share of the cap."""
        first, last = self.samples[0], self.samples[-1]
        wall = max(last.t - first.t, 1e-9)
        step = max(1, round(METER_WINDOW_S / METER_S))
        windows = list(zip(self.samples, self.samples[step:])) or [(first, last)]
        out: dict[str, dict[str, float | None]] = {}
        for member in spec.members():
            role = member.role
            if role.startswith("node-"):
                continue
            used = last.cpu[role] - first.cpu[role]
            row: dict[str, float | None] = {
                "cpu_s": round(used, 3), "cores_mean": round(used / wall, 3),
                "cores_peak": round(max((b.cpu[role] - a.cpu[role]) / (b.t - a.t)
                                        for a, b in windows), 3),
                "quota_cores": spec.origin_cpu}
            if member.cap:
                cap = member.cap.rate_bytes_per_s
                sent = last.ports[role][0] - first.ports[role][0]
                peak = max((b.ports[role][0] - a.ports[role][0]) / (b.t - a.t)
                           for a, b in windows)
                row.update(sent_bytes=sent, link_mean=round(sent / wall / cap, 3),
                           link_peak=round(peak / cap, 3))
            out[role] = row
        return out

    def node_phases(self, i: int, t0: float, marks: dict[str, float]
                    ) -> dict[str, dict[str, float]]:
        """Node i's CPU-seconds and received bytes in each phase of its start (as
        :func:`phases` names them), read off the samples at its marks."""
        role = f"node-{i}"

        def cpu(sample: Sample) -> float:
            return sample.cpu[role]

        def received(sample: Sample) -> float:
            return sample.ports[role][1]

        out, last = {}, 0.0
        for name, duration in phases(marks).items():
            start, end = t0 + last, t0 + last + duration
            out[name] = {"cpu_s": round(self._at(end, cpu) - self._at(start, cpu), 3),
                         "received_bytes": round(self._at(end, received)
                                                 - self._at(start, received))}
            last += duration
        return out


#: A point's figures taken from its median run (by time-to-ready) rather than as medians
#: over its runs: they describe one run's nodes, and medians of them would describe none.
FROM_MEDIAN_RUN = ("nodes", "slowest_node", "slowest_phases_s")


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One point (a case at one N) from its repeated runs: every figure the median over the
    runs, those of :data:`FROM_MEDIAN_RUN` from the median run; ``runs`` keeps each run's
    headline figures (and, at N = 1, its node: the simulator calibrates each step on its
    median over the runs), and ``ready_max_spread`` their spread ((max - min) / median)."""
    ordered = sorted(runs, key=lambda r: r["ready_s"]["max"])
    middle = ordered[(len(ordered) - 1) // 2]
    point = {key: middle[key] if key in FROM_MEDIAN_RUN else
             _median_of([r.get(key) for r in runs], middle[key]) for key in middle}
    tops = [r["ready_s"]["max"] for r in runs]
    point["runs"] = [{"ready_s": r["ready_s"], "node_cpu_s": r["node_cpu_s"],
                      "origin_bytes_total": r["origin_bytes_total"],
                      "cpu_busy": r["cpu_busy"],
                      **({"nodes": r["nodes"]} if len(r["nodes"]) == 1 else {})} for r in runs]
    point["ready_max_spread"] = round((max(tops) - min(tops)) / statistics.median(tops), 3)
    return point


def _median_of(values: list[Any], model: Any) -> Any:
    """The median of numbers, key by key for dicts that share their keys; else ``model``
    (the median run's)."""
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                      for v in values):
        middle = statistics.median(values)
        return int(middle) if all(isinstance(v, int) for v in values) and \
            middle == int(middle) else round(middle, 3)
    if values and all(isinstance(v, dict) and v.keys() == model.keys() for v in values):
        return {k: _median_of([v[k] for v in values], model[k]) for k in model}
    return model


def quantile(values: list[float], q: float) -> float:
    """The q-quantile with linear interpolation (numpy's default), for a few values."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sizes = sorted({int(n) for n in args.nodes.split(",")})
        self.cases = select_cases(args.cases, CASES + EXTRA_CASES)
        for case in self.cases:  # each lab size's snapshot is published by bootseer_cold
            if case == "bootseer_cold":
                break
            if case != "baseline":
                raise SystemExit(f"--cases: {case} needs bootseer_cold before it (the first "
                                 f"start of each lab size publishes its snapshot)")
        self.spec = LabSpec(nodes=max(self.sizes), datanodes=args.datanodes,
                            node_link=parse_link(args.node_link),
                            datanode_link=parse_link(args.datanode_link),
                            origin_link=parse_link(args.origin_link), name="rst",
                            state_dir=Path(args.state_dir), hdfs_base_port=args.hdfs_base_port,
                            engines=True, p2p=True, origin_cpu=args.origin_cpu)
        self.lab = Lab(self.spec)
        self.job = self.spec.state_dir / "job"
        self.env_root = self.job / "envroot"        # every node's environment is here...
        self.venv = self.env_root / "venv"
        self.hdfs = f"hdfs://{self.spec.namenode.address}:{self.spec.hdfs_base_port}"
        cluster = self.lab.cluster
        assert cluster is not None
        self.webhdfs = f"http://{self.spec.namenode.address}:{cluster.spec.namenode_http_port}"
        self.shards: dict[int, list[tuple[str, str]]] = {}   # group -> [(name, sha256)]
        self.info: dict[str, Any] = {}
        #: Names this round's snapshot key, hot-list workload and job: one per lab size.
        self.round = "warmup"

    # -- what a node runs ----------------------------------------------------------------------

    def node_env_root(self, i: int) -> Path:
        return self.lab.node_files(i).root / "envroot"  # ...in its own mount namespace

    def bootseer(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "bootseer", *args]

    def requirements(self) -> Path:
        """The job's requirements; the comment names the round, so each round's first
        start is cold (its own snapshot key) while every node of the round shares one."""
        path = self.job / f"requirements-{self.round}.txt"
        ballast = [f"{BALLAST_WHEEL.replace('_', '-')}==1"] if self.args.artifact_scale > 1 else []
        path.write_text(f"# bench-restart, round {self.round}\n"
                        + "\n".join([*WHEELS, *ballast]) + "\n")
        return path

    def install_command(self) -> list[str]:
        index = self.spec.index_url
        # --isolated: no pip.conf or PIP_* of this machine (its local wheel mirrors): the
        # wheels come from the lab's index, through the caps.
        return ["sh", "-c", f"{PYTHON} -m venv {self.venv} && {self.venv}/bin/pip --isolated "
                f"install --quiet --no-cache-dir --disable-pip-version-check --index-url {index} "
                f"--trusted-host {self.spec.index.address} -r {self.requirements()}"]

    def env_command(self, bootseer: bool) -> list[str]:
        install = self.install_command()
        if not bootseer:
            return install
        # Extracted, not mounted (snapshot.mount): the restore runs in the node's private
        # mount namespace (private_env), where a mount would end with it, and the
        # containers get the node's directory bound from outside.
        return ["env", "BOOTSEER_SNAPSHOT_MOUNT=false",
                *self.bootseer("env", "run", "--path", str(self.venv), "--key-file",
                               str(self.requirements()), "--", *install)]

    def private_env(self, i: int, argv: list[str]) -> list[str]:
        """argv with node i's environment directory at the job's path (its own mount
        namespace: the path is the same on every node, as on real ones)."""
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh",
                str(self.node_env_root(i)), str(self.env_root), *argv]

    def checkpoint_url(self, group: int) -> str:
        return f"{self.hdfs}/restart/ckpt/g{group}"

    def container(self, i: int, case: str, key: str) -> list[str]:
        group = i % GROUPS
        env = ["-e", f"BOOTSEER_ENVS={key}"] if case in ENV_FROM_AGENT else \
            ["-v", f"{self.node_env_root(i)}:{self.env_root}:ro"]
        common = ["run", "--rm", "--network", "host", *env, "-v", f"{self.job}:/job:ro"]
        if case == "baseline":
            files = [(f"{self.webhdfs}/webhdfs/v1/restart/ckpt/g{group}/{name}?op=OPEN", digest)
                     for name, digest in self.shards[group]]
            return [*common, f"{self.spec.registry_address}/{REGISTRY_REF}",
                    str(self.venv / "bin/python"), "/job/job.py", json.dumps(files)]
        files = [(f"/mnt/checkpoints/ckpt/{name}", digest) for name, digest in self.shards[group]]
        if case != "bootseer_cold":  # a later restart: the hot list has converged
            common += ["-e", "BOOTSEER_RECORD=never"]
        return [*common, "--runtime", "bootseer", "-e", f"BOOTSEER_WORKLOAD=restart-{self.round}",
                "-e", f"BOOTSEER_CHECKPOINTS=ckpt={self.checkpoint_url(group)}",
                STUB, str(self.venv / "bin/python"), "/job/job.py", json.dumps(files)]

    def warm_command(self, i: int, key: str, swarm: int = 0) -> list[str]:
        """The job's warm on node i; with ``swarm`` nodes, as one job whose nodes share
        what they fetch (peer-to-peer): the job the node's containers then join (the one
        root warmed the node for: Docker 20.10 passes no annotation), so that their
        demand reads split the store reads by the members the warm gathered."""
        job = ["--job", f"restart-{self.round}-bootseer_p2p", "--nodes", str(swarm)] \
            if swarm else []
        return self.bootseer("warm", "--agent", "--json", *job, "--image", IMAGE,
                             "--workload", f"restart-{self.round}", "--env", key,
                             "--checkpoint", self.checkpoint_url(i % GROUPS))

    # -- one run ---------------------------------------------------------------------------------

    def node_start(self, i: int, case: str, n: int, key: str, t0: float) -> NodeRun:
        run = NodeRun(i)

        def step(name: str, result: subprocess.CompletedProcess) -> str:
            if result.returncode != 0:
                raise RunFailed(f"node {i} {case} {name}: exit {result.returncode}: "
                                f"{(result.stderr or '')[-1500:]}")
            run.marks[name] = round(time.time() - t0, 3)
            return result.stdout

        warm: threading.Thread | None = None
        try:
            if case == "bootseer_p2p":  # the job's warm first: its nodes share the fetches
                out = step("staged", self.lab.run(i, self.warm_command(i, key, swarm=n),
                                                  timeout=600))
                run.warm_parts = warm_parts(json.loads(out))
            elif case in WARM_AT_T0:
                def warm_now() -> None:
                    try:
                        out = step("warm", self.lab.run(i, self.warm_command(i, key),
                                                        timeout=600))
                        run.warm_parts = warm_parts(json.loads(out))
                    except (RunFailed, ValueError) as exc:
                        run.error = str(exc)
                warm = threading.Thread(target=warm_now)
                warm.start()
            if case == "baseline":
                step("image", self.lab.docker(i, "pull", "--quiet",
                                              f"{self.spec.registry_address}/{REGISTRY_REF}"))
            if case not in ENV_FROM_AGENT:
                step("env", self.lab.run(i, self.private_env(i, self.env_command(
                    bootseer=case != "baseline")), timeout=900))
            out = step("exited", self.lab.docker(i, *self.container(i, case, key)))
            marks = json.loads(out.strip().splitlines()[-1])
            run.marks.update({k: round(v - t0, 3) for k, v in marks.items()})
        except (RunFailed, subprocess.TimeoutExpired, ValueError) as exc:
            run.error = str(exc)
        if warm is not None:
            warm.join()
        return run

    def prepare(self, case: str, n: int, key: str) -> None:
        """Cold nodes: agents restarted on empty caches, no environment, no pulled image;
        for the prestaged cases, the warm done (untimed)."""
        nodes = list(range(n))
        self.lab.restart_agents(nodes, python_serving=case == "bootseer_prestaged_served")
        for i in nodes:
            root = self.node_env_root(i)
            if root.exists():
                shutil.rmtree(root)
            root.mkdir(parents=True)
            self.lab.docker(i, "rmi", "--force", f"{self.spec.registry_address}/{REGISTRY_REF}")
        if case in PRESTAGED:
            results = parallel(nodes, lambda i: self.lab.run(i, self.warm_command(i, key),
                                                              timeout=600))
            for i, result in zip(nodes, results, strict=True):
                if result.returncode != 0:
                    raise RunFailed(f"node {i}: warm before t0 failed: {result.stderr[-1500:]}")
            if case == "bootseer_prestaged":
                self.info.setdefault("warm", {})[n] = json.loads(results[0].stdout)
        drop_page_cache()

    @contextlib.contextmanager
    def node_budget(self, n: int) -> Iterator[None]:
        """``--node-cpu`` on the n nodes' cgroups for the timed starts only: the setup, the
        preparation and the warms before t0 are untimed, and would take minutes at a
        production node's share of this machine."""
        groups = [self.spec.node_cgroup(i) for i in range(n)]
        for group in groups:
            self.lab.cgroups.set_quota(group, self.args.node_cpu)
        try:
            yield
        finally:
            for group in groups:
                self.lab.cgroups.set_quota(group, None)

    def origin_bytes(self) -> dict[str, int]:
        roles = [self.spec.datanode(j).role for j in range(self.spec.datanodes)]
        return {role: self.lab.link_bytes(role)[0] for role in [*roles, "registry", "index"]}

    def run_case(self, case: str, n: int, key: str, budget: bool = True) -> dict[str, Any]:
        """One timed start of ``case`` on n cold nodes; ``budget``: under ``--node-cpu``."""
        self.prepare(case, n, key)
        # The lab's own load at rest (agents, engines, HDFS): wait for what the preparation
        # set going (restarted agents and their spares, an engine deleting an image) to settle.
        deadline = time.monotonic() + QUIET_WAIT_S
        while True:
            idle0 = cpu_times()
            time.sleep(IDLE_PROBE_S)
            idle = busy_fraction(idle0, cpu_times())
            if idle <= QUIET_BUSY or time.monotonic() > deadline:
                break
        before, cpu0, node_cpu0 = self.origin_bytes(), cpu_times(), self.lab.node_cpu_s()
        with (self.node_budget(n) if budget else contextlib.nullcontext()), \
                LabMeter(self.lab, n) as meter:
            t0 = time.time()
            runs = parallel(list(range(n)), lambda i: self.node_start(i, case, n, key, t0))
            wall = time.time() - t0
        after, cpu1, node_cpu1 = self.origin_bytes(), cpu_times(), self.lab.node_cpu_s()
        node_cpu = [node_cpu1[i] - node_cpu0[i] for i in range(n)]
        image_cpu = [c for c in (self.image_server_cpu_s(i, t0) for i in range(n))
                     if c is not None]
        failed = [r for r in runs if r.ready is None]
        if failed:
            raise RunFailed(f"{case} at N={n}: {len(failed)} node(s) failed; first: "
                            f"{failed[0].error}")
        ready = [r.ready for r in runs]
        slowest = max(runs, key=lambda r: r.ready)
        served = {k: after[k] - before[k] for k in after}
        dns = [v for k, v in served.items() if k.startswith("datanode")]
        result = {
            "ready_s": {"p50": round(statistics.median(ready), 3),
                        "p99": round(quantile(ready, 0.99), 3), "max": round(max(ready), 3)},
            "slowest_node": slowest.node,
            "slowest_phases_s": phases(slowest.marks),
            "nodes": [{"node": r.node, "marks": r.marks, "cpu_s": round(node_cpu[r.node], 3),
                       "phases": meter.node_phases(r.node, t0, r.marks),
                       **({"warm_parts": r.warm_parts} if r.warm_parts else {})}
                      for r in runs],
            "node_cpu_s": {"p50": round(statistics.median(node_cpu), 3),
                           "max": round(max(node_cpu), 3)},
            # Of it, the image's FUSE server (the mount's own report; lazy cases only).
            "image_server_cpu_s": {"p50": round(statistics.median(image_cpu), 3),
                                   "max": round(max(image_cpu), 3)} if image_cpu else None,
            "origin_bytes": served,
            "origin_bytes_total": sum(served.values()),
            "datanode_max_over_mean": round(max(dns) / statistics.mean(dns), 3)
            if dns and statistics.mean(dns) > 0 else None,
            "origins": meter.origins(self.spec),
            "cpu_busy": round(busy_fraction(cpu0, cpu1), 3),
            "cpu_busy_idle": round(idle, 3),
            "wall_s": round(wall, 3),
        }
        log.info("%-18s N=%-2d ready p50 %.2f max %.2f s (node %d: %s); origins %.1f MB; "
                 "cpu %.2f, per node %.2f s", case, n, result["ready_s"]["p50"],
                 result["ready_s"]["max"], slowest.node, result["slowest_phases_s"],
                 sum(served.values()) / MB, result["cpu_busy"],
                 result["node_cpu_s"]["p50"])
        return result

    def image_server_cpu_s(self, i: int, since: float, timeout: float = 60) -> float | None:
        """The CPU of the image servers of node i's starts since ``since`` (their mounts'
        reports, complete once the engine's poststop hook released the start: waited for),
        None if no start there had one (the baseline runs no lazy image)."""
        deadline = time.monotonic() + timeout
        with AgentClient(self.lab.node_files(i).socket) as client:
            while True:
                starts = client.starts(since)
                if all("exited" in s.phases for s in starts):
                    break
                if time.monotonic() > deadline:
                    raise RunFailed(f"node {i}: the agent's starts did not complete: {starts}")
                time.sleep(0.1)
        cpu = [s.detail.get("image", {}).get("server_cpu_s") for s in starts]
        cpu = [c for c in cpu if c is not None]
        return sum(cpu) if cpu else None

    # -- setup -----------------------------------------------------------------------------------

    def wheels(self) -> list[Path]:
        """The job's wheels, downloaded once into the user's cache."""
        cache = Path.home() / ".cache/bootseer/wheels" / hashlib.sha256(
            " ".join(WHEELS).encode()).hexdigest()[:16]
        if not cache.is_dir() or len(list(cache.glob("*.whl"))) < len(WHEELS):
            cache.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--only-binary=:all:", "--python-version", "3.11", "-d", str(cache),
                            *WHEELS], check=True)
        return sorted(cache.glob("*.whl"))

    def checked(self, result: subprocess.CompletedProcess, what: str) -> str:
        if result.returncode != 0:
            raise RunFailed(f"{what}: exit {result.returncode}: {result.stderr[-2000:]}")
        return result.stdout

    def ballast(self, nbytes: int, seed: int) -> bytes:
        return random.Random(seed).randbytes(nbytes)

    def scaled_image(self, layout: Path) -> Path:
        """The job's image; at ``--artifact-scale`` K > 1, with a layer of K - 1 times
        IMAGE_BALLAST random bytes the job reads at its start."""
        scale = self.args.artifact_scale
        if scale <= 1:
            return layout
        image, extra = place(layout, self.job / "image"), self.job / "image-extra"
        (extra / "opt").mkdir(parents=True, exist_ok=True)
        (extra / BALLAST_FILE.lstrip("/")).write_bytes(
            self.ballast(round((scale - 1) * IMAGE_BALLAST), 1))
        append_layer(image, extra, f"COPY {BALLAST_FILE} (bench-restart --artifact-scale "
                     f"{scale})", "2026-11-28T00:00:00Z")
        shutil.rmtree(extra)
        return image

    def ballast_wheel(self) -> list[Path]:
        """At ``--artifact-scale`` K > 1, a wheel of K - 1 times ENV_BALLAST random bytes
        for the environment (none otherwise)."""
        scale = self.args.artifact_scale
        if scale <= 1:
            return []
        name = f"{BALLAST_WHEEL}-1"
        path = self.job / "wheels" / f"{name}-py3-none-any.whl"
        path.parent.mkdir(parents=True, exist_ok=True)
        files = {f"{BALLAST_WHEEL}/__init__.py": b"",
                 f"{BALLAST_WHEEL}/data.bin": self.ballast(round((scale - 1) * ENV_BALLAST), 2),
                 f"{name}.dist-info/METADATA":
                     f"Metadata-Version: 2.1\nName: {BALLAST_WHEEL}\nVersion: 1\n".encode(),
                 f"{name}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench-restart\n"
                                            b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
        record = "".join(
            f"{arc},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip('=')},{len(data)}\n"
            for arc, data in files.items()) + f"{name}.dist-info/RECORD,,\n"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as wheel:
            for arc, data in [*files.items(), (f"{name}.dist-info/RECORD", record.encode())]:
                wheel.writestr(arc, data)
        return [path]

    def setup(self) -> dict[str, Any]:
        t = time.perf_counter()
        self.job.mkdir(parents=True, exist_ok=True)
        base = build_image(with_python=True)
        layout = self.scaled_image(base)
        info = read_build_info(base)
        wheels = self.wheels() + self.ballast_wheel()
        shard_bytes = round(SHARD_BYTES * self.args.artifact_scale)
        self.lab.up(timeout_s=180)
        self.job.mkdir(parents=True, exist_ok=True)
        self.env_root.mkdir(exist_ok=True)
        (self.job / "job.py").write_text(JOB_PY)
        for wheel in wheels:  # PEP 503: simple/<normalized project>/<files>
            project = wheel.name.split("-")[0].lower().replace("_", "-")
            (index_dir(self.spec) / "simple" / project).mkdir(parents=True, exist_ok=True)
            shutil.copy(wheel, index_dir(self.spec) / "simple" / project / wheel.name)
        # The checkpoint: random shards (seeded), put into HDFS through node 0.
        local = self.job / "ckpt"
        rng = random.Random(20261124)
        for g in range(GROUPS):
            (local / f"g{g}").mkdir(parents=True, exist_ok=True)
            for k in range(SHARDS):
                data = rng.randbytes(shard_bytes)
                (local / f"g{g}" / f"shard{k}.bin").write_bytes(data)
                self.shards.setdefault(g, []).append(
                    (f"shard{k}.bin", hashlib.sha256(data).hexdigest()))
        self.checked(self.lab.run(0, self.bootseer("ckpt", "put", str(local),
                                                   f"{self.hdfs}/restart/ckpt")), "ckpt put")
        shutil.rmtree(local)
        # The image: in the registry (pushed from the registry's own namespace: no cap) and
        # converted into the store; each engine gets the stub.
        self.checked(subprocess.run(
            [*netns.enter_argv(self.spec.registry.netns), "skopeo", "copy", "--quiet",
             "--dest-tls-verify=false", f"oci:{layout}",
             f"docker://{self.spec.registry_address}/{REGISTRY_REF}"],
            capture_output=True, text=True), "skopeo copy")
        self.checked(self.lab.run(0, self.bootseer("image", "convert", str(layout), "--name",
                                                   IMAGE)), "image convert")
        for i in range(self.spec.nodes):
            self.checked(self.lab.run(i, self.bootseer(
                "image", "docker-stub", IMAGE, "--tag", STUB, "--docker-host",
                self.lab.node_files(i).docker_host)), f"docker-stub on node {i}")
        log.info("setup in %.1f s", time.perf_counter() - t)
        ballast = round((self.args.artifact_scale - 1) * IMAGE_BALLAST)
        return {"image": {"layout": str(layout), "rootfs_bytes": info.rootfs_bytes + ballast,
                          "layer_bytes": sum(layer.size for layer in open_image(layout).layers)},
                "wheels": {w.name: w.stat().st_size for w in wheels},
                "checkpoint": {"groups": GROUPS, "shards_per_group": SHARDS,
                               "shard_bytes": shard_bytes,
                               "bytes_per_node": SHARDS * shard_bytes},
                "artifact_scale": self.args.artifact_scale}

    def env_key(self) -> str:
        argv = self.bootseer("env", "key", "--path", str(self.venv), "--key-file",
                             str(self.requirements()), "--", *self.install_command())
        return self.checked(self.lab.run(0, argv), "env key").strip()

    def fan_out(self, n: int, key: str) -> dict[str, Any]:
        """Raise the replication of what the job reads; wait until HDFS has copied it."""
        argv = self.bootseer("job", "fanout", f"restart-{self.round}", "--nodes", str(n),
                             "--image", IMAGE, "--workload", f"restart-{self.round}", "--env", key,
                             "--max-replicas", str(self.spec.datanodes),
                             *[a for g in range(GROUPS)
                               for a in ("--checkpoint", self.checkpoint_url(g))])
        result = self.lab.run(0, argv)
        self.checked(result, "job fanout")
        said = " ".join(result.stderr.split())
        changed = re.search(r": (\d+) of (\d+) objects now kept (\d+)-fold", said)
        if not changed:
            raise RunFailed(f"job fanout said {said!r}")
        t = time.perf_counter()
        jmx = (f"{self.webhdfs}/jmx?qry=Hadoop:service=NameNode,name=FSNamesystem")

        def pending() -> int:
            bean = json.load(urllib.request.urlopen(jmx, timeout=10))["beans"][0]
            return bean["UnderReplicatedBlocks"] + bean["PendingReplicationBlocks"]

        while netns.call_in(self.spec.namenode.netns, pending):
            if time.perf_counter() - t > 600:
                raise RunFailed("HDFS did not finish the fan-out's replication in 600 s")
            time.sleep(1)
        return {"said": said, "objects_changed": int(changed[1]), "objects": int(changed[2]),
                "replicas": int(changed[3]),
                "replicated_in_s": round(time.perf_counter() - t, 1)}

    # -- the benchmark -----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        recording = Recording("restart")
        try:
            setup = self.setup()
            # Untimed: the first pull, pip run, WebHDFS read and HDFS write after setup pay
            # one-time costs (JIT, first connections) that no later restart pays.
            key = self.env_key()
            for case in ("baseline", "bootseer_cold"):
                self.run_case(case, 1, key, budget=False)
            repeats: dict[str, dict[int, list[Any]]] = {c: {} for c in self.cases}
            for n in self.sizes:
                for k in range(self.args.repeats):
                    # A round per repeat: its own snapshot key and workload, so that each
                    # repeat's first start is cold again.
                    self.round = f"n{n}r{k + 1}"
                    for case, result in self.run_round(n, setup).items():
                        repeats[case].setdefault(n, []).append(result)
            cases = {case: {n: combine(runs) for n, runs in by_n.items()}
                     for case, by_n in repeats.items()}
        finally:
            self.lab.down()
            if not self.args.keep_state:  # the engines' images, the caches, HDFS's blocks
                shutil.rmtree(self.spec.state_dir, ignore_errors=True)
        return self.result(recording, setup, cases)

    def run_round(self, n: int, setup: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Every case once on n nodes, in order, under this round's key."""
        key = self.env_key()
        out = {case: self.run_case(case, n, key) for case in self.cases
               if case != "bootseer_fanout"}
        if "bootseer_fanout" in self.cases and n == max(self.sizes):
            setup["fanout"] = fanned = self.fan_out(n, key)
            try:
                out["bootseer_fanout"] = self.run_case("bootseer_fanout", n, key)
            finally:
                if fanned["objects_changed"]:
                    self.checked(self.lab.run(0, self.bootseer(
                        "job", "restore", f"restart-{self.round}")), "job restore")
        return out

    def result(self, recording: Recording, setup: dict[str, Any],
               cases: dict[str, dict[int, Any]]) -> dict[str, Any]:
        spec = self.spec
        # The fan-out factor: origin bytes at N over the same case's at N = 1.
        for runs in cases.values():
            one = runs.get(1, {}).get("origin_bytes_total")
            for r in runs.values():
                r["fanout_factor"] = round(r["origin_bytes_total"] / one, 2) if one else None
        top = max(self.sizes)
        warm = setup.get("warm") or self.info.get("warm", {})
        first_warm = warm.get(min(warm)) if warm else None
        lab = {
            "caps": {"node_Bps": spec.node_link.rate_bytes_per_s,
                     "datanode_Bps": spec.datanode_link.rate_bytes_per_s,
                     "registry_Bps": spec.origin_link.rate_bytes_per_s,
                     "index_Bps": spec.origin_link.rate_bytes_per_s,
                     "datanodes": spec.datanodes, "cpus": os_cpus(),
                     "node_cpu_quota_cores": self.args.node_cpu,
                     "hdfs_block_size": spec.block_size, "replication": 1},
            "per_node_bytes": self.per_node_bytes(setup, cases, first_warm),
            "checkpoint_groups": GROUPS,  # node i reads group i % GROUPS
            "artifact_scale": self.args.artifact_scale,
            "p2p_shared": list(P2P_SHARED),
            "cases": {case: {str(n): r for n, r in runs.items()}
                      for case, runs in cases.items()},
        }

        def ready(case: str, n: int, q: str = "max") -> float | None:
            r = cases.get(case, {}).get(n)
            return r["ready_s"][q] if r else None

        def node_cpu(case: str) -> dict[str, float]:
            """The case's per-node CPU seconds (p50 over nodes), per N."""
            return {str(n): r["node_cpu_s"]["p50"] for n, r in
                    sorted(cases.get(case, {}).items())}

        def server_cpu(case: str) -> dict[str, float | None]:
            """Of it, the image servers' (p50 over nodes), per N."""
            return {str(n): (r["image_server_cpu_s"] or {}).get("p50")
                    for n, r in sorted(cases.get(case, {}).items())}

        def ratio(a: float | None, b: float | None) -> float | None:
            return round(a / b, 3) if a is not None and b else None

        # The job's unique bytes: one hot pack, one snapshot, one checkpoint per group.
        need = lab["per_node_bytes"]
        parts = [need["image_hot"], need["env_snapshot"], need["checkpoint"]]
        job_bytes = (parts[0] + parts[1] + parts[2] * min(GROUPS, top)
                     if None not in parts else None)
        p2p_top = cases.get("bootseer_p2p", {}).get(top)

        result: dict[str, Any] = {
            **recording.header(runs=self.args.repeats, caps={
                "text": f"nodes {spec.node_link}, {spec.datanodes} DataNodes at "
                        f"{spec.datanode_link} each, registry and index {spec.origin_link} "
                        "each, both directions (tc htb)",
                "node_Bps": spec.node_link.rate_bytes_per_s,
                "datanode_Bps": spec.datanode_link.rate_bytes_per_s,
                "origin_Bps": spec.origin_link.rate_bytes_per_s,
                "latency": LATENCY}),
            "scale_down": spec.scale_down(),
            "bootseer_vs_baseline_n16": ratio(ready("bootseer", top), ready("baseline", top)),
            "bootseer_p99_over_p50_n16": ratio(ready("bootseer", top, "p99"),
                                                ready("bootseer", top, "p50")),
            "datanode_max_over_mean_fanout_n16":
                cases.get("bootseer_fanout", {}).get(top, {}).get("datanode_max_over_mean"),
            "p2p_origin_bytes_over_node_bytes_n16":
                cases.get("bootseer_p2p", {}).get(top, {}).get("fanout_factor"),
            "p2p_origin_bytes_over_job_bytes_n16":
                ratio(p2p_top["origin_bytes_total"], job_bytes) if p2p_top else None,
            "job_bytes": job_bytes,
            "job_bytes_note": "hot pack + snapshot + one checkpoint per group (payload); "
                              "origin bytes are what the origins' links carried, TCP/IP "
                              "and HDFS framing included (about 5% more than payload)",
            "p2p_ready_n16_over_n1": ratio(ready("bootseer_p2p", top), ready("bootseer_p2p", 1)),
            "prestaged_ready_n16_over_n1": ratio(ready("bootseer_prestaged", top),
                                                 ready("bootseer_prestaged", 1)),
            "cold_ready_n16_over_n1": ratio(ready("bootseer_cold", top),
                                            ready("bootseer_cold", 1)),
            "p2p_p99_over_p50_n16": ratio(ready("bootseer_p2p", top, "p99"),
                                           ready("bootseer_p2p", top, "p50")),
            "datanode_max_over_mean_n16":
                cases.get("bootseer", {}).get(top, {}).get("datanode_max_over_mean"),
            "prestaged_node_cpu_s": node_cpu("bootseer_prestaged"),
            "prestaged_image_server_cpu_s": server_cpu("bootseer_prestaged"),
            "prestaged_served_node_cpu_s": node_cpu("bootseer_prestaged_served"),
            "prestaged_served_image_server_cpu_s":
                server_cpu("bootseer_prestaged_served"),
            # What the kernel's serving of the image saves a node: the same prestaged start
            # with the image served in Python, less it (per N).
            "prestaged_node_cpu_saved_s": {
                n: round(served - kernel, 3) for n, served in
                node_cpu("bootseer_prestaged_served").items()
                if (kernel := node_cpu("bootseer_prestaged").get(n)) is not None},
            # What the agent's mount of the environment saves a node: the same prestaged
            # start with the environment extracted on the node by env run, less it (per N;
            # only when bootseer_prestaged_env_extracted ran).
            "prestaged_env_extracted_node_cpu_s": node_cpu("bootseer_prestaged_env_extracted"),
            "prestaged_env_node_cpu_saved_s": {
                n: round(extracted - mounted, 3) for n, extracted in
                node_cpu("bootseer_prestaged_env_extracted").items()
                if (mounted := node_cpu("bootseer_prestaged").get(n)) is not None},
            "node_cpu_note": NODE_CPU_NOTE,
            "node_cpu_quota_cores": self.args.node_cpu,
            "origin_cpu_quota_cores": spec.origin_cpu,
            "origins_note": ORIGINS_NOTE,
            "largest_n": top,
            "setup": setup,
            "table": table_rows(cases),
            "lab": lab,
        }
        if self.args.simulate:
            add_simulation(result, Path(self.args.png), self.args.fit_with)
        return result

    def per_node_bytes(self, setup: dict[str, Any], cases: dict[str, dict[int, Any]],
                       warm: dict[str, Any] | None) -> dict[str, float | None]:
        """What one node needs of each artifact: from the build, the wheels, the warm's
        summary (hot pack, snapshot) and the cold start's DataNode bytes (lazy reads)."""
        ckpt = setup["checkpoint"]["bytes_per_node"]
        cold = cases.get("bootseer_cold", {}).get(1)
        lazy = None
        if cold:
            lazy = sum(v for k, v in cold["origin_bytes"].items()
                       if k.startswith("datanode")) - ckpt
        return {"image_layers": setup["image"]["layer_bytes"],
                "image_lazy": lazy,
                "image_hot": (warm or {}).get("image", {}).get("bytes") if warm else None,
                "wheels": sum(setup["wheels"].values()),
                "env_snapshot": sum(e["bytes"] for e in warm["envs"]) if warm else None,
                "checkpoint": ckpt}


def add_simulation(result: dict[str, Any], png: Path, fit_with: list[str]) -> None:
    """The fleet simulator calibrated from the lab's N = 1 runs, validated against every
    N, extrapolated to production scale from each step's CPU fitted on the lab and on
    ``fit_with`` (the same lab at other artifact scales; a PNG at ``png``): its section
    and summary keys."""
    from bootseer_dev import fleetsim

    sizes = [json.loads(Path(path).read_text())["lab"] for path in fit_with]
    sim = fleetsim.report(result["lab"], png, sizes=sizes)
    result["sim"] = sim
    result["sim_fit_with"] = {path: lab.get("artifact_scale") for path, lab in
                              zip(fit_with, sizes, strict=True)}
    for key in ("sim_max_validation_error", "sim_bootseer_vs_baseline_n1000",
                "sim_p2p_ready_n1000_over_n1", "sim_p2p_ready_n1000_s", "node_limit_n1000_s"):
        result[key] = sim[key]


def os_cpus() -> int:
    return len(os.sched_getaffinity(0))


def parallel(items: list[int], fn: Callable[[int], Any]) -> list[Any]:
    """fn(item) for every item at once, one thread each; results in order."""
    results: list[Any] = [None] * len(items)

    def one(k: int) -> None:
        results[k] = fn(items[k])

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def phases(marks: dict[str, float]) -> dict[str, float]:
    """Each step's duration: from the previous mark (in time order) to its own."""
    out, last = {}, 0.0
    for name, at in sorted(marks.items(), key=lambda kv: kv[1]):
        if name in ("exited", "warm"):
            continue
        out[name] = round(at - last, 3)
        last = at
    return out


def warm_parts(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """A warm's summary (``bootseer warm --json``) as its parts in the order they were
    staged: each one's seconds, store bytes and (a job's warm) bytes from peers, and the
    image's work for later starts (``whole_files_s``, part of its seconds, done after
    every other part)."""
    parts = [("image", summary.get("image"))] + \
        [("env", e) for e in summary.get("envs") or []] + \
        [("checkpoint", c) for c in summary.get("checkpoints") or []]
    return [{"part": kind, "seconds": part["seconds"], "fetched_bytes": part["fetched_bytes"],
             **{k: part[k] for k in ("peer_bytes", "whole_files_s") if k in part}}
            for kind, part in parts if part]


def table_rows(cases: dict[str, dict[int, Any]]) -> list[dict[str, Any]]:
    rows = []
    for case, runs in cases.items():
        for n, r in sorted(runs.items()):
            rows.append({"case": case, "n": n, **{f"{q}_s": v for q, v in r["ready_s"].items()},
                         "p99_over_p50": round(r["ready_s"]["p99"] / r["ready_s"]["p50"], 3),
                         "origin_MB": round(r["origin_bytes_total"] / MB, 1),
                         "fanout_factor": r.get("fanout_factor"),
                         "datanode_max_over_mean": r["datanode_max_over_mean"],
                         "node_cpu_s": r["node_cpu_s"]["p50"],
                         "cpu_busy": r["cpu_busy"],
                         "max_spread": r.get("ready_max_spread")})
    return rows


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{'case':20s} {'N':>3s} {'p50':>7s} {'p99':>7s} {'max':>7s} {'p99/p50':>7s} "
             f"{'originMB':>9s} {'fanout':>6s} {'DNmax/mean':>10s} {'nodeCPU':>7s} "
             f"{'cpu':>5s} {'spread':>6s}"]
    for r in result["table"]:
        lines.append(f"{r['case']:20s} {r['n']:3d} {r['p50_s']:7.2f} {r['p99_s']:7.2f} "
                     f"{r['max_s']:7.2f} {r['p99_over_p50']:7.2f} {r['origin_MB']:9.1f} "
                     f"{r['fanout_factor'] or 0:6.2f} {r['datanode_max_over_mean'] or 0:10.2f} "
                     f"{r['node_cpu_s']:7.2f} {r['cpu_busy']:5.2f} "
                     f"{r.get('max_spread') or 0:6.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench-results/restart.json")
    parser.add_argument("--png", default="bench-results/restart.png")
    parser.add_argument("--nodes", default="1,2,4,8,16", help="Lab sizes, comma-separated.")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--datanodes", type=int, default=4)
    parser.add_argument("--node-link", default="25MB/s")
    parser.add_argument("--datanode-link", default="40MB/s")
    parser.add_argument("--origin-link", default="40MB/s")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of every case at every N (medians and spread)")
    parser.add_argument("--node-cpu", type=float, default=None,
                        help="each node's CPU quota in cores (its cgroup's) during the timed "
                             "starts, the same at every N; default: none (each node's CPU "
                             "is still counted)")
    parser.add_argument("--origin-cpu", type=float, default=None,
                        help="each origin's CPU quota in cores (NameNode, DataNodes, "
                             "registry, index); default: none (counted)")
    parser.add_argument("--hdfs-base-port", type=int, default=19700)
    parser.add_argument("--state-dir", default="/var/tmp/bootseer-bench-restart")
    parser.add_argument("--keep-state", action="store_true",
                        help="Keep the lab's state dir (logs, engines' images, caches).")
    parser.add_argument("--no-simulate", dest="simulate", action="store_false",
                        help="Leave out the simulator's calibration and extrapolation.")
    parser.add_argument("--artifact-scale", type=float, default=1.0,
                        help="Every artifact about this many times as big (random ballast "
                             "in the image and the environment, larger checkpoint shards): "
                             "the second size the simulator's cost fit needs.")
    parser.add_argument("--fit-with", action="append", default=[], metavar="JSON",
                        help="A bench-restart result of the same lab at another "
                             "--artifact-scale (its N = 1 runs): the simulator fits each "
                             "step's fixed and per-byte CPU on both.")
    parser.add_argument("--resimulate", action="store_true",
                        help="Run no lab: recompute the simulator's section of --out from "
                             "the lab figures already in it.")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if not 1 <= args.artifact_scale <= 16:
        parser.error("--artifact-scale must be in 1..16")
    if args.node_cpu is not None and not 0.01 <= args.node_cpu <= 1024:
        parser.error("--node-cpu must be in 0.01..1024 cores")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    out = Path(args.out)
    if args.resimulate:
        result = json.loads(out.read_text())
        # a lab run before its caps named the node budget had it at the top level only
        result["lab"]["caps"].setdefault("node_cpu_quota_cores",
                                         result.get("node_cpu_quota_cores"))
        add_simulation(result, Path(args.png), args.fit_with)
    else:
        result = Bench(args).run()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""``make bench-image``: start a >= 1 GiB image — docker pull + run vs Bootseer's lazy start.

The image is real: Debian bookworm minbase + python3 + torch 2.13.0 (CPU) and numpy
(``bootseer_dev.image.build_image(with_torch=True)``, three layers, ~1.1 GB of files).
``make bench-image-cuda`` (``--image cuda``) runs the same on a training image's size: the
CUDA build of torch 2.14.1 with its ``nvidia-*`` libraries and numpy (``with_torch_cuda``,
~6 GB of files, writes ``bench-results/image-cuda.json``).
The start is real too: ``python3 -c "import torch; ..."``, ready when it exits (its output
is checked). Two stores sit behind the same link cap, ``--link-mbps`` MB/s, each in a tc
htb class of its own on ``lo`` (the kernel has no ``sch_netem``, so no latency is added;
loopback round trips are ~0.1 ms):

* a local HDFS cluster (1 DataNode, replication 1), its DataNode's egress capped: it holds
  the lazy image (``bootseer image convert``) and the image's gzip layer blobs as they are
  (``refs/registry/torch``, for ``full_pull``);
* a registry (Debian's ``docker-registry``) on a loopback port, that port's egress capped:
  it holds the same OCI image, pushed with skopeo (same blobs, same digests).

Every measured run starts cold (a fresh agent cache, unpack directory or Docker data root,
and a dropped page cache) and is timed from spawning the first command to the exit of the
last one:

* ``docker_pull_run_s``: what a user runs today. A fresh ``dockerd`` (empty data root,
  started untimed), then ``docker pull`` from the registry and ``docker run`` of the
  workload. Each run also measures ``docker_local_s``: the same ``docker run`` once more,
  page cache dropped, the image already in Docker (docker's own floor);
* ``full_pull_s``: ``full_pull.py pull``: download every layer blob from HDFS (3 at once,
  sha256 checked), extract them in order as they arrive, run on an overlay in runc;
* the lazy cases, the production path: ``docker run --runtime bootseer`` of the stub image
  (``bootseer image docker-stub``): ``bootseer-runtime`` asks a ``bootseer agent`` (fresh
  cache, started untimed) for the container's root, which the agent serves from the HDFS
  store through its FUSE mount (``bootseer.fuse``):
  ``lazy_s`` (no prefetch, no recording), ``record_s`` (once: records the hot list and
  writes the hot pack), ``lazy_prefetch_s`` (prefetch of the recorded hot list),
  ``lazy_warmed_s`` (``bootseer warm`` through the agent first, untimed: every hot block
  local, every file the hot list touches kept whole, and the image's metadata image
  built, so that the container's root is an overlay over that EROFS image and the kernel
  answers its names and reads its files from the whole files; the warm's own time, with
  no start competing, is ``warm_s``, of which ``warm_metadata_image_s`` the build);
  ``lazy_warmed_fuse_s``: the same with ``image.kernel_metadata`` off (names through the
  server, whole files by FUSE passthrough); ``lazy_warmed_served_s``: with
  ``image.passthrough`` off too (the warm stages the hot blocks only, the server serves
  every read), each measured in the same run;
* ``local_s``: ``full_pull.py run`` on the image unpacked beforehand on local disk: the
  floor.

For each case the machine's CPU busy fraction during the run is recorded (2 cores: near 1.0
means CPU, not the link, bounds the run). Each lazy start's mount also reports what
loading the manifest cost (bytes, decode seconds), the FUSE requests its server answered,
and how long the mount took to be ready (``mount_ready_s``: from the runtime shim's request
to the agent until the server serves, manifest fetched and decoded). Medians of ``--runs``
runs. Goals: ``lazy_prefetch_s <= 0.25 x docker_pull_run_s`` (CPU image) or
``<= 0.15 x full_pull_s`` (CUDA image), ``lazy_prefetch_s <= 1.3 x (local_s + hot_bytes /
link rate)``, and for the CUDA image ``mount_ready_s <= 0.5``. Writes
``bench-results/image.json`` (``image-cuda.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import (
    CappedCluster,
    Recording,
    RunFailed,
    busy_fraction,
    cpu_times,
    drop_page_cache,
    figure,
    median_of,
    select_cases,
)

from bootseer.agents.client import AgentClient
from bootseer.agents.timeline import StartRecord
from bootseer_dev.cluster import parse_link
from bootseer_dev.cluster.linkcap import describe
from bootseer_dev.engines import Dockerd, Registry, deployed_daemon_config, start_agent
from bootseer_dev.image import build_image, read_build_info, unmount, unpack_image

log = logging.getLogger("bench-image")
HERE = Path(__file__).resolve().parent
FULL_PULL = HERE / "full_pull.py"
RUNTIME = Path(sys.executable).parent / "bootseer-runtime"
MB, MIB = 1e6, 1 << 20


@dataclass(frozen=True)
class BenchImage:
    """Which image is started: how it is built, and the names it goes by."""

    name: str  # in the store (``images/<name>``) and the hot list's image
    build: dict[str, bool]  # build_image's keyword arguments
    out: str  # the results file's default name

    @property
    def stub(self) -> str:
        return f"bootseer/{self.name}:1"

    @property
    def registry_ref(self) -> str:
        return f"bench/{self.name}:1"


IMAGES = {"cpu": BenchImage("torch", {"with_torch": True}, "image.json"),
          "cuda": BenchImage("torch-cuda", {"with_torch_cuda": True}, "image-cuda.json")}
WORKLOAD = ["python3", "-c",
            "import torch; x = torch.ones(256, 256); print(float((x @ x).sum()))"]
EXPECTED = "16777216.0"  # 256 * 256 * 256
CASES = ("local", "full_pull", "docker_pull_run", "lazy", "lazy_prefetch", "lazy_warmed",
         "lazy_warmed_fuse", "lazy_warmed_served")
LAZY_CASES = ("lazy", "lazy_prefetch", "lazy_warmed", "lazy_warmed_fuse", "lazy_warmed_served")
WARMED_CASES = ("lazy_warmed", "lazy_warmed_fuse", "lazy_warmed_served")
PATH = "bootseer-runtime + agent (bootseer.fuse)"
LATENCY = "none added: kernel has no sch_netem"
#: A case's one run in its scratch directory: its Run, or several cases' by name.
Measure = Callable[[Path, str], "Run | dict[str, Run]"]


def mounts_below(path: Path) -> list[Path]:
    prefix = str(path.resolve()).rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if (target + "/").startswith(prefix):
                found.append(Path(target))
    return sorted(found, key=lambda p: -len(p.parts))  # deepest first


@dataclass
class Run:
    """One measured run: wall seconds from the first spawn to the last exit, each
    command's own seconds, the machine's CPU busy fraction meanwhile, and what the case
    adds (a report, the agent's start record)."""

    seconds: float
    steps: list[float]
    cpu_busy: float
    cpu_busy_before: float  # in the second before: what others on the machine were using
    started: float  # time.time() at the first spawn, to place the agent's phases
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "steps_s": [round(s, 3) for s in self.steps],
                "cpu_busy": round(self.cpu_busy, 3),
                "cpu_busy_before": round(self.cpu_busy_before, 3), **self.extra}


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.image = IMAGES[args.image]
        self.cap = parse_link(f"{args.link_mbps:g}MB/s")
        self.hdfs = CappedCluster(work, base_port=args.base_port, cap=self.cap,
                                  block_size=args.block_size * MIB)
        self.cluster, self.url = self.hdfs.cluster, self.hdfs.url
        self.recording = Recording("image-cuda" if args.image == "cuda" else "image")
        self.env = dict(os.environ)
        self.details: dict[str, list[dict]] = {}
        self.registry: Registry | None = None
        self.registry_tc = work / "registry-tc.json"
        self.dockerd: Dockerd | None = None  # the lazy cases' engine (runtime "bootseer")
        self.agent_sock = work / "run" / "agent.sock"

    # -- running things ----------------------------------------------------------------------

    def bootseer(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "bootseer", "--store", self.url, *args]

    def cold(self, what: str, commands: list[list[str]]) -> Run:
        """Drop the page cache, then run ``commands`` one after another, timed; the last
        one's output must be the workload's. The machine's CPU use is sampled for a second
        before (others' load: this machine is shared) and over the run."""
        drop_page_cache()
        idle0 = cpu_times()
        time.sleep(1.0)
        cpu0, started, start = cpu_times(), time.time(), time.perf_counter()
        steps, proc = [], None
        for argv in commands:
            t = time.perf_counter()
            proc = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                                  timeout=self.args.timeout, stdin=subprocess.DEVNULL)
            steps.append(time.perf_counter() - t)
            if proc.returncode != 0:
                break
        seconds, cpu1 = time.perf_counter() - start, cpu_times()
        assert proc is not None
        if proc.returncode != 0 or EXPECTED not in proc.stdout:
            raise RunFailed(f"{what} failed (rc={proc.returncode}): {' '.join(proc.args)}\n"
                            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
        return Run(seconds, steps, busy_fraction(cpu0, cpu1), busy_fraction(idle0, cpu0),
                   started)

    def rounds(self, plan: list[tuple[str, Measure]], runs: int | None = None,
               ) -> dict[str, list[Run]]:
        """``runs`` rounds, each running every case of ``plan`` once, in order: interleaved,
        so that this shared machine's slow and fast minutes (other tenants' disk and CPU
        moved ``local_s`` by 28% from one hour to the next) fall on every case alike, not
        on whichever ran then. Each run has a fresh scratch directory (removed after, with
        anything mounted below it). A measure may time more than one case per run
        (docker_pull_run also times docker_local): it returns them by name."""
        out: dict[str, list[Run]] = {}
        for i in range(self.args.runs if runs is None else runs):
            for name, measure in plan:
                run_dir = self.work / f"{name}-{i}"
                shutil.rmtree(run_dir, ignore_errors=True)
                run_dir.mkdir()
                result = measure(run_dir, f"{name} run {i + 1}")
                for case, run in (result.items() if isinstance(result, dict)
                                  else [(name, result)]):
                    out.setdefault(case, []).append(run)
                    log.info("  %s run %d: %.2f s, CPU %.0f%% busy", case, i + 1,
                             run.seconds, 100 * run.cpu_busy)
                for mount in mounts_below(run_dir):  # a run must not leave mounts; be sure
                    log.warning("unmounting %s left by the %s run", mount, name)
                    unmount(mount)
                shutil.rmtree(run_dir)
        for case, rows in out.items():
            self.details[case] = [r.to_json() for r in rows]
        return out

    # -- the cases -----------------------------------------------------------------------------

    def full_pull_run(self, make_args: Callable[[Path], list[str]]) -> Callable[[Path, str], Run]:
        """``full_pull.py`` with ``make_args(run_dir)`` (``pull ...`` or ``run ...``), its
        breakdown kept as the run's report."""
        def measure(run_dir: Path, what: str) -> Run:
            report = run_dir / "report.json"
            run = self.cold(what, [[sys.executable, str(FULL_PULL), *make_args(run_dir),
                                    "--report", str(report), "--", *WORKLOAD]])
            run.extra["report"] = json.loads(report.read_text())
            return run
        return measure

    def docker_pull_run(self, run_dir: Path, what: str) -> dict[str, Run]:
        """A fresh engine pulls the image from the registry and runs it; then runs it again
        from its own storage, cold (docker_local)."""
        assert self.registry is not None
        engine = Dockerd.start(run_dir / "docker")
        try:
            name = f"{self.registry.address}/{self.image.registry_ref}"
            docker = ["docker", "-H", engine.host]
            run = [*docker, "run", "--rm", "--network", "none", name, *WORKLOAD]
            pulled = self.cold(what, [[*docker, "pull", "--quiet", name], run])
            again = self.cold(f"{what} (image local)", [run])
        finally:
            engine.stop()
        return {"docker_pull_run": pulled, "docker_local": again}

    def lazy_start(self, *, prefetch: bool, record: str, warm: bool = False,
                   passthrough: bool = True, metadata: bool = True,
                   ) -> Callable[[Path, str], Run]:
        """``docker run --runtime bootseer`` of the stub on a fresh node agent (its own
        cache); the agent's record of the start is kept with the run."""
        def measure(run_dir: Path, what: str) -> Run:
            env = self.env | {"BOOTSEER_STORE": self.url,
                              "BOOTSEER_CACHE_DIR": str(run_dir / "cache"),
                              "BOOTSEER_IMAGE_PREFETCH": "true" if prefetch else "false",
                              "BOOTSEER_IMAGE_PASSTHROUGH": str(passthrough).lower(),
                              "BOOTSEER_IMAGE_KERNEL_METADATA": str(metadata).lower(),
                              "BOOTSEER_IMAGE_RECORD_IMAGES": self.image.name}
            agent = start_agent(self.agent_sock, env, timeout=120, spares_warm=True)
            try:
                warmed = None
                if warm:  # through the agent, as on a node: untimed
                    proc = subprocess.run(
                        self.bootseer("warm", "--json", "--image", self.image.name,
                                      "--workload", self.args.workload),
                        env=env | {"BOOTSEER_AGENT_SOCKET": str(self.agent_sock)},
                        check=True, capture_output=True, text=True, timeout=self.args.timeout)
                    warmed = json.loads(proc.stdout)["image"]
                assert self.dockerd is not None
                run = self.cold(what, [[
                    "docker", "-H", self.dockerd.host, "run", "--rm", "--runtime", "bootseer",
                    "--network", "none", "-e", f"BOOTSEER_WORKLOAD={self.args.workload}",
                    "-e", f"BOOTSEER_RECORD={record}", self.image.stub, *WORKLOAD]])
                with AgentClient(self.agent_sock) as client:
                    start = self.finished_start(client)
                    left = client.mounts()
                if left:
                    raise RunFailed(f"{what}: the agent still serves {left}")
            finally:
                agent.send_signal(signal.SIGTERM)
                agent.wait(60)
            run.extra["start"] = self.start_detail(start, run.started)
            if warmed is not None:
                run.extra["warm"] = {k: warmed.get(k) for k in (
                    "seconds", "fetched_bytes", "fetch_requests", "whole_files",
                    "metadata_image", "metadata_image_s")}
            return run
        return measure

    def finished_start(self, client: AgentClient, timeout: float = 60) -> StartRecord:
        """The agent's one start, once the engine's poststop hook has released it."""
        deadline = time.monotonic() + timeout
        while True:
            starts = client.starts()
            if len(starts) == 1 and "exited" in starts[0].phases:
                return starts[0]
            if time.monotonic() > deadline:
                raise RunFailed(f"the agent's start did not complete: {starts}")
            time.sleep(0.1)

    @staticmethod
    def start_detail(start: StartRecord, started: float) -> dict[str, Any]:
        """The mount's report and the start's phases, as seconds since ``docker run``."""
        return {"runtime": start.runtime,
                "phases_s": {k: round(v - started, 3) for k, v in start.phases.items()},
                "image": start.detail.get("image") or {},
                "metadata_image": bool(start.detail.get("metadata_image"))}

    # -- setup ---------------------------------------------------------------------------------

    def setup(self) -> dict:
        started = time.perf_counter()
        self.layout = build_image(**self.image.build)
        self.info = read_build_info(self.layout)
        log.info("image %s: %.0f MB of files, %.0f MB of gzip layers (%.0f s)", self.layout,
                 self.info.rootfs_bytes / MB, self.info.compressed_bytes / MB,
                 time.perf_counter() - started)
        self.rootfs = self.work / "local" / "rootfs"
        if "local" in self.cases:
            t = time.perf_counter()
            unpack_image(self.layout, self.rootfs)
            log.info("unpacked locally for the floor in %.1f s", time.perf_counter() - t)
        t = time.perf_counter()
        self.hdfs.start()
        self.env.update({k: v for k, v in self.cluster.env().items()
                         if not k.startswith("BOOTSEER_")})
        log.info("HDFS up in %.1f s at %s", time.perf_counter() - t, self.url)
        setup: dict[str, Any] = {}
        if set(LAZY_CASES) & set(self.cases):
            t = time.perf_counter()
            subprocess.run(self.bootseer("image", "convert", str(self.layout), "--name",
                                         self.image.name),
                           env=self.env, check=True, stdout=subprocess.DEVNULL)
            setup["convert_s"] = round(time.perf_counter() - t, 2)
            log.info("converted into the store in %.1f s (uncapped)", setup["convert_s"])
            setup["lazy_image"] = self.lazy_image_sizes()
            self.dockerd = Dockerd.start(self.work / "docker-lazy",
                                         config=deployed_daemon_config(RUNTIME),
                                         env={"BOOTSEER_AGENT_SOCKET": str(self.agent_sock)})
            subprocess.run(self.bootseer("image", "docker-stub", self.image.name, "--tag",
                                         self.image.stub,
                                         "--docker-host", self.dockerd.host),
                           env=self.env | {"BOOTSEER_CACHE_DIR": str(self.work / "stub-cache")},
                           check=True, stdout=subprocess.DEVNULL)
            log.info("stub %s loaded into dockerd (runtime bootseer: %s)", self.image.stub,
                     RUNTIME)
        if "full_pull" in self.cases:
            t = time.perf_counter()
            subprocess.run([sys.executable, str(FULL_PULL), "push", "--store", self.url,
                            "--layout", str(self.layout), "--name", self.image.name],
                           env=self.env, check=True, stdout=subprocess.DEVNULL)
            setup["push_s"] = round(time.perf_counter() - t, 2)
            log.info("pushed the layer blobs in %.1f s (uncapped)", setup["push_s"])
        if "docker_pull_run" in self.cases:
            t = time.perf_counter()
            self.registry = Registry.start(self.work / "registry")
            self.registry.push(self.layout, self.image.registry_ref)
            setup["registry_push_s"] = round(time.perf_counter() - t, 2)
            log.info("pushed to docker-registry at %s in %.1f s (uncapped)",
                     self.registry.address, setup["registry_push_s"])
            self.hdfs.cap_port(self.registry.port, self.registry_tc)
        self.hdfs.cap_datanodes()
        log.info("link capped at %s (DataNode%s)", self.cap,
                 " and registry" if self.registry else "")
        return setup

    def lazy_image_sizes(self) -> dict[str, int]:
        """The converted image as the store holds it: files, blocks and their compressed
        bytes (the denominator of the hot fraction), read from its manifest."""
        code = ("import json, sys\n"
                "from bootseer.store import BlobStore, open_store\n"
                "from bootseer.prefetch.lazyimage import resolve_image\n"
                "from bootseer.prefetch.blockformat import Manifest\n"
                "blobs = BlobStore(open_store(sys.argv[1]))\n"
                "data = blobs.get(resolve_image(blobs, sys.argv[2]), 1 << 30)\n"
                "m = Manifest.decode(data)\n"
                "print(json.dumps({'entries': len(m.entries), 'blocks': len(m.blocks),\n"
                "                  'stored_bytes': sum(b.length for b in m.blocks),\n"
                "                  'content_bytes': m.content_bytes,\n"
                "                  'manifest_bytes': len(data)}))\n")
        out = subprocess.run([sys.executable, "-c", code, self.url, self.image.name],
                             env=self.env, check=True, capture_output=True, text=True).stdout
        sizes = json.loads(out)
        log.info("lazy image: %d entries, %d blocks, %.0f MB stored, manifest %.1f MB",
                 sizes["entries"], sizes["blocks"], sizes["stored_bytes"] / MB,
                 sizes["manifest_bytes"] / MB)
        return sizes

    def stop(self) -> None:
        if self.dockerd is not None:
            self.dockerd.stop()
        if self.registry is not None:
            self.registry.stop()
        for mount in mounts_below(self.work):
            log.warning("unmounting %s", mount)
            unmount(mount)
        self.hdfs.stop()  # and the registry's cap

    # -- the benchmark -------------------------------------------------------------------------

    def run(self) -> dict:
        self.cases = select_cases(self.args.cases, CASES)
        setup = self.setup()
        cases: dict[str, tuple[str, Measure]] = {
            "local": ("image already unpacked on local disk", self.full_pull_run(
                lambda d: ["run", "--rootfs", str(self.rootfs)])),
            "full_pull": ("fetch every layer from HDFS, unpack, run in runc",
                          self.full_pull_run(lambda d: [
                              "pull", "--store", self.url, "--name", self.image.name,
                              "--dest", str(d / "rootfs")])),
            "docker_pull_run": ("fresh dockerd, docker pull from the registry, docker run",
                                self.docker_pull_run),
            "lazy": ("docker run --runtime bootseer, no prefetch",
                     self.lazy_start(prefetch=False, record="never")),
            "lazy_prefetch": ("docker run --runtime bootseer, prefetch of the hot list",
                              self.lazy_start(prefetch=True, record="never")),
            "lazy_warmed": ("bootseer warm through the agent first (untimed), then the start: "
                            "what is left when every hot block is already local (names "
                            "from the image's metadata image, data from whole files)",
                            self.lazy_start(prefetch=True, record="never", warm=True)),
            "lazy_warmed_fuse": ("the same with image.kernel_metadata off (names through "
                                 "the mount's server, whole files by FUSE passthrough)",
                                 self.lazy_start(prefetch=True, record="never", warm=True,
                                                 metadata=False)),
            "lazy_warmed_served": ("the same with image.passthrough off (every read served "
                                   "by the mount's server)",
                                   self.lazy_start(prefetch=True, record="never", warm=True,
                                                   passthrough=False)),
        }
        measured: dict[str, list[Run]] = {}
        if {"lazy_prefetch", *WARMED_CASES} & set(self.cases):
            log.info("record: one start that records the hot list and writes the hot pack")
            measured |= self.rounds([("record", self.lazy_start(prefetch=False,
                                                                record="always"))], runs=1)
        plan = [(name, cases[name][1]) for name in CASES if name in self.cases]
        for name in self.cases:
            log.info("%s: %s", name, cases[name][0])
        measured |= self.rounds(plan)
        if self.registry is not None:  # proof that the pulls went through the cap
            sent = re.search(r"Sent (\d+) bytes", describe(self.registry_tc))
            setup["registry_class_sent_bytes"] = int(sent.group(1)) if sent else None
        return self.result(setup, measured)

    def result(self, setup: dict, measured: dict[str, list[Run]]) -> dict:
        rate = self.cap.rate_bytes_per_s
        times = {k: [r.seconds for r in v] for k, v in measured.items()}
        med = {k: statistics.median(v) for k, v in times.items()}

        def image_stat(case: str, *keys: str) -> list:
            """A value of the mount's report, per run (``prefetch``, ``hot_bytes``)."""
            values = []
            for run in measured.get(case, []):
                value: Any = run.extra.get("start", {}).get("image", {})
                for key in keys:
                    value = (value or {}).get(key)
                values.append(value)
            return values

        def breakdown(case: str) -> dict[str, float | None] | None:
            """Where a lazy start's seconds went, medians: the engine until the runtime
            shim asked the agent, the lazy mount, the workload, the release and removal."""
            runs = measured.get(case)
            if not runs:
                return None
            marks = [{"start": 0.0, **r.extra["start"]["phases_s"], "end": r.seconds}
                     for r in runs]
            spans = {"engine_to_shim": ("start", "created"), "mount": ("created", "image_ready"),
                     "workload": ("image_ready", "exited"), "release": ("exited", "end")}
            return {name: median_of([round(m[b] - m[a], 3) if a in m and b in m else None
                                     for m in marks]) for name, (a, b) in spans.items()}

        def per_start(case: str, group: str) -> dict[str, float | None] | None:
            """Medians over a case's runs of each figure in the mount report's ``group``
            (``manifest``, ``fuse_requests``, ``pages_pushed``)."""
            rows = [r for r in image_stat(case, group) if r]
            if not rows:
                return None
            keys = sorted({k for r in rows for k in r})
            return {k: median_of([r.get(k) for r in rows]) for k in keys}

        def mount_ready(case: str) -> list[float]:
            return [r.extra["start"]["phases_s"]["image_ready"]
                    - r.extra["start"]["phases_s"]["created"]
                    for r in measured.get(case, [])
                    if {"created", "image_ready"} <= set(r.extra["start"]["phases_s"])]

        hot_bytes = median_of(image_stat("lazy_prefetch", "prefetch", "hot_bytes"))
        floor = (med["local"] + hot_bytes / rate
                 if "local" in med and hot_bytes is not None else None)
        docker_floor = (med["docker_local"] + hot_bytes / rate
                        if "docker_local" in med and hot_bytes is not None else None)

        def ratio(a: float | None, b: float | None) -> float | None:
            return round(a / b, 3) if a is not None and b else None

        stored = setup.get("lazy_image", {}).get("stored_bytes")
        ready = mount_ready("lazy_prefetch")
        cuda = self.args.image == "cuda"
        pre, docker = med.get("lazy_prefetch"), med.get("docker_pull_run")
        full, lazy = med.get("full_pull"), med.get("lazy")
        demand = image_stat("lazy_prefetch", "bytes_fetched")
        prefetched = image_stat("lazy_prefetch", "prefetch", "bytes_fetched")
        total = [d + (p or 0) if d is not None else None for d, p in zip(demand, prefetched)]
        record = measured.get("record")
        warmed_cpu = median_of(image_stat("lazy_warmed", "server_cpu_s"))
        return {
            **self.recording.header(runs=self.args.runs, caps=self.hdfs.caps(
                applies_to="egress of the HDFS DataNode's data transfer port and of the "
                           "registry's port: tc htb on lo, one class each",
                latency=LATENCY)),
            "path": PATH,
            "path_note": "lazy cases: docker run --runtime bootseer of the stub image; "
                         "bootseer-runtime asks the node agent for the root, served by its "
                         "FUSE mount (bootseer.fuse) from the HDFS store",
            "image": {"name": self.info.name, "manifest_digest": self.info.manifest_digest,
                      "layout": str(self.layout), "build_seconds": self.info.build_seconds,
                      "layers": [{"bytes": x["size"], "tar_bytes": x["tar_size"],
                                  "content_bytes": x["content_bytes"],
                                  "created_by": x["created_by"]} for x in self.info.layers]},
            "workload": WORKLOAD,
            "ready": "the workload's process exits (stdout checked)",
            "store": {"url": self.url, "datanodes": 1, "replication": 1,
                      "hdfs_block_size": self.args.block_size * MIB,
                      "registry": "docker-registry (distribution 2.8), filesystem storage, "
                                  "127.0.0.1", **setup},
            "link": {"cap_MBps": self.args.link_mbps, "cap_bytes_per_s": rate,
                     "applies_to": "egress of the HDFS DataNode's data transfer port and of "
                                   "the registry's port: tc htb on lo, one class each",
                     "latency": LATENCY},
            "cold": "per run: fresh agent cache / unpack dir / Docker data root, page cache "
                    "dropped",
            "cases": self.cases,
            **{f"{k}_s": figure(v) for k, v in times.items() if k != "record"},
            "record_s": round(record[0].seconds, 3) if record else None,
            "cpu_busy_fraction": {k: round(statistics.median(r.cpu_busy for r in v), 3)
                                  for k, v in measured.items()},
            "cpu_busy_before_fraction": {
                k: round(statistics.median(r.cpu_busy_before for r in v), 3)
                for k, v in measured.items()},
            "cpu_busy_note": f"whole machine ({os.cpu_count()} CPUs), median per case: during "
                             "the run, and in the second before it (others' load)",
            "image_bytes": self.info.rootfs_bytes,
            "compressed_layer_bytes": self.info.compressed_bytes,
            "hot_bytes": hot_bytes,
            "hot_bytes_note": "compressed bytes of the hot list (what the prefetch reads)",
            "hot_fraction": round(hot_bytes / stored, 4) if hot_bytes and stored else None,
            "hot_fraction_note": "hot_bytes / the lazy image's compressed bytes in the store",
            "mount_ready_s": figure(ready) if ready else None,
            "mount_ready_note": "lazy_prefetch runs: from the runtime shim's mount request to "
                                "the agent until the server serves (manifest fetched and "
                                "decoded; agent started before the run, its spare servers "
                                "warm)",
            "manifest": per_start("lazy_prefetch", "manifest"),
            "manifest_note": "medians over lazy_prefetch runs: compressed bytes, entries, "
                             "fetch and decode seconds in the mount server",
            "requests_per_start": {case: per_start(case, "fuse_requests")
                                   for case in LAZY_CASES if case in measured},
            "requests_per_start_note": "requests the mount's FUSE server answered per start, "
                                       "by kind, medians (page-cache hits never reach it; "
                                       "lookup_negative: names not in the image)",
            "server_cpu_s": {case: median_of(image_stat(case, "server_cpu_s"))
                             for case in LAZY_CASES if case in measured},
            "server_cpu_s_note": "CPU seconds (user + system) of the mount's server per "
                                 "start, from taking the mount until its report at the end "
                                 "(manifest, prefetch and FUSE answers; a spare's own start "
                                 "is not counted), medians",
            "fuse_cpu_s": {case: per_start(case, "fuse_cpu_s")
                           for case in LAZY_CASES if case in measured},
            "fuse_cpu_s_note": "of server_cpu_s, the CPU seconds answering each kind of FUSE "
                               "request (the handler's thread time, its reply included), "
                               "medians",
            "pages_pushed": {case: per_start(case, "pages_pushed")
                             for case in LAZY_CASES if case in measured},
            "pages_pushed_note": "hot blocks the mount's server put in the page cache once "
                                 "their file was looked up (FUSE_NOTIFY_STORE), per start, "
                                 "medians: reads of them never reach the server; cpu_s: "
                                 "the server's CPU in those writes (part of server_cpu_s)",
            "passthrough": {case: per_start(case, "passthrough")
                            for case in LAZY_CASES if case in measured},
            "passthrough_note": "per start, medians: backing files the server registered "
                                "(files opened whose reads the kernel did itself: "
                                "requests_per_start's open_passthrough), nodes it served "
                                "itself, registrations refused",
            "read_ahead": {case: per_start(case, "read_ahead")
                           for case in LAZY_CASES if case in measured},
            "read_ahead_note": "per start, medians: files passed through whose hot blocks "
                               "the kernel was asked to read ahead from the whole file "
                               "once the file was looked up (POSIX_FADV_WILLNEED: what "
                               "pages_pushed is for a served file), those blocks' bytes, "
                               "and the server's CPU in asking (cpu_s, part of "
                               "server_cpu_s: mostly the kernel allocating the pages, "
                               "which a local start does in its own page faults)",
            "bytes_fetched_lazy": median_of(image_stat("lazy", "bytes_fetched")),
            "bytes_fetched_lazy_prefetch": median_of(total),
            "bytes_fetched_lazy_prefetch_note": "demand fetches + the prefetcher's fetches",
            "demand_bytes_lazy_prefetch": median_of(demand),
            "prefetched_bytes": median_of(prefetched),
            "prefetch_finished_s": median_of(image_stat("lazy_prefetch", "prefetch", "seconds")),
            **{f"{key}_{figure_name}": median_of([
                round(r.extra["warm"][field] / (MB if field == "fetched_bytes" else 1), 3)
                for r in measured.get(case, []) if r.extra["warm"].get(field) is not None])
               for key, case in (("warm", "lazy_warmed"), ("warm_served", "lazy_warmed_served"))
               for figure_name, field in (("s", "seconds"), ("MB", "fetched_bytes"),
                                          ("whole_files", "whole_files"),
                                          ("metadata_image_s", "metadata_image_s"))},
            "metadata_image": {case: sum(r.extra["start"]["metadata_image"]
                                         for r in measured[case]) / len(measured[case])
                               for case in LAZY_CASES if measured.get(case)},
            "metadata_image_note": "fraction of each case's starts whose root named the "
                                   "image's files through its metadata image (EROFS) and "
                                   "read them from whole files or by key from the server",
            "warm_note": "the untimed bootseer warm through the agent before each lazy_warmed "
                         "(warm_*: the hot list's blocks, then the rest of every file it "
                         "touches, kept whole) and lazy_warmed_served start (warm_served_*: "
                         "the hot blocks only), with no start competing (the agent's own "
                         "report): seconds, MB fetched, files kept whole, and seconds of it "
                         "building the image's metadata image (once per node and image)",
            "breakdown_s": {case: breakdown(case) for case in ("lazy", "record", "lazy_prefetch",
                                                                *WARMED_CASES)},
            "breakdown_note": "medians, seconds, from the agent's start record: spawning docker "
                              "run until bootseer-runtime asked the agent (created), the lazy "
                              "mount (until image_ready), the workload (until the poststop "
                              "release), the rest (docker removing the container)",
            "docker_pull_run_steps_s": {
                step: median_of([r.steps[i] for r in measured.get("docker_pull_run", [])])
                for i, step in enumerate(("pull", "run"))},
            "warmed_vs_local": ratio(med.get("lazy_warmed"), med.get("local")),
            "warmed_served_vs_local": ratio(med.get("lazy_warmed_served"), med.get("local")),
            "warmed_fuse_vs_local": ratio(med.get("lazy_warmed_fuse"), med.get("local")),
            "warmed_vs_docker_local": ratio(med.get("lazy_warmed"), med.get("docker_local")),
            "warmed_vs_docker_local_note": "the warmed start (docker run --runtime bootseer) "
                                           "over docker run of the image from Docker's own "
                                           "storage: the same engine path on both sides",
            "warmed_vs_warmed_served": ratio(med.get("lazy_warmed"),
                                             med.get("lazy_warmed_served")),
            "floor_s": round(floor, 3) if floor is not None else None,
            "floor": "local_s + hot_bytes / link rate",
            "docker_floor_s": round(docker_floor, 3) if docker_floor is not None else None,
            "docker_floor": "docker_local_s + hot_bytes / link rate: the floor with Docker's "
                            "own start (image in its storage) in place of plain runc",
            "prefetch_vs_docker": ratio(pre, docker),
            "prefetch_vs_full": ratio(pre, full),
            "prefetch_vs_floor": ratio(pre, floor),
            "prefetch_vs_docker_floor": ratio(pre, docker_floor),
            "prefetch_vs_lazy": ratio(pre, lazy),
            "lazy_vs_docker": ratio(lazy, docker),
            "docker_local_vs_local": ratio(med.get("docker_local"), med.get("local")),
            "goals": {
                "prefetch_le_1.3_floor": (pre <= 1.3 * floor) if pre and floor else None,
                "prefetch_le_1.2_floor": (pre <= 1.2 * floor) if pre and floor else None,
                "warmed_le_1.1_local": (med["lazy_warmed"] <= 1.1 * med["local"])
                if "lazy_warmed" in med and "local" in med else None,
                "warmed_server_cpu_le_0.3_s": (warmed_cpu <= 0.3)
                if warmed_cpu is not None else None,
                **({"prefetch_le_0.15_full": (pre <= 0.15 * full) if pre and full else None,
                    "mount_ready_le_0.5_s": (statistics.median(ready) <= 0.5) if ready
                    else None} if cuda else
                   {"prefetch_le_0.25_docker": (pre <= 0.25 * docker) if pre and docker
                    else None}),
            },
            "details": self.details,
        }


def table(result: dict) -> str:
    rows = [("case", "median s", "runs s", "CPU busy")]
    busy = result["cpu_busy_fraction"]
    for case in (*CASES, "docker_local", "record"):
        fig = result.get(f"{case}_s")
        cpu = f"{busy[case]:.2f}" if case in busy else "-"
        if isinstance(fig, dict):
            rows.append((case, f"{fig['median']:.2f}", " ".join(f"{r:.2f}" for r in fig["runs"]),
                         cpu))
        elif fig is not None:
            rows.append((case, f"{fig:.2f}", "(once)", cpu))
    width = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, width)) for r in rows]

    def mb(v: float | None) -> str:
        return "-" if v is None else f"{v / MB:.1f} MB"

    lines += [f"path: {result['path']}",
              f"image {mb(result['image_bytes'])} of files, "
              f"{mb(result['compressed_layer_bytes'])} of gzip layers; link "
              f"{result['link']['cap_MBps']:g} MB/s ({result['link']['latency']})",
              f"hot {mb(result['hot_bytes'])}; fetched lazy {mb(result['bytes_fetched_lazy'])}, "
              f"lazy+prefetch {mb(result['bytes_fetched_lazy_prefetch'])}; "
              f"floor {result['floor_s']} s, with docker's own start {result['docker_floor_s']} s",
              f"lazy_prefetch breakdown: {result['breakdown_s']['lazy_prefetch']}",
              f"mount ready {result['mount_ready_s']}; manifest {result['manifest']}; "
              f"FUSE requests {result['requests_per_start'].get('lazy_prefetch')}",
              f"prefetch/docker {result['prefetch_vs_docker']}, prefetch/full "
              f"{result['prefetch_vs_full']}, prefetch/floor {result['prefetch_vs_floor']}; "
              f"goals {result['goals']}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", choices=sorted(IMAGES), default="cpu",
                        help="cpu: torch 2.13.0 CPU (~1.1 GB of files); cuda: torch 2.14.1 "
                             "CUDA build (~6 GB, a training image's size)")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: bench-results/image.json (image-cuda.json for cuda)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--link-mbps", type=float, default=100.0,
                        help="egress cap of the DataNode and of the registry, MB/s (decimal)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (store, unpacked image) for a look")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated subset of {','.join(CASES)} (lazy_prefetch and "
                             "lazy_warmed include the recording start; docker_pull_run "
                             "includes docker_local)")
    parser.add_argument("--workload", default="bench-image",
                        help="hot-list workload name for the record and prefetch runs")
    parser.add_argument("--base-port", type=int, default=19500)
    parser.add_argument("--block-size", type=int, default=64, help="HDFS block size, MiB")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per command")
    args = parser.parse_args()
    args.out = args.out or Path("bench-results") / IMAGES[args.image].out
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work = Path(tempfile.mkdtemp(prefix="bench-image-", dir="/var/tmp"))
    bench = Bench(args, work)
    try:
        result = bench.run()
    finally:
        bench.stop()
        if args.keep:
            log.info("kept %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2))
    print(table(result))


if __name__ == "__main__":
    main()

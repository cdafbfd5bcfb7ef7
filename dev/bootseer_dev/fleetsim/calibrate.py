"""The lab's cases as restart models, calibrated from their N = 1 runs and checked at N > 1.

The lab (``bench-restart``'s ``lab`` section) times one restart per case and node count:
every node starts at t = 0 and stamps a **mark** when each step ends (``exited``: its
container is gone, after ``ready``). A case here is the list of its :class:`Step` s, in
the order a node does them, each naming the bytes it reads (``per_node_bytes``), where
from and how (one stream, or striped over every uplink).

**Calibration** (:func:`own_seconds`, :func:`cores`): from the N = 1 runs (each step's
duration the median over the repeated runs, :func:`calibration_marks`), a step's own
seconds are its measured duration (from the previous mark) less what its bytes take alone
(:meth:`Fleet.alone_s`: over its NIC and the uplinks they are placed on) beyond the part
of its work done beside them (``pacing``: its per-byte share, :func:`.costs.pacing`); the
fleet is the lab's, its caps from the lab dict. A mark may end several steps
(``bootseer_cold``'s ``env`` is a pip install and the snapshot's upload): their own
seconds go to the first.
``bootseer``'s steps read what the warm fetches; its warm's own seconds (its work after
its fetches) are its measured time less its fetches' at N = 1.
A step whose bytes the warm fetches does its own work (the same step's in
``bootseer_prestaged``: the same work with every byte local), waits for its bytes if they
are not in yet, and spends whatever its N = 1 run took beyond that once they are in
(``Phase.after``): so it reproduces N = 1, and does not count its wait as CPU work at
N > 1. The cores a node's task keeps busy are the run's core-seconds beyond the idle load,
``(cpu_busy - cpu_busy_idle) x cpus x wall_s``, over the node's own seconds: at N = 1 a
node is alone, so the machine's work is its work. Nothing else is fitted: no constant of
ours enters.

**Validation** (:func:`validate`): each case at each N the lab ran, simulated on the lab's
fleet (its caps, DataNodes and shared cores less that run's idle load), against the lab's
p50 and max of ready, and the busiest DataNode's bytes over their mean against the lab's.

**HDFS** (:mod:`.placement`): the lab's block size and replication are its caps'
``hdfs_block_size`` and ``replication`` (when absent: the fleet lab's defaults, 8 MiB and
1), the fan-out's readers per replica ``readers_per_replica`` (absent: ``bootseer job
fanout``'s default, 4) and its bound the DataNodes (the benchmark passes
``--max-replicas`` = DataNodes); ``checkpoint_groups`` (absent: 1) is how many distinct
parts of the checkpoint the nodes read (node i reads part i % groups).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bootseer.p2p.policy import CONNECT_WAIT
from bootseer_dev.cluster.spec import ClusterSpec
from bootseer_dev.fleet.spec import LabSpec

from .placement import Layout, Placement
from .restart import Fetch, Fleet, Origin, Phase, Warm, simulate

HDFS, REGISTRY, INDEX = "hdfs", "registry", "index"
#: The placement's seed (every validation row draws with it), and the seeds whose spread of
#: DataNode max/mean the validation reports beside it (the lab's is one draw of its own).
SEED, SEEDS = 0, 20


class CalibrationError(ValueError):
    """A case the lab dict cannot calibrate (no complete N = 1 run of it)."""


@dataclass(frozen=True)
class Step:
    """One step of a case's start: ``name`` is the lab mark that ends it (``mark=False``:
    it has none and ends inside the next mark's interval)."""

    name: str
    artifact: str | None = None  # the per_node_bytes key it reads (or, upload, writes)
    origin: str = HDFS
    striped: bool = True  # over every uplink of the origin; False: one stream (spread 1)
    upload: bool = False
    scales_with: tuple[str, ...] = ()  # artifacts whose size its own work grows with
    #: Its per-byte work spreads over a node's cores (Bootseer's swarm, restore, image
    #: server, checkpoint reader); False: one core (pip, docker's gunzip, one stream).
    spreads: bool = False
    mark: bool = True
    teardown: bool = False  # after ready (the container's removal): not time to ready


@dataclass(frozen=True)
class Case:
    steps: tuple[Step, ...]
    warm: tuple[str, ...] = ()  # artifacts a warm fetches at t = 0, striped over HDFS
    calibrated_from: str | None = None  # the case whose N = 1 run it borrows (it has none)
    fanout: bool = False  # what it reads from HDFS is replicated for its nodes first
    peers: bool = False  # its nodes share what the lab shares (p2p_shared) as one swarm

    @property
    def marks(self) -> list[str]:
        return [s.name for s in self.steps if s.mark] + (["warm"] if self.warm else [])

    @property
    def ready_marks(self) -> list[str]:
        """The marks whose last is the node's time to ready."""
        return [m for m in self.marks if m not in {s.name for s in self.steps if s.teardown}]


#: The container's removal once the job has exited: its CPU contends with other nodes'.
EXITED = Step("exited", teardown=True)

CASES: dict[str, Case] = {
    # docker pull (registry) -> pip install (index) -> container -> import -> checkpoint
    # read as one sequential HDFS stream.
    "baseline": Case((
        Step("image", "image_layers", REGISTRY, striped=False, scales_with=("image_layers",)),
        Step("env", "wheels", INDEX, striped=False, scales_with=("wheels",)),
        Step("started"), Step("imported"),
        Step("checkpoint", "checkpoint", striped=False, scales_with=("checkpoint",)),
        Step("ready"), EXITED)),
    # pip install, then the snapshot is published (an upload, modelled as one: node ->
    # DataNodes) -> lazy mount and the container's start, reading the lazy image on demand
    # (``started`` is the job's first line; ``imported`` reads the environment, not the
    # image) -> imports -> striped checkpoint.
    "bootseer_cold": Case((
        Step("pip", "wheels", INDEX, striped=False, scales_with=("wheels",), mark=False),
        Step("env", "env_snapshot", upload=True),
        Step("started", "image_lazy", scales_with=("image_lazy",), spreads=True),
        Step("imported"),
        Step("checkpoint", "checkpoint", scales_with=("checkpoint",), spreads=True),
        Step("ready"), EXITED)),
    # Every byte staged before t = 0: own work only.
    "bootseer_prestaged": Case((
        Step("env", scales_with=("env_snapshot",), spreads=True),
        Step("started", scales_with=("image_hot",), spreads=True), Step("imported"),
        Step("checkpoint", scales_with=("checkpoint",), spreads=True), Step("ready"),
        EXITED)),
    # The same start, its bytes from a warm begun at t = 0 beside it.
    "bootseer": Case((
        Step("env", "env_snapshot", scales_with=("env_snapshot",), spreads=True),
        Step("started", "image_hot", scales_with=("image_hot",), spreads=True),
        Step("imported"),
        Step("checkpoint", "checkpoint", scales_with=("checkpoint",), spreads=True),
        Step("ready"), EXITED),
        warm=("image_hot", "env_snapshot", "checkpoint")),
}
# Bootseer after ``bootseer job fanout``: every object the job reads kept on more DataNodes
# (:mod:`.placement`); the start is Bootseer's, calibrated from its N = 1 run (the lab runs
# this case at its largest N only).
CASES["bootseer_fanout"] = replace(CASES["bootseer"], calibrated_from="bootseer", fanout=True)
# The job's warm first (``bootseer warm --job J --nodes N``: hot pack, snapshot, checkpoint
# in turn, what ``p2p_shared`` names from the swarm), then the start with every byte local.
# The swarm's fixed costs (its session, the rendezvous, the connect wait) are in the
# staging's own seconds, before the hot pack.
CASES["bootseer_p2p"] = Case((
    Step("hot", "image_hot", mark=False,
         scales_with=("image_hot", "env_snapshot", "checkpoint"), spreads=True),
    Step("snapshot", "env_snapshot", mark=False), Step("staged", "checkpoint"),
    Step("env", scales_with=("env_snapshot",), spreads=True),
    Step("started", scales_with=("image_hot",), spreads=True), Step("imported"),
    Step("checkpoint", scales_with=("checkpoint",), spreads=True), Step("ready"), EXITED),
    peers=True)
#: What bench-restart's p2p case shares between its nodes when its lab dict does not say
#: (``p2p_shared``): the hot pack and the snapshot's shards; checkpoints from HDFS.
P2P_SHARED = ("image_hot", "env_snapshot")
#: Objects of each shared artifact that a lab node's job warm fetches through the swarm one
#: after another (``Fetch.rounds``), from the warm's code: the image's manifest, hot list
#: and hot pack; the snapshot's manifest, then its 4 shards 2 at a time (the nodes' 2
#: CPUs: ``snapshot.concurrency``); the checkpoint's files at once.
LAB_SWARM_ROUNDS = {"image_hot": 3, "env_snapshot": 3, "checkpoint": 1}


def lab_placement(lab: dict, seed: int = SEED) -> Placement:
    """The lab's HDFS: its block size, replication and fan-out (the module's defaults)."""
    caps = lab["caps"]
    return Placement(caps.get("hdfs_block_size") or LabSpec.block_size,
                     caps.get("replication") or ClusterSpec.replication,
                     caps.get("readers_per_replica") or Placement.readers_per_replica,
                     max_replicas=caps["datanodes"], seed=seed)


def parts(lab: dict) -> dict[str, int]:
    """The distinct parts of each artifact the lab's nodes read (the checkpoint's groups)."""
    return {"checkpoint": lab.get("checkpoint_groups") or 1}


def shared(lab: dict) -> frozenset[str]:
    """The artifacts the lab's p2p case shares between its nodes (``p2p_shared``;
    absent: :data:`P2P_SHARED`)."""
    return frozenset(lab.get("p2p_shared") or P2P_SHARED)


def node_budget(lab: dict) -> float | None:
    """The cores each lab node had to itself (``caps.node_cpu_quota_cores``, its cgroup's
    quota: ``bench-restart --node-cpu``), or None: every node shared the machine's."""
    return lab["caps"].get("node_cpu_quota_cores")


def lab_fleet(lab: dict, nodes: int, cpu_idle: float = 0.0, seed: int = SEED) -> Fleet:
    """The lab's fleet of ``nodes``: its caps, DataNodes (and HDFS placement), its
    cores shared by all (of which ``cpu_idle`` was busy before the run: the idle load) or,
    under a node budget, each node's own, its nodes' upload cap to peers
    (``p2p_upload_Bps``; absent: none), and a swarm fetch's wait for its members: the
    agent's CONNECT_WAIT, which the lab's fetches waited under a CPU budget (its agents'
    debug logs at 0.1 core: 8 of a 4-node job warm's 10 fetches settled at 0.50-0.59 s, its
    2 checkpoint files at 0.40 s, once both members were connected)."""
    caps, budget = lab["caps"], node_budget(lab)
    return Fleet(nodes, caps["node_Bps"],
                 (Origin(HDFS, caps["datanodes"], caps["datanode_Bps"],
                         lab_placement(lab, seed)),
                  Origin(REGISTRY, 1, caps["registry_Bps"]),
                  Origin(INDEX, 1, caps["index_Bps"])),
                 cpus=None if budget else caps["cpus"], cpu_idle=0.0 if budget else cpu_idle,
                 node_cpus=budget, peer_upload=caps.get("p2p_upload_Bps"),
                 swarm_settle=CONNECT_WAIT)


def idle(run: dict) -> float:
    """The machine's busy share just before the run (``cpu_busy_idle``; 0 if unrecorded)."""
    return run.get("cpu_busy_idle") or 0.0


def runs(lab: dict, case: str) -> dict[int, dict]:
    """The lab's runs of ``case`` by node count (JSON keys are strings)."""
    return {int(n): run for n, run in lab["cases"].get(case, {}).items()}


def lab_case(lab: dict, case: str) -> Case:
    """``case`` as the lab ran it: a step whose mark its N = 1 run does not have (the
    prestaged start's ``env`` since its environment is the agent's mount, not a restore
    on the node) ends inside the next mark's interval."""
    spec = CASES[case]
    first = runs(lab, spec.calibrated_from or case).get(1, {"nodes": []})["nodes"]
    if not first:
        return spec
    seen = first[0]["marks"]
    return replace(spec, steps=tuple(
        replace(s, mark=False) if s.mark and s.name not in seen else s for s in spec.steps))


def complete(run: dict, spec: Case) -> tuple[list[dict[str, float]], list[int]]:
    """The marks of the run's nodes that have all of the case's, and the nodes left out
    (a step failed: a mark is missing or null)."""
    kept, left_out = [], []
    for node in run["nodes"]:
        marks = node["marks"]
        if all(marks.get(m) is not None for m in spec.marks):
            kept.append(marks)
        else:
            left_out.append(node["node"])
    return kept, left_out


#: Own seconds of each step (and of ``warm``): before its bytes are there, and after.
Own = dict[str, tuple[float, float]]
#: Of each step's own seconds before its bytes are in, the share done beside them as they
#: arrive (``Phase.paced``): its per-byte work. A step not named does all of it first.
Pacing = dict[str, float]


def repeats(point: dict) -> list[dict]:
    """The node records of an N = 1 point's repeated runs (``runs[i].nodes``; a lab dict
    from before they were kept: the median run's ``nodes``)."""
    kept = [r["nodes"][0] for r in point.get("runs", []) if r.get("nodes")]
    return kept or point["nodes"][:1]


def calibration_marks(lab: dict, case: str) -> dict[str, float]:
    """The marks of ``case``'s N = 1 node as its repeated runs had them typically: each
    step's duration (from the mark before it, in step order) the median over the runs
    that have every mark, summed in order; ``warm`` (a task beside the start) the median
    of its own. The lab's runs of one point differ by 10-20% at a fixed CPU budget (a
    pip install's CPU-seconds vary that much): one run would calibrate that noise in."""
    spec = lab_case(lab, case)
    source = spec.calibrated_from or case
    kept, _ = complete({"nodes": repeats(runs(lab, source).get(1, {"nodes": []}))}, spec)
    if not kept:
        raise CalibrationError(f"{source}: no complete N = 1 run to calibrate from")
    marks: dict[str, float] = {}
    end, at = 0.0, [0.0] * len(kept)
    for step in (s for s in spec.steps if s.mark):
        end += statistics.median(m[step.name] - before for m, before in zip(kept, at, strict=True))
        marks[step.name], at = end, [m[step.name] for m in kept]
    if spec.warm:
        marks["warm"] = statistics.median(m["warm"] for m in kept)
    return marks


def own_seconds(lab: dict, case: str, pacing: Pacing | None = None) -> Own:
    """Each step's own seconds (and ``warm``'s), calibrated from the N = 1 runs: a step
    with a share of ``pacing`` f did (1 - f) of its work before its bytes and f beside
    them, so that its measured time T (less the bytes of the unmarked steps after it in
    its interval, which move after it) is its fixed part and then the longer of the rest
    and its bytes' time X: its work is T if f T >= X, else (T - X) / (1 - f)."""
    spec = lab_case(lab, case)
    marks = calibration_marks(lab, case)
    pacing = pacing or {}
    fleet = lab_fleet(lab, 1)
    nbytes = lab["per_node_bytes"]
    own: Own = {}
    arrival: dict[str, float] = {}
    prestaged: Own = {}
    if spec.warm:
        _, warm = plan(case, dict.fromkeys([s.name for s in spec.steps] + ["warm"], (0.0, 0.0)),
                       nbytes, fleet, parts=parts(lab), shared=shared(lab))
        alone = simulate(fleet, [], warm).marks[0]
        own["warm"] = (max(0.0, marks["warm"] - alone["warm"]), 0.0)
        arrival = {a: alone[f"fetched:{a}"] for a in spec.warm}
        try:
            prestaged = own_seconds(lab, "bootseer_prestaged")
        except CalibrationError:
            prestaged = {}  # then a prefetched step's own work is all its measured time
    start, interval = 0.0, []
    for step in spec.steps:
        interval.append(step)
        if not step.mark:
            continue
        end = marks[step.name]
        moving = [fleet.alone_s(_fetch(s, nbytes, fleet, case, parts(lab), shared(lab)))
                  if s.artifact and s.artifact not in spec.warm else 0.0 for s in interval]
        # the first step's work is paced by its own bytes; the later steps' move after it
        took, paced = end - start - sum(moving[1:]), pacing.get(interval[0].name, 0.0)
        seconds, after = max(0.0, took if paced * took >= moving[0] else
                             (took - moving[0]) / (1 - paced)), 0.0
        if step.artifact in arrival and step.name in prestaged:
            # Its own work is the same step's with every byte local; what it took beyond
            # that and its bytes' arrival, it did once they were in.
            seconds = min(seconds, prestaged[step.name][0])
            after = max(0.0, end - max(start + seconds, arrival[step.artifact]))
        own.update(dict.fromkeys((s.name for s in interval), (0.0, 0.0)))
        own[interval[0].name] = (seconds, after)
        start, interval = end, []
    return own


def core_seconds(lab: dict, case: str) -> float:
    """The CPU work of a node's start, from the N = 1 run: under a node budget, the
    node's own (its cgroup's ``cpu_s``); else the core-seconds the machine used beyond its
    idle load, (cpu_busy - cpu_busy_idle) x cpus x wall (0: unrecorded)."""
    run = runs(lab, CASES[case].calibrated_from or case)[1]
    if node_budget(lab):
        return statistics.median(node.get("cpu_s") or 0.0 for node in repeats(run))
    fleet = lab_fleet(lab, 1, idle(run))
    return max(0.0, (run.get("cpu_busy", 0.0) - fleet.cpu_idle) * fleet.cpus
               * run.get("wall_s", 0.0))


def cores(lab: dict, case: str, own: Own) -> float:
    """The cores each of a node's tasks keeps busy: its :func:`core_seconds` over its own
    seconds (its tasks', summed). At most the cores the N = 1 run had over the tasks that
    run at once (the start and its warm): own seconds were measured with no wait for a
    core, so the node's tasks fit on them. 1 if the run's CPU is unrecorded."""
    spec = CASES[case]
    work, seconds = core_seconds(lab, case), sum(a + b for a, b in own.values())
    if work <= 0 or seconds <= 0:
        return 1.0
    fleet = lab_fleet(lab, 1, idle(runs(lab, spec.calibrated_from or case)[1]))
    cap = fleet.node_cpus or fleet.pool
    return min(cap / (2 if spec.warm else 1), work / seconds)


def _fetch(step: Step, nbytes: dict[str, float], fleet: Fleet, case: str,
           pieces: dict[str, int], shared: frozenset[str],
           rounds: dict[str, int] | None = None) -> Fetch:
    spread = fleet.origin(step.origin).uplinks if step.striped else 1
    return Fetch(step.artifact, nbytes[step.artifact], step.origin, spread, step.upload,
                 pieces.get(step.artifact, 1), CASES[case].fanout and not step.upload,
                 CASES[case].peers and step.artifact in shared,
                 (LAB_SWARM_ROUNDS if rounds is None else rounds).get(step.artifact, 1))


def plan(case: str, own: Own, nbytes: dict[str, float], fleet: Fleet,
         ncores: float = 1.0, parts: dict[str, int] | None = None,
         shared: frozenset[str] = frozenset(),
         pacing: Pacing | None = None,
         rounds: dict[str, int] | None = None) -> tuple[list[Phase], Warm | None]:
    """The case's phases (and warm) on ``fleet``, with these own seconds, bytes and cores:
    striped steps and the warm over every uplink of their origin, ``parts`` the distinct
    parts of an artifact the nodes read (default: one), ``shared`` the artifacts a case
    with ``peers`` fetches from its swarm, ``pacing`` the share of each step's work done
    beside its bytes (default: none), ``rounds`` the objects of each shared artifact
    fetched in turn (default: the lab's, :data:`LAB_SWARM_ROUNDS`)."""
    spec, pieces, pacing = CASES[case], parts or {}, pacing or {}
    phases = [Phase(s.name, own[s.name][0] * (1 - pacing.get(s.name, 0.0)),
                    _fetch(s, nbytes, fleet, case, pieces, shared, rounds)
                    if s.artifact else None,
                    own[s.name][1], ncores, s.teardown,
                    paced=own[s.name][0] * pacing.get(s.name, 0.0)) for s in spec.steps]
    warm = Warm(own["warm"][0], tuple(_fetch(Step("warm", a), nbytes, fleet, case, pieces,
                                             shared, rounds) for a in spec.warm),
                ncores) if spec.warm else None
    return phases, warm


def phases_from_lab(lab: dict, case: str) -> list[Phase]:
    """The case's phases on the lab's fleet, calibrated from its N = 1 run."""
    own = own_seconds(lab, case)
    return plan(case, own, lab["per_node_bytes"], lab_fleet(lab, 1), cores(lab, case, own),
                parts(lab), shared(lab))[0]


def warm_from_lab(lab: dict, case: str) -> Warm | None:
    """The case's warm on the lab's fleet (None: the case has none)."""
    own = own_seconds(lab, case)
    return plan(case, own, lab["per_node_bytes"], lab_fleet(lab, 1), cores(lab, case, own),
                parts(lab), shared(lab))[1]


def validate(lab: dict, sizes: Sequence[dict] = ()) -> dict:
    """Every case and N of the lab, simulated on the lab's fleet, against the lab: p50 and
    max of node ready, their errors |sim - lab| / lab, and ``max_error`` over them all.
    With the same lab at other artifact sizes (``sizes``: their N = 1 runs), each step's
    per-byte work runs beside its bytes (:func:`.costs.pacing`); without, after them."""
    from .costs import pacing as fitted_pacing  # costs builds on this module's cases

    rows, calibration = [], {}
    warnings = [f"{case}: no model of this case: not validated"
                for case in lab["cases"] if case not in CASES]
    for case in (c for c in CASES if c in lab["cases"]):
        try:
            try:
                pacing = fitted_pacing([lab, *sizes], case) if sizes else {}
            except ValueError as error:  # a size lacks the case: its work all before
                warnings.append(f"{case}: no per-byte share ({error}): none paced")
                pacing = {}
            own = own_seconds(lab, case, pacing)
        except CalibrationError as error:
            warnings.append(f"{error}: not validated")
            continue
        ncores, work = cores(lab, case, own), core_seconds(lab, case)
        seconds = sum(a + b for a, b in own.values())
        calibration[case] = {"own_s": own, "pacing": pacing, "cores": ncores,
                             "core_seconds": work}
        if work > ncores * seconds * (1 + 1e-9) and not CASES[case].calibrated_from:
            warnings.append(
                f"{case}: its N = 1 run used {work:.1f} core-seconds, more than its tasks can "
                f"in their {seconds:.1f} own seconds on the run's cores ({ncores:.2f} each): "
                "the rest ran while its bytes moved or was not the node's (an idle load, a "
                f"server's warm-up): cores capped at {ncores:.2f}")
        for nodes, run in sorted(runs(lab, case).items()):
            kept, left_out = complete(run, lab_case(lab, case))
            if left_out:
                warnings.append(f"{case} N={nodes}: nodes {left_out} lack a mark (a step "
                                "failed): left out")
            if not kept:
                continue
            fleet = lab_fleet(lab, nodes, idle(run))
            phases, warm = plan(case, own, lab["per_node_bytes"], fleet, ncores, parts(lab),
                                shared(lab), pacing)
            outcome = simulate(fleet, phases, warm)
            sim = outcome.summary()
            ready = [max(m[k] for k in lab_case(lab, case).ready_marks) for m in kept]
            lab_p50, lab_max = statistics.median(ready), max(ready)
            rows.append({
                "case": case, "nodes": nodes,
                "calibration_run": nodes == 1 and not CASES[case].calibrated_from,
                "nodes_left_out": left_out,
                "lab_p50_s": lab_p50, "sim_p50_s": sim["p50_s"],
                "lab_max_s": lab_max, "sim_max_s": sim["max_s"],
                "error_p50": abs(sim["p50_s"] - lab_p50) / lab_p50,
                "error_max": abs(sim["max_s"] - lab_max) / lab_max,
                "sim_limited_by": sim["limited_by"], "sim_busy": sim["busy"],
                "origin_bytes": {"lab": run.get("origin_bytes"),
                                 "sim": _lab_names(outcome.served)},
                "sim_peer_bytes": outcome.peer_bytes,
                "lab_datanode_max_over_mean": run.get("datanode_max_over_mean"),
                "sim_datanode_max_over_mean": sim["max_over_mean"].get(HDFS),
                "sim_datanode_max_over_mean_seeds": _seeds(lab, nodes, phases, warm),
                "cpu_busy": {"lab": run.get("cpu_busy"), "sim": sim.get("cpu_used")}})
    return {"rows": rows, "calibration": calibration,
            "placement": {"seed": SEED, "seeds": SEEDS} | {
                k: v for k, v in vars(lab_placement(lab)).items() if k != "seed"},
            "max_error": max((max(r["error_p50"], r["error_max"]) for r in rows),
                             default=None),
            "note": "N = 1 of each case is its calibration run: its own seconds and cores "
                    "were fitted to it, so its error is ~0 by construction. N > 1 are "
                    "predictions, and so is every bootseer_fanout row (it borrows bootseer's "
                    "N = 1). DataNode max/mean is a sampled quantity (where blocks and reads "
                    "land): sim_datanode_max_over_mean is the draw of placement.seed, "
                    "sim_datanode_max_over_mean_seeds its spread over placement.seeds seeds; "
                    "the lab's is one draw of its own.",
            "warnings": warnings}


def _seeds(lab: dict, nodes: int, phases: list[Phase], warm: Warm | None) -> dict | None:
    """The DataNode max/mean of ``SEEDS`` placements (where blocks and reads land, with no
    simulation: the bytes alone): min, median and max (None: nothing read from HDFS)."""
    fetches = [p.fetch for p in phases if p.fetch] + list(warm.fetches if warm else ())
    draws = []
    for seed in range(SEEDS):
        served = Layout(lab_fleet(lab, nodes, seed=seed), fetches).served(HDFS)
        if sum(served) > 0:
            draws.append(max(served) / statistics.mean(served))
    if not draws:
        return None
    return {"min": min(draws), "median": statistics.median(draws), "max": max(draws)}


def _lab_names(served: dict[str, list[float]]) -> dict[str, float]:
    """The simulated bytes each origin served (downloads), named as the lab names them."""
    return ({f"datanode-{j}": b for j, b in enumerate(served[HDFS])}
            | {REGISTRY: sum(served[REGISTRY]), INDEX: sum(served[INDEX])})

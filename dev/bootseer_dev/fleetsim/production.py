"""The lab's measured per-node costs, extrapolated to a production fleet of 1 to 4,000 nodes.

The fleet (:class:`Production`) is stated, not measured: every default below is an
**assumption**, reported beside the results. Each node has its own cores (``cores``; no
shared CPU pool). A step's own seconds come from its **measured CPU work**, split into a
fixed and a per-byte part (:mod:`.costs`: the lab's node cgroups at a fixed CPU budget,
at two artifact sizes), priced at production's bytes and cores:

    own seconds = fixed core-seconds (on one core: process, container and interpreter
                  starts are serial)
                + per-byte core-seconds x production bytes / cores it spreads over

where a step spreads over the node's ``cores`` when its per-byte work is Bootseer's swarm,
restore, image server or checkpoint reader (``Step.spreads``), and over one core when it
is pip, docker's gunzip or a one-stream read. The bytes still cross the network as flows
(:mod:`.restart`), after the step's fixed work and beside its per-byte work
(``Phase.paced``: a stream's decompression, checks and writes keep pace with its bytes).

HDFS keeps what the job reads in blocks of ``block_size`` with ``replication`` replicas on
DataNodes drawn at random (:mod:`.placement`); ``bootseer_fanout`` is Bootseer after
``bootseer job fanout`` raised the replication of everything it reads to
``replicas_for(N, readers_per_replica, max_replicas)``.

At 4,000 nodes the simulation stays fast because nodes that read the same bytes from the
same uplinks are one class (:func:`.restart.node_classes`): beyond a few nodes the readers'
replica draws are taken at their average (:mod:`.placement`), so a restart has a class per
checkpoint part (and, for one-stream reads, per replica turn) whatever N.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from .calibrate import CASES, HDFS, INDEX, REGISTRY, SEED, Own, Pacing, lab_case, plan
from .costs import Cost, grows_with, intervals, paced, step_costs
from .placement import Placement
from .restart import Fleet, Origin, simulate

GBIT = 1e9 / 8  # bytes per second

#: The curves extrapolated.
EXTRAPOLATED = ("baseline", "bootseer", "bootseer_prestaged", "bootseer_fanout",
                "bootseer_p2p")

#: The paper's production figures (startup time, seconds), marked on the plot for scale:
#: ~45 s below 10 GPUs (about one 8-GPU node), ~500 s above 3,000 GPUs (375+ nodes), and
#: a tail of ~950 s there.
PAPER = ((1, 45.0, "paper: ~45 s at < 10 GPUs"), (375, 500.0, "paper: ~500 s at > 3,000 GPUs"),
         (375, 950.0, "paper: tail ~950 s"))


@dataclass(frozen=True)
class Production:
    """A production fleet. Every default is an assumption: state yours."""

    nic_gbit_s: float = 25.0  # each node's NIC (the 25 Gb/s)
    cores: float = 32.0  # a GPU node's cores a restart may use (its own: no shared pool)
    datanodes: int = 200  # HDFS DataNodes serving the job
    datanode_gbit_s: float = 10.0  # each DataNode's uplink
    registry_frontends: int = 4  # the image registry's frontends (baseline pulls)
    registry_gbit_s: float = 25.0  # each
    index_mirrors: int = 1  # the package index mirror(s) (baseline pip installs)
    index_gbit_s: float = 10.0  # each
    image_bytes: float = 15e9  # the image, unpacked
    layers_ratio: float = 0.5  # compressed layers a docker pull fetches, per image byte
    hot_fraction: float = 0.08  # of the image: the hot pack a warmed start reads
    env_bytes: float = 5e9  # the Python environment, installed
    wheels_ratio: float = 0.4  # wheels pip downloads, per installed byte
    snapshot_ratio: float = 0.5  # env snapshot shards (compressed), per installed byte
    checkpoint_bytes: float = 100e9  # the whole checkpoint
    nodes_per_replica: int = 8  # a data-parallel replica's nodes each read 1/8 of it
    block_size: float = 256 * 2**20  # HDFS blocks (128-256 MiB are usual)
    replication: int = 3  # HDFS's default dfs.replication
    readers_per_replica: int = 4  # the fan-out's (``bootseer job fanout``'s default)
    max_replicas: int | None = None  # the fan-out's bound; None: every DataNode
    # What bootseer_p2p's nodes share as a swarm (a checkpoint part: among the nodes that
    # read it, one per data-parallel replica): everything its warm fetches, the issue's
    # design (the lab shared the hot pack and snapshot; checkpoints after it).
    p2p_shared: tuple[str, ...] = ("image_hot", "env_snapshot", "checkpoint")
    p2p_upload_gbit_s: float | None = None  # p2p.upload_rate per node; None: no cap (0)
    # A swarm fetch's wait for its members' piece lists, per object fetched in turn: two of
    # its 0.1 s looks (nodes with cores of their own connect at once; the lab's nodes at
    # 0.1 core each took the agent's CONNECT_WAIT, 0.5 s).
    swarm_settle_s: float = 0.2
    snapshot_shard_bytes: float = 32 * 2**20  # snapshot.shard_size: content bytes a shard
    snapshot_concurrency: int = 8  # shards fetched at once (snapshot.concurrency, 8+ cores)
    node_counts: tuple[int, ...] = (1, 10, 100, 1000, 4000)

    def per_node_bytes(self) -> dict[str, float]:
        """Bytes one node needs, per artifact (the lab's ``per_node_bytes`` keys)."""
        return {"image_layers": self.image_bytes * self.layers_ratio,
                "image_hot": self.image_bytes * self.hot_fraction,
                "wheels": self.env_bytes * self.wheels_ratio,
                "env_snapshot": self.env_bytes * self.snapshot_ratio,
                "checkpoint": self.checkpoint_bytes / self.nodes_per_replica}

    def parts(self) -> dict[str, int]:
        """Distinct parts of an artifact the nodes read: the checkpoint's, one per node of
        a data-parallel replica (node i reads part i % nodes_per_replica)."""
        return {"checkpoint": self.nodes_per_replica}

    def rounds(self) -> dict[str, int]:
        """Objects of each shared artifact a node's job warm fetches one after another
        (each waits ``swarm_settle_s``): the image's manifest, hot list and hot pack; the
        snapshot's manifest, then its shards ``snapshot_concurrency`` at a time; the
        checkpoint's files at once."""
        shards = math.ceil(self.env_bytes / self.snapshot_shard_bytes)
        return {"image_hot": 3, "env_snapshot": 1 + math.ceil(shards / self.snapshot_concurrency),
                "checkpoint": 1}

    def placement(self) -> Placement:
        return Placement(self.block_size, self.replication, self.readers_per_replica,
                         self.max_replicas, seed=SEED)

    def fleet(self, nodes: int) -> Fleet:
        return Fleet(nodes, self.nic_gbit_s * GBIT, (
            Origin(HDFS, self.datanodes, self.datanode_gbit_s * GBIT, self.placement()),
            Origin(REGISTRY, self.registry_frontends, self.registry_gbit_s * GBIT),
            Origin(INDEX, self.index_mirrors, self.index_gbit_s * GBIT)),
            peer_upload=self.p2p_upload_gbit_s * GBIT if self.p2p_upload_gbit_s else None,
            swarm_settle=self.swarm_settle_s)


def priced(case: str, costs: dict[str, Cost], lab: dict, prod_bytes: dict[str, float],
           cores: float) -> tuple[Own, Pacing]:
    """``case``'s own seconds at production bytes on nodes of ``cores`` (the module's rule):
    each marked interval's (as the lab ran the case) on its first step; and, for a
    :func:`.costs.paced` interval, its per-byte part's share of them, done beside its
    bytes (``Phase.paced``)."""
    spec = lab_case(lab, case)
    own: Own = dict.fromkeys([s.name for s in spec.steps] + (["warm"] if spec.warm else []),
                             (0.0, 0.0))
    pacing: Pacing = {}
    for steps in intervals(lab, case):
        cost = costs.get(steps[-1].name, Cost(0.0, 0.0))  # the teardown: not in the start
        spread = cores if any(s.spreads for s in steps if s.scales_with) else 1.0
        per_byte = cost.per_byte * sum(prod_bytes[a] for a in grows_with(steps)) / spread
        own[steps[0].name] = (cost.fixed + per_byte, 0.0)
        if per_byte > 0 and paced(case, steps):
            pacing[steps[0].name] = per_byte / (cost.fixed + per_byte)
    return own, pacing


def node_limit(case: str, costs: dict[str, Cost], prod_bytes: dict[str, float],
               params: Production) -> float:
    """A node's physical limit for ``case``: the bytes its steps fetch over its NIC, plus
    its measured fixed costs (on one core each, one after another)."""
    fetched = {s.artifact for s in CASES[case].steps if s.artifact} | set(CASES[case].warm)
    return (sum(prod_bytes[a] for a in fetched) / (params.nic_gbit_s * GBIT)
            + sum(cost.fixed for cost in costs.values()))


def extrapolate(lab: dict, params: Production = Production(),
                sizes: Sequence[dict] = ()) -> dict:
    """Baseline, Bootseer, Bootseer prestaged, Bootseer after a fan-out and Bootseer with
    peers on ``params`` at each node count, priced from the costs fitted on ``lab`` and
    the same lab at other artifact sizes (``sizes``): time to ready (p50, p99, max), what
    limited each run, the busiest DataNode's bytes over their mean and the replication
    read, the bytes the nodes had from each other; Bootseer / baseline at 1,000, the p2p
    job's time to ready at 1,000 nodes (and over 1), and a node's physical limit."""
    began = time.monotonic()
    prod_bytes = params.per_node_bytes()
    cases, warnings, limits = {}, [], {}
    for case in EXTRAPOLATED:
        try:
            costs = step_costs([lab, *sizes], CASES[case].calibrated_from or case)
        except ValueError as error:
            warnings.append(f"{case}: {error}: not extrapolated")
            continue
        if not costs:
            warnings.append(f"{case}: no N = 1 run with its node's phases: not extrapolated")
            continue
        own, pacing = priced(case, costs, lab, prod_bytes, params.cores)
        phases, warm = plan(case, own, prod_bytes, params.fleet(1), parts=params.parts(),
                            shared=frozenset(params.p2p_shared), pacing=pacing,
                            rounds=params.rounds())
        runs = []
        for nodes in params.node_counts:
            summary = simulate(params.fleet(nodes), phases, warm).summary()
            runs.append({"nodes": nodes} | {k: summary[k] for k in (
                "p50_s", "p99_s", "max_s", "limited_by", "busy", "served_bytes",
                "peer_bytes")} | {
                "datanode_max_over_mean": summary["max_over_mean"].get(HDFS),
                "replication": params.placement().replicas(nodes, params.datanodes,
                                                           CASES[case].fanout)})
        limits[case] = node_limit(case, costs, prod_bytes, params)
        cases[case] = {"costs": {step: asdict(cost) for step, cost in costs.items()},
                       "own_s": own, "pacing": pacing, "node_limit_s": limits[case],
                       "runs": runs}
    p2p_n1000 = _job(cases, "bootseer_p2p", 1000)
    return {
        "parameters": asdict(params) | {"per_node_bytes": prod_bytes, "cpu_pool": None,
                                        "placement_seed": SEED,
                                        "swarm_rounds": params.rounds()},
        "rules": {
            "own_seconds": "a step's measured CPU work, fitted as fixed + per byte on the "
                           "lab's node cgroups at two artifact sizes: the fixed part on "
                           "one core, the per-byte part at production bytes over the node's "
                           "cores (Bootseer's swarm, restore, image server, checkpoint "
                           "reader) or one core (pip, docker's gunzip, a one-stream read)",
            "node_limit": "a node's bytes over its NIC plus its measured fixed costs",
            "placement": "HDFS: blocks of block_size, replication replicas each on "
                         "DataNodes drawn at random (placement_seed), every reader reading a "
                         "block from a replica drawn at random (beyond 16 nodes: each block's "
                         "bytes evenly from its replicas, the average of many readers' "
                         "draws); striped reads all blocks at once, one-stream reads one "
                         "after another; bootseer_fanout: replication raised to "
                         "min(max_replicas or datanodes, ceil(N / readers_per_replica)). "
                         "Registry and index: pulls and installs on one uplink each, "
                         "round-robin over the nodes",
            "links": "NICs and origin uplinks capped, shared max-min fairly; no latency; "
                     "a step's bytes move after its fixed work, beside its per-byte work "
                     "(pacing: that work's share of its own seconds) when it fetches "
                     "them itself, after all of it when a warm does",
            "swarm": "bootseer_p2p: each node reads 1/M of a shared artifact from its "
                     "origin and the rest from its M - 1 peers; each object fetched in "
                     "turn (parameters.swarm_rounds) first waits swarm_settle_s for its "
                     "members; the CPU a node spends sending to peers is not modelled",
            "status": "every parameter is an assumption, not a measurement; the costs are "
                      "measurements"},
        "cases": cases,
        "bootseer_vs_baseline_n1000": _ratio(cases, ("bootseer", 1000), ("baseline", 1000)),
        "p2p_ready_n1000_over_n1": _ratio(cases, ("bootseer_p2p", 1000), ("bootseer_p2p", 1)),
        "p2p_ready_n1000_s": p2p_n1000,
        "node_limit_n1000_s": limits.get("bootseer_p2p"),
        "note": "bootseer_vs_baseline_n1000: Bootseer's job time to ready (max) over the "
                "baseline's at 1,000 nodes (< 1: Bootseer is faster); "
                "p2p_ready_n1000_over_n1: bootseer_p2p's job time to ready at 1,000 nodes "
                "over one node's; node_limit_n1000_s: one p2p node's bytes over its NIC "
                "plus its fixed costs, whatever N",
        "runtime_s": time.monotonic() - began,
        "warnings": warnings}


def _job(cases: dict, case: str, nodes: int) -> float | None:
    """Job time to ready (max) of ``case`` at ``nodes`` (None: not run)."""
    return {r["nodes"]: r["max_s"] for r in cases.get(case, {}).get("runs", [])}.get(nodes)


def _ratio(cases: dict, top: tuple[str, int], bottom: tuple[str, int]) -> float | None:
    """Job time to ready (max) of one (case, nodes) over another's (None: not run)."""
    over, under = _job(cases, *top), _job(cases, *bottom)
    return over / under if over is not None and under else None


def plot(extrapolated: dict, path: Path) -> Path:
    """Time to ready against node count (log-log), each case's max and p50, with the
    paper's production figures marked for scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for case, data in extrapolated["cases"].items():
        nodes = [r["nodes"] for r in data["runs"]]
        line, = ax.plot(nodes, [r["max_s"] for r in data["runs"]], marker="o",
                        label=f"{case}: job (max)")
        ax.plot(nodes, [r["p50_s"] for r in data["runs"]], linestyle="--",
                color=line.get_color(), label=f"{case}: p50")
    limit = extrapolated["cases"].get("bootseer_p2p", {}).get("node_limit_s")
    if limit:
        ax.axhline(limit, color="grey", linestyle=":",
                   label="a p2p node's limit: its bytes over its NIC + its fixed costs")
    for nodes, seconds, label in PAPER:
        ax.scatter([nodes], [seconds], marker="*", s=140, color="black", zorder=3)
        ax.annotate(label, (nodes, seconds), textcoords="offset points", xytext=(6, 4),
                    fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes (8 GPUs each)")
    ax.set_ylabel("time to ready (s)")
    ax.set_title("Restart time, simulated at production scale (assumed fleet; measured "
                 "fixed and per-byte costs)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

"""The fleet simulator on cases with known answers (the network: one flow on one link, N
equal flows on one bottleneck, two bottlenecks in series, max-min shares, arrivals; a
restart: a shared origin, a CPU pool with multi-core nodes and an idle load, a teardown,
the warm's overlap and order; node classes against per-node), and its calibration
(own seconds, cores), validation and extrapolation on a synthetic lab."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import simpy
from support.fleet import synthetic_lab, with_costs

from bootseer_dev.fleetsim import Link, Network, report
from bootseer_dev.fleetsim.calibrate import (
    CASES,
    P2P_SHARED,
    calibration_marks,
    cores,
    lab_fleet,
    own_seconds,
    phases_from_lab,
    plan,
    validate,
    warm_from_lab,
)
from bootseer_dev.fleetsim.costs import pacing as fitted_pacing
from bootseer_dev.fleetsim.placement import Layout, Placement
from bootseer_dev.fleetsim.production import Production
from bootseer_dev.fleetsim.restart import Fetch, Fleet, Origin, Phase, Warm, node_classes, simulate

MB = 1e6


def run(flows: list[tuple[float, float, list[Link]]]) -> list[float]:
    """Start each (at, bytes, path) flow; the time each one finished."""
    env = simpy.Environment()
    network = Network(env)
    finished: list[float] = [0.0] * len(flows)

    def flow(i: int, at: float, size: float, path: list[Link]):
        yield env.timeout(at)
        yield network.transfer(size, path)
        finished[i] = env.now

    for i, (at, size, path) in enumerate(flows):
        env.process(flow(i, at, size, path))
    env.run()
    return finished


def test_one_flow_on_one_link_takes_size_over_capacity() -> None:
    link = Link("nic", 10 * MB)
    assert run([(0, 100 * MB, [link])]) == [pytest.approx(10.0)]
    assert link.carried == pytest.approx(100 * MB)


@pytest.mark.parametrize("n", [1, 2, 16, 1000])
def test_n_equal_flows_on_one_bottleneck_share_it(n: int) -> None:
    origin = Link("datanode", 50 * MB)
    nics = [Link(f"nic{i}", 1000 * MB) for i in range(n)]
    done = run([(0, 10 * MB, [origin, nic]) for nic in nics])
    assert done == [pytest.approx(n * 10 * MB / (50 * MB))] * n
    assert origin.carried == pytest.approx(n * 10 * MB)


def test_two_bottlenecks_in_series_the_narrower_sets_the_rate() -> None:
    assert run([(0, 30 * MB, [Link("a", 10 * MB), Link("b", 5 * MB)])]) == \
        [pytest.approx(6.0)]


def test_max_min_shares_give_the_spare_to_the_unconstrained_flow() -> None:
    """Link 1 (10 MB/s) carries A and B; B also crosses link 2 (2 MB/s): B gets 2, A the
    other 8; once B is done A has all 10."""
    one, two = Link("one", 10 * MB), Link("two", 2 * MB)
    a_done, b_done = run([(0, 100 * MB, [one]), (0, 10 * MB, [one, two])])
    assert b_done == pytest.approx(5.0)  # 10 MB at 2 MB/s
    assert a_done == pytest.approx(5.0 + (100 - 40) / 10)  # 40 MB at 8, then 60 at 10


def test_a_flow_arriving_later_shares_from_then_on() -> None:
    link = Link("nic", 10 * MB)
    first, second = run([(0, 100 * MB, [link]), (5, 50 * MB, [link])])
    assert first == pytest.approx(15.0) and second == pytest.approx(15.0)


def test_bad_transfers_are_refused() -> None:
    env = simpy.Environment()
    network = Network(env)
    with pytest.raises(ValueError):
        network.transfer(1, [])
    with pytest.raises(ValueError):
        network.transfer(1, [Link("dead", 0)])


# -- restarts ---------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 4, 64])
def test_nodes_share_one_origin_and_striped_reads_balance_many(nodes: int) -> None:
    one = Fleet(nodes, 1000 * MB, (Origin("registry", 1, 50 * MB),))
    outcome = simulate(one, [Phase("image", 2.0, Fetch("layers", 10 * MB, "registry"))])
    assert outcome.ready() == [pytest.approx(2.0 + nodes * 10 / 50)] * nodes
    many = Fleet(nodes, 1000 * MB, (Origin("hdfs", 4, 25 * MB),))
    outcome = simulate(many, [Phase("ready", 0.0, Fetch("ckpt", 100 * MB, "hdfs", spread=4))])
    assert outcome.summary()["max_s"] == pytest.approx(nodes * 100 / 100)
    assert outcome.summary()["origin_max_over_mean"] == pytest.approx(1.0)
    assert outcome.summary()["limited_by"] == "hdfs"
    assert sum(outcome.served["hdfs"]) == pytest.approx(nodes * 100 * MB)


@pytest.mark.parametrize("nodes", [1, 2, 5, 16])
def test_a_shared_cpu_pool_is_processor_sharing_with_one_core_per_node(nodes: int) -> None:
    """N nodes with 1 s of work each on 2 cores: 1 s alone (one core at most), N/2 s
    for N >= 2; without a pool every node has its own core."""
    work = [Phase("work", 1.0)]
    pooled = simulate(Fleet(nodes, MB, (), cpus=2), work)
    assert pooled.ready() == [pytest.approx(max(1.0, nodes / 2))] * nodes
    assert simulate(Fleet(nodes, MB, ()), work).ready() == [pytest.approx(1.0)] * nodes


@pytest.mark.parametrize("nodes, done", [(1, 1.0), (2, 2.0), (4, 4.0)])
def test_a_node_keeps_its_cores_busy_and_nodes_share_the_pool(nodes: int, done: float) -> None:
    """Each node has 2 core-seconds of work on 2 threads, on 2 shared cores: alone it takes
    1 s; two take 2 s, four 4 s; the cores are busy throughout (and without a pool each
    node has its 2 cores: 1 s)."""
    outcome = simulate(Fleet(nodes, MB, (), cpus=2), [Phase("work", 1.0, cores=2)])
    assert outcome.ready() == [pytest.approx(done)] * nodes
    assert outcome.summary()["cpu_used"] == pytest.approx(1.0)
    assert simulate(Fleet(nodes, MB, ()), [Phase("work", 1.0, cores=2)]).ready() == \
        [pytest.approx(1.0)] * nodes


@pytest.mark.parametrize("nodes", [1, 4, 16])
def test_a_node_budget_is_each_nodes_own_whatever_the_others_do(nodes: int) -> None:
    """A quota of 0.5 core per node: 1 s of one core's work takes 2 s on every node at
    any N; a start and a warm of 1 core each on a node of 1 core share it (2 s each, as one
    task of 2 core-seconds), where without a budget each takes 1 s."""
    work = [Phase("work", 1.0)]
    budget = simulate(Fleet(nodes, MB, (), node_cpus=0.5), work)
    assert budget.ready() == [pytest.approx(2.0)] * nodes
    assert budget.summary()["limited_by"] == "node_cpu"
    both = simulate(Fleet(nodes, MB, (), node_cpus=1.0), work, Warm(1.0, ()))
    assert [m["work"] for m in both.marks] == [pytest.approx(2.0)] * nodes
    assert [m["warm"] for m in both.marks] == [pytest.approx(2.0)] * nodes
    apart = simulate(Fleet(nodes, MB, ()), work, Warm(1.0, ()))
    assert [m["warm"] for m in apart.marks] == [pytest.approx(1.0)] * nodes


def test_an_idle_load_of_half_the_cores_leaves_the_nodes_the_other_half() -> None:
    """Of 2 cores, 0.5 busy with other work leaves 1: 2 core-seconds on 2 threads take 2 s,
    1 s on one thread still 1 s; the machine reads fully busy."""
    fleet = Fleet(1, MB, (), cpus=2, cpu_idle=0.5)
    assert fleet.pool == pytest.approx(1.0)
    two_threads = simulate(fleet, [Phase("work", 1.0, cores=2)])
    assert two_threads.ready() == [pytest.approx(2.0)]
    assert two_threads.summary()["cpu_used"] == pytest.approx(1.0)
    assert simulate(fleet, [Phase("work", 1.0)]).ready() == [pytest.approx(1.0)]


def test_a_teardown_loads_the_cores_but_is_not_time_to_ready() -> None:
    """Two nodes on one core: 1 s of work each ends at 2 s (ready), then 1 s of teardown
    each ends at 4 s, the core busy all along."""
    phases = [Phase("ready", 1.0), Phase("exited", 1.0, teardown=True)]
    outcome = simulate(Fleet(2, MB, (), cpus=1), phases)
    assert outcome.ready() == [pytest.approx(2.0)] * 2
    assert outcome.summary()["max_s"] == pytest.approx(2.0)
    assert [m["exited"] for m in outcome.marks] == [pytest.approx(4.0)] * 2
    assert outcome.summary()["cpu_used"] == pytest.approx(1.0)


def test_the_warm_fetches_one_artifact_after_another() -> None:
    """Two 100 MB artifacts at 10 MB/s: the first in at 10 s, the second at 20 s (in the
    order the warm lists them), not both at 20 s."""
    fleet = Fleet(1, 10 * MB, (Origin("hdfs", 1, 1000 * MB),))
    warm = Warm(0.0, (Fetch("env", 100 * MB, "hdfs"), Fetch("ckpt", 100 * MB, "hdfs")))
    marks = simulate(fleet, [], warm).marks[0]
    assert marks["fetched:env"] == pytest.approx(10.0)
    assert marks["fetched:ckpt"] == pytest.approx(marks["warm"]) == pytest.approx(20.0)


@pytest.mark.parametrize("own, done", [(4.0, 10.0), (15.0, 15.0)])
def test_a_prefetched_phase_ends_at_its_own_work_or_its_bytes_arrival(own, done) -> None:
    """The warm fetches 100 MB at 10 MB/s (in at 10 s); the phase reading them ends at
    the later of its own work and that arrival, and the bytes cross the network once."""
    fleet = Fleet(1, 10 * MB, (Origin("hdfs", 1, 1000 * MB),))
    snapshot = Fetch("snapshot", 100 * MB, "hdfs")
    outcome = simulate(fleet, [Phase("env", own, snapshot)], Warm(0.0, (snapshot,)))
    assert outcome.marks[0]["env"] == pytest.approx(done)
    assert outcome.marks[0]["warm"] == pytest.approx(10.0)
    assert outcome.served["hdfs"] == [pytest.approx(100 * MB)]


@pytest.mark.parametrize(("nodes", "done"), [(1, 4.0), (2, 4.0), (4, 1.0 + 4 * 1.0)])
def test_paced_work_runs_beside_its_bytes(nodes: int, done: float) -> None:
    """1 s of fixed work, then 3 s of work on 40 MB as they arrive from one 40 MB/s
    origin: alone, or two nodes (each at 20 MB/s, 2 s), the work sets the pace (4 s); four
    (10 MB/s, 4 s) wait for their bytes (5 s). Not paced, it would be 1 + 3 + transfer."""
    fleet = Fleet(nodes, 100 * MB, (Origin("registry", 1, 40 * MB),))
    phase = Phase("image", 1.0, Fetch("layers", 40 * MB, "registry"), paced=3.0)
    assert simulate(fleet, [phase]).marks[0]["image"] == pytest.approx(done)
    serial = Phase("image", 4.0, Fetch("layers", 40 * MB, "registry"))
    assert simulate(fleet, [serial]).marks[0]["image"] == pytest.approx(4.0 + nodes)


def test_node_classes_give_the_per_node_answer() -> None:
    """Ten nodes, one-stream reads from 4 DataNodes and 2 registry frontends (uneven
    loads), striped reads, uploads, a warm and a shared pool: grouping identical nodes
    changes nothing."""
    fleet = Fleet(10, 25 * MB, (Origin("hdfs", 4, 40 * MB), Origin("registry", 2, 40 * MB)),
                  cpus=2)
    phases = [Phase("image", 1.0, Fetch("layers", 40 * MB, "registry")),
              Phase("publish", 0.5, Fetch("snapshot", 30 * MB, "hdfs", 4, upload=True)),
              Phase("imported", 0.3, Fetch("hot", 25 * MB, "hdfs", 4), after=0.2),
              Phase("checkpoint", 0.2, Fetch("ckpt", 33 * MB, "hdfs"))]
    warm = Warm(0.4, (Fetch("hot", 25 * MB, "hdfs", 4),))
    grouped, per_node = (simulate(fleet, phases, warm, grouped=g) for g in (True, False))
    assert len(node_classes(fleet, [p.fetch for p in phases])) == 4 < fleet.nodes
    assert [m.keys() for m in grouped.marks] == [m.keys() for m in per_node.marks]
    for mine, theirs in zip(grouped.marks, per_node.marks):
        assert mine == {k: pytest.approx(v) for k, v in theirs.items()}
    assert grouped.served == {k: [pytest.approx(b) for b in v]
                              for k, v in per_node.served.items()}
    assert grouped.summary()["p99_s"] == pytest.approx(per_node.summary()["p99_s"])


# -- HDFS placement ----------------------------------------------------------------------


def hdfs(nodes: int, datanodes: int, placement: Placement, nic: float = 1000 * MB) -> Fleet:
    return Fleet(nodes, nic, (Origin("hdfs", datanodes, 10 * MB, placement),))


def balance(served: list[float]) -> float:
    return max(served) / (sum(served) / len(served))


@pytest.mark.parametrize("replication", [1, 2, 3, 7])
@pytest.mark.parametrize("nodes", [5, 64])  # each reader draws; readers' draws averaged
def test_one_block_is_served_by_its_replicas_datanodes_only(replication: int,
                                                            nodes: int) -> None:
    """One block of 8 MB, `replication` replicas on 7 DataNodes, read by every node: its
    bytes leave at most `replication` DataNodes (exactly those, once the readers' draws
    are averaged), the others serve none, and every byte is served."""
    placement = Placement(block_size=8 * MB, replication=replication)
    fleet = hdfs(nodes, 7, placement)
    outcome = simulate(fleet, [Phase("read", 0.0, Fetch("block", 8 * MB, "hdfs", spread=7))])
    served = outcome.served["hdfs"]
    carrying = [d for d, b in enumerate(served) if b > 0]
    assert sum(served) == pytest.approx(nodes * 8 * MB)
    assert len(carrying) <= replication and served.count(0.0) >= 7 - replication
    if nodes > placement.exact_nodes:
        assert len(carrying) == replication
        assert served == [pytest.approx(nodes * 8 * MB / replication) if d in carrying else 0.0
                          for d in range(7)]


def test_with_a_replica_on_every_datanode_many_readers_balance_them() -> None:
    """Replication = DataNodes: each reader's random pick leaves the busiest of 4
    DataNodes well above the mean with 8 readers, within 5% of it with 4,000 (each drawing
    its own), and at the mean when the draws are averaged."""
    fetches = [Fetch("hot", 8 * MB, "hdfs", spread=4)]

    def drawn(nodes: int, exact_nodes: int = 10**6) -> float:
        placement = Placement(block_size=8 * MB, replication=4, exact_nodes=exact_nodes)
        return balance(Layout(hdfs(nodes, 4, placement), fetches).served("hdfs"))

    assert drawn(8) > 1.2
    assert drawn(4000) < 1.05
    assert drawn(4000, exact_nodes=16) == pytest.approx(1.0)


def test_placement_is_deterministic_for_a_seed() -> None:
    """The same seed places blocks and reads alike (marks and bytes); another seed
    differs."""
    phases = [Phase("ready", 0.5, Fetch("ckpt", 64 * MB, "hdfs", spread=8, pieces=2))]

    def run(seed: int):
        fleet = hdfs(12, 8, Placement(block_size=8 * MB, replication=2, seed=seed), 25 * MB)
        outcome = simulate(fleet, phases)
        return outcome.served["hdfs"], outcome.marks

    assert run(7) == run(7)
    assert run(7)[0] != run(8)[0]


def test_fanout_replication_is_replicas_for_the_jobs_nodes() -> None:
    """One replica per 4 readers, at most the DataNodes (or max_replicas), never below the
    replication the objects had, never above the DataNodes."""
    placement = Placement(block_size=MB, replication=3)
    assert placement.replicas(16, 4, fanout=True) == 4
    assert placement.replicas(4, 200, fanout=True) == 3
    assert placement.replicas(10, 200, fanout=True) == 3
    assert placement.replicas(100, 200, fanout=True) == 25
    assert placement.replicas(4000, 200, fanout=True) == 200
    assert placement.replicas(4000, 200) == 3
    assert Placement(block_size=MB, replication=3, max_replicas=50).replicas(
        4000, 200, fanout=True) == 50
    assert Placement(block_size=MB, replication=3).replicas(1, 2) == 2


def test_a_one_stream_read_takes_its_blocks_one_after_another() -> None:
    """Four 10 MB blocks, each on all 4 DataNodes of 10 MB/s, a fast NIC: one stream reads
    them in turn (40 MB at 10 MB/s: 4 s), a striped read from every DataNode at once
    (readers' draws averaged: 1 s)."""
    fleet = hdfs(1, 4, Placement(block_size=10 * MB, replication=4, exact_nodes=0))

    def took(spread: int) -> float:
        return simulate(fleet, [Phase("read", 0.0, Fetch("ckpt", 40 * MB, "hdfs", spread))]
                        ).marks[0]["read"]

    assert took(1) == pytest.approx(4.0)
    assert took(4) == pytest.approx(1.0)
    assert fleet.alone_s(Fetch("ckpt", 40 * MB, "hdfs", 1)) == pytest.approx(4.0)


@pytest.mark.parametrize("exact_nodes", [16, 4])
def test_node_classes_under_placement_give_the_per_node_answer(exact_nodes: int) -> None:
    """Twelve nodes reading a checkpoint's two parts (one stream) and a shared pack
    (striped) from 2 replicas of blocks on 5 DataNodes, with a warm: nodes that read alike
    are one class, and grouping changes nothing."""
    fleet = Fleet(12, 25 * MB, (Origin("hdfs", 5, 40 * MB, Placement(
        block_size=8 * MB, replication=2, exact_nodes=exact_nodes)),), cpus=2)
    phases = [Phase("imported", 0.3, Fetch("hot", 30 * MB, "hdfs", 5), after=0.2),
              Phase("checkpoint", 0.2, Fetch("ckpt", 33 * MB, "hdfs", pieces=2))]
    warm = Warm(0.4, (Fetch("hot", 30 * MB, "hdfs", 5),))
    grouped, per_node = (simulate(fleet, phases, warm, grouped=g) for g in (True, False))
    for mine, theirs in zip(grouped.marks, per_node.marks):
        assert mine == {k: pytest.approx(v) for k, v in theirs.items()}
    assert grouped.served == {k: [pytest.approx(b) for b in v]
                              for k, v in per_node.served.items()}
    if exact_nodes < fleet.nodes:  # parts x replica turns of the one-stream read
        assert len(node_classes(fleet, [p.fetch for p in phases])) == 2 * 2


# -- the lab: calibration, validation, extrapolation ------------------------------------


#: The cases with runs of their own (``bootseer_fanout`` borrows Bootseer's N = 1).
OWN_RUNS = [case for case in CASES if not CASES[case].calibrated_from]


@pytest.mark.parametrize("case", OWN_RUNS)
def test_calibration_reproduces_the_one_node_run(case: str) -> None:
    lab = synthetic_lab(counts=(1,))
    (marks,) = (n["marks"] for n in lab["cases"][case]["1"]["nodes"])
    sim = simulate(lab_fleet(lab, 1), phases_from_lab(lab, case),
                   warm_from_lab(lab, case)).marks[0]
    assert {m: sim[m] for m in marks} == {m: pytest.approx(t, rel=0.01)
                                          for m, t in marks.items()}


@pytest.mark.parametrize("case", ["baseline", "bootseer_cold"])
def test_calibration_with_paced_work_reproduces_the_one_node_run(case: str) -> None:
    """With each fetching step's per-byte share (from runs at two sizes) done beside its
    bytes, N = 1 still comes out as measured."""
    labs = [with_costs(synthetic_lab(counts=(1,)), scale) for scale in (1.0, 2.0)]
    pacing = fitted_pacing(labs, case)
    assert pacing and all(0 < f < 1 for f in pacing.values())
    lab = labs[0]
    (marks,) = (n["marks"] for n in lab["cases"][case]["1"]["nodes"])
    own = own_seconds(lab, case, pacing)
    phases, warm = plan(case, own, lab["per_node_bytes"], lab_fleet(lab, 1),
                        cores(lab, case, own), shared=frozenset(P2P_SHARED), pacing=pacing)
    assert any(p.paced > 0 for p in phases)
    sim = simulate(lab_fleet(lab, 1), phases, warm).marks[0]
    assert {m: sim[m] for m in marks} == {m: pytest.approx(t, rel=0.01)
                                          for m, t in marks.items()}


def test_calibration_takes_each_steps_median_over_the_repeated_runs() -> None:
    """Three runs of one node: each step's duration is its median over them (image 30 s,
    env 40 s), whichever run had it, not one run's."""
    lab = synthetic_lab(counts=(1,))
    point = lab["cases"]["baseline"]["1"]
    node = point["nodes"][0]
    point["runs"] = []
    for image, env in ((30.0, 50.0), (20.0, 40.0), (35.0, 38.0)):
        marks = dict(node["marks"])
        shift = image + env - marks["env"]
        marks.update({m: t + shift for m, t in marks.items()}, image=image, env=image + env)
        point["runs"].append({"nodes": [{"node": 0, "marks": marks}]})
    marks = calibration_marks(lab, "baseline")
    assert marks["image"] == pytest.approx(30.0) and marks["env"] == pytest.approx(70.0)
    assert marks["ready"] - marks["env"] == pytest.approx(node["marks"]["ready"]
                                                          - node["marks"]["env"])


def test_a_step_that_waited_for_the_warm_counts_only_its_own_work_as_work() -> None:
    """bootseer's env ended 0.2 s after the warm brought its snapshot in: its own work is
    the prestaged restore's 1.2 s, the 0.2 s after the bytes; the wait is no work."""
    lab = synthetic_lab(counts=(1,))
    env = phases_from_lab(lab, "bootseer")[0]
    assert env.seconds == pytest.approx(1.2) and env.fetch.artifact == "env_snapshot"
    assert 0 < env.after < 0.5


def one_node_lab(busy: float | None, idle: float | None) -> dict:
    """A prestaged start alone: 3 s to ready, 1 s of teardown, all of it own work."""
    run: dict = {"nodes": [{"node": 0, "marks": {"env": 1.0, "started": 2.0, "imported": 2.5,
                                                 "checkpoint": 3.0, "ready": 3.0,
                                                 "exited": 4.0}}], "wall_s": 4.0}
    if busy is not None:
        run["cpu_busy"] = busy
    if idle is not None:
        run["cpu_busy_idle"] = idle
    return {"caps": synthetic_lab(counts=())["caps"], "per_node_bytes": {},
            "cases": {"bootseer_prestaged": {"1": run}}}


@pytest.mark.parametrize("busy, idle, expected", [
    (0.75, None, 1.5),  # 0.75 x 2 cores x 4 s = 6 core-seconds over 4 own seconds
    (0.75, 0.25, 1.0),  # the idle load's 2 core-seconds are not the node's
    (1.0, None, 2.0),   # every core, all along
    (None, None, 1.0),  # CPU unrecorded: one core
])
def test_cores_are_the_one_node_runs_core_seconds_over_its_own_seconds(
        busy: float | None, idle: float | None, expected: float) -> None:
    lab = one_node_lab(busy, idle)
    own = own_seconds(lab, "bootseer_prestaged")
    assert sum(a + b for a, b in own.values()) == pytest.approx(4.0)
    assert cores(lab, "bootseer_prestaged", own) == pytest.approx(expected)


def test_a_start_and_its_warm_share_the_cores_they_had_alone() -> None:
    """A machine fully busy for Bootseer's N = 1 run: its start and warm ran at once on 2
    cores, so each keeps at most 1 busy (the prestaged start, alone, may keep 2)."""
    lab = synthetic_lab(counts=(1,))
    for case in ("bootseer", "bootseer_prestaged"):
        lab["cases"][case]["1"]["cpu_busy"] = 1.0
    assert cores(lab, "bootseer", own_seconds(lab, "bootseer")) == pytest.approx(1.0)
    assert cores(lab, "bootseer_prestaged", own_seconds(lab, "bootseer_prestaged")) == \
        pytest.approx(2.0)


@pytest.mark.parametrize("idle, ready", [(None, 5.2), (0.5, 10.4)])
def test_a_runs_idle_load_leaves_its_nodes_less_of_the_cores(idle, ready) -> None:
    """Prestaged in the synthetic lab: 2.6 s of one core's work to ready (and 0.3 s of
    teardown) per node; four nodes on 2 cores are ready at 4 x 2.6 / 2 s, on the 1 core an
    idle load of 0.5 leaves them at 4 x 2.6 s."""
    lab = synthetic_lab(counts=(1, 4))
    assert cores(lab, "bootseer_prestaged", own_seconds(lab, "bootseer_prestaged")) == \
        pytest.approx(1.0)
    if idle is not None:
        lab["cases"]["bootseer_prestaged"]["4"]["cpu_busy_idle"] = idle
    (row,) = (r for r in validate(lab)["rows"]
              if r["case"] == "bootseer_prestaged" and r["nodes"] == 4)
    assert row["sim_max_s"] == pytest.approx(ready)


def test_under_a_node_budget_a_start_is_calibrated_from_its_nodes_cgroup() -> None:
    """A lab at 0.1 core per node: the prestaged start's work is its node's cgroup CPU
    (0.26 core-seconds in 2.9 own seconds: 0.09 core, not the machine's busy share), its
    nodes do not share the machine's cores, so 16 take what one takes; a step the run
    has no mark for (``env``: the agent's mount) ends inside the next one."""
    lab = synthetic_lab(counts=(1, 16))
    lab["caps"]["node_cpu_quota_cores"] = 0.1
    for run in lab["cases"]["bootseer_prestaged"].values():
        for node in run["nodes"]:
            node["cpu_s"] = 0.26
            del node["marks"]["env"]
        run["cpu_busy"] = 1.0  # the machine's: not the node's
    own = own_seconds(lab, "bootseer_prestaged")
    assert own["env"][0] == pytest.approx(1.2 + 0.5) and own["started"] == (0.0, 0.0)
    assert cores(lab, "bootseer_prestaged", own) == pytest.approx(0.26 / 2.9)
    fleet = lab_fleet(lab, 16)
    assert fleet.cpus is None and fleet.node_cpus == 0.1
    rows = {r["nodes"]: r for r in validate(lab)["rows"] if r["case"] == "bootseer_prestaged"}
    assert rows[16]["sim_max_s"] == pytest.approx(rows[1]["sim_max_s"])
    assert rows[1]["sim_max_s"] == pytest.approx(2.6)


def test_the_fanout_case_is_bootseers_start_on_more_replicas() -> None:
    """bootseer_fanout borrows Bootseer's N = 1 calibration; at 16 nodes it reads every
    block from 4 replicas (one per 4 readers, at most the 4 DataNodes) instead of 1, so its
    DataNodes are more even, for the seed and over the seeds."""
    lab = synthetic_lab(counts=(1, 16))
    lab["cases"]["bootseer_fanout"] = {"16": lab["cases"]["bootseer"]["16"]}
    result = validate(lab)
    rows = {(r["case"], r["nodes"]): r for r in result["rows"]}
    fanout, bootseer = rows["bootseer_fanout", 16], rows["bootseer", 16]
    assert not fanout["calibration_run"]
    assert result["calibration"]["bootseer_fanout"] == result["calibration"]["bootseer"]
    assert result["placement"]["replication"] == 1 and result["placement"]["max_replicas"] == 4
    assert fanout["sim_datanode_max_over_mean"] < bootseer["sim_datanode_max_over_mean"]
    assert fanout["sim_datanode_max_over_mean_seeds"]["median"] < \
        bootseer["sim_datanode_max_over_mean_seeds"]["median"]
    del lab["cases"]["bootseer"]["1"]
    assert any("bootseer: no complete N = 1 run" in w for w in validate(lab)["warnings"])


def test_a_node_without_a_mark_is_left_out_with_a_warning() -> None:
    lab = synthetic_lab(counts=(1, 4))
    lab["cases"]["baseline"]["4"]["nodes"][3]["marks"]["checkpoint"] = None
    del lab["cases"]["bootseer_cold"]["1"]
    lab["cases"]["p2p_pull"] = lab["cases"]["baseline"]
    result = validate(lab)
    assert any("baseline N=4: nodes [3]" in w for w in result["warnings"])
    assert any("bootseer_cold: no complete N = 1 run" in w for w in result["warnings"])
    assert any("p2p_pull: no model" in w for w in result["warnings"])
    assert {r["case"] for r in result["rows"]} == {"baseline", "bootseer_prestaged",
                                                   "bootseer", "bootseer_p2p"}


def test_report_validates_extrapolates_and_plots(tmp_path: Path) -> None:
    # 0.5 core-seconds fixed a phase, 500 MB/s a core: origins, not own work, bound N = 1000
    lab = json.loads(json.dumps(with_costs(synthetic_lab(), per_mb=0.002)))
    twice = with_costs(synthetic_lab(counts=(1,)), 2.0, per_mb=0.002)
    result = report(lab, tmp_path / "fleet.png", Production(node_counts=(1, 100, 1000)),
                    [twice])
    assert set(result) == {"validation", "extrapolation", "sim_max_validation_error",
                           "sim_bootseer_vs_baseline_n1000", "sim_p2p_ready_n1000_over_n1",
                           "sim_p2p_ready_n1000_s", "node_limit_n1000_s", "png"}
    assert result["node_limit_n1000_s"] < result["sim_p2p_ready_n1000_s"]
    rows = result["validation"]["rows"]
    assert len(rows) == 5 * 5 and all(r["calibration_run"] == (r["nodes"] == 1) for r in rows)
    assert max(max(r["error_p50"], r["error_max"]) for r in rows if r["nodes"] == 1) < 0.01
    assert result["sim_max_validation_error"] == result["validation"]["max_error"]
    runs = result["extrapolation"]["cases"]["baseline"]["runs"]
    assert [r["nodes"] for r in runs] == [1, 100, 1000]
    assert runs[-1]["max_s"] > runs[0]["max_s"] and runs[-1]["limited_by"] == "index"
    assert 0 < result["sim_bootseer_vs_baseline_n1000"] < 1
    assert 1 <= result["sim_p2p_ready_n1000_over_n1"] <= 2  # the goal
    # At 1,000 nodes, 3 replicas of what every node reads make a few DataNodes the hot
    # spots; the fan-out keeps it on all 200 (ceil(1000 / 4) capped), evenly.
    (plain, fanned) = (result["extrapolation"]["cases"][c]["runs"][-1]
                       for c in ("bootseer", "bootseer_fanout"))
    assert (plain["replication"], fanned["replication"]) == (3, 200)
    assert fanned["datanode_max_over_mean"] == pytest.approx(1.0)
    assert plain["datanode_max_over_mean"] > 1.5
    assert fanned["max_s"] < plain["max_s"]
    json.dumps(result)  # it goes into bench-results/restart.json
    assert Path(result["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""The fleet simulator's peer model on cases with known answers: a flow crossing a link in
part, a swarm's origin bytes (about once per part, whatever N), its time to ready flat in N
while the uplinks keep up, an upload cap's slowdown, node classes against per-node; and
the p2p case calibrated, validated and extrapolated (tests/support/fleet.py's synthetic
lab)."""

from __future__ import annotations

import pytest
import simpy
from support.fleet import synthetic_lab, with_costs

from bootseer_dev.fleetsim import Link, Network, validate
from bootseer_dev.fleetsim.placement import Placement
from bootseer_dev.fleetsim.production import Production, extrapolate
from bootseer_dev.fleetsim.restart import Fetch, Fleet, Origin, Phase, Warm, simulate

MB = 1e6
SIZE = 100 * MB  # what every node needs
NIC = 25 * MB  # each node's link, either way (the lab's)


def lab_like(nodes: int, peer_upload: float | None = None, exact_nodes: int = 16) -> Fleet:
    """The lab's shape: 4 DataNodes of 40 MB/s, replication 1, 8 MB blocks, 25 MB/s NICs."""
    placement = Placement(block_size=8 * MB, replication=1, exact_nodes=exact_nodes)
    return Fleet(nodes, NIC, (Origin("hdfs", 4, 40 * MB, placement),),
                 peer_upload=peer_upload)


def shared(nbytes: float = SIZE, pieces: int = 1, peers: bool = True) -> list[Phase]:
    return [Phase("ready", 0.0, Fetch("pack", nbytes, "hdfs", spread=4, pieces=pieces,
                                      peers=peers))]


def test_a_flow_crossing_a_link_in_part_loads_it_with_that_share() -> None:
    """Alone at half a 10 MB/s link: 20 MB/s, and the link carries half its bytes; beside a
    flow crossing all of it, both rise to 10 / 1.5 MB/s."""
    env = simpy.Environment()
    network, link = Network(env), Link("up", 10 * MB)
    done = network.transfer(100 * MB, [link], shares=(0.5,))
    env.run(done)
    assert env.now == pytest.approx(5.0) and link.carried == pytest.approx(50 * MB)
    env, other = simpy.Environment(), Link("up", 10 * MB)
    network = Network(env)
    half = network.transfer(10 * MB, [other], shares=(0.5,))
    whole = network.transfer(10 * MB, [other])
    env.run(half & whole)
    assert env.now == pytest.approx(1.5)
    with pytest.raises(ValueError):
        network.transfer(1, [other], shares=(0.0,))
    with pytest.raises(ValueError):
        Fetch("snapshot", 1, "hdfs", upload=True, peers=True)


@pytest.mark.parametrize("nodes", [1, 2, 5, 16, 64, 1000])
def test_a_swarm_takes_each_byte_from_the_origin_once(nodes: int) -> None:
    """N nodes sharing S bytes: the DataNodes serve S, the nodes each other (N - 1) S."""
    outcome = simulate(lab_like(nodes), shared())
    assert sum(outcome.served["hdfs"]) == pytest.approx(SIZE)
    assert outcome.peer_bytes == pytest.approx((nodes - 1) * SIZE)
    alone = simulate(lab_like(nodes), shared(peers=False))
    assert sum(alone.served["hdfs"]) == pytest.approx(nodes * SIZE)
    assert alone.peer_bytes == 0


@pytest.mark.parametrize("nodes", [1, 2, 3, 8])
def test_each_part_is_its_own_swarm(nodes: int) -> None:
    """A checkpoint in 2 parts (node i reads part i % 2): each part read by any node comes
    from the origin once, and a node's peers are the nodes of its part only."""
    outcome = simulate(lab_like(nodes), shared(pieces=2))
    assert sum(outcome.served["hdfs"]) == pytest.approx(min(nodes, 2) * SIZE)
    readers = [len(range(part, nodes, 2)) for part in range(2)]
    assert outcome.peer_bytes == pytest.approx(sum(max(0, n - 1) for n in readers) * SIZE)


@pytest.mark.parametrize("nodes", [1, 2, 4, 16, 64, 1000])
def test_ready_is_flat_in_n_while_the_uplinks_keep_up(nodes: int) -> None:
    """Every node's NIC brings it S bytes (S / 25 MB/s: 4 s) while its uplink sends about
    as much, at any N; read from the store, 160 MB/s of DataNodes (at best: their blocks
    are not even) serve N x S."""
    assert simulate(lab_like(nodes), shared()).summary()["max_s"] == pytest.approx(SIZE / NIC)
    alone = simulate(lab_like(nodes), shared(peers=False)).summary()["max_s"]
    assert alone >= max(SIZE / NIC, nodes * SIZE / (160 * MB)) * (1 - 1e-9)


@pytest.mark.parametrize("nodes", [2, 4, 16])
def test_an_upload_cap_slows_the_peer_part_to_it(nodes: int) -> None:
    """p2p.upload_rate of 5 MB/s: a node sends, and so receives, its peers' (N - 1) / N of
    S at 5 MB/s at most; a cap above the NIC changes nothing."""
    cap = 5 * MB
    capped = simulate(lab_like(nodes, peer_upload=cap), shared()).summary()
    assert capped["max_s"] == pytest.approx(SIZE * (nodes - 1) / nodes / cap)
    assert capped["limited_by"] == "p2p_up"
    loose = simulate(lab_like(nodes, peer_upload=2 * NIC), shared()).summary()
    assert loose["max_s"] == pytest.approx(SIZE / NIC)


def test_uplinks_busy_with_other_flows_send_less_to_peers() -> None:
    """4 nodes, each also uploading 200 MB to the DataNodes (4 flows over its uplink): a
    node's peers send it at the fifth of their 25 MB/s uplinks the max-min share leaves
    (5 MB/s) until the uploads end at 10 s (20 MB/s each); the 25 MB still missing then
    come at 25 MB/s: 11 s, where 4 s would do with idle uplinks."""
    upload = Fetch("snapshot", 200 * MB, "hdfs", spread=4, upload=True)
    outcome = simulate(lab_like(4), shared(), Warm(0.0, (upload,)))
    assert outcome.marks[0]["warm"] == pytest.approx(10.0)
    assert outcome.marks[0]["ready"] == pytest.approx(11.0)


@pytest.mark.parametrize("exact_nodes", [16, 4])
def test_node_classes_with_peers_give_the_per_node_answer(exact_nodes: int) -> None:
    """Twelve nodes sharing a hot pack (one swarm) and a checkpoint in 3 parts (three)
    over replicated blocks, with CPU and a warm: grouping changes no mark and no byte."""
    fleet = Fleet(12, 25 * MB, (Origin("hdfs", 5, 40 * MB, Placement(
        block_size=8 * MB, replication=2, exact_nodes=exact_nodes)),), cpus=2,
        peer_upload=20 * MB)
    hot = Fetch("hot", 30 * MB, "hdfs", 5, peers=True)
    phases = [Phase("imported", 0.3, hot, after=0.2),
              Phase("checkpoint", 0.2, Fetch("ckpt", 33 * MB, "hdfs", 5, pieces=3,
                                             peers=True))]
    grouped, per_node = (simulate(fleet, phases, Warm(0.4, (hot,)), grouped=g)
                         for g in (True, False))
    for mine, theirs in zip(grouped.marks, per_node.marks):
        assert mine == {k: pytest.approx(v) for k, v in theirs.items()}
    assert grouped.served == {k: [pytest.approx(b) for b in v]
                              for k, v in per_node.served.items()}
    assert grouped.peer_bytes == pytest.approx(per_node.peer_bytes)


def test_the_p2p_case_shares_what_the_lab_says() -> None:
    """bootseer_p2p on the synthetic lab: the hot pack and the snapshot from the swarm,
    the checkpoint (2 groups) from HDFS, unless the lab dict says the swarm shares it."""
    lab = synthetic_lab(counts=(1, 16)) | {"checkpoint_groups": 2}
    size = lab["per_node_bytes"]
    once = size["image_hot"] + size["env_snapshot"]

    def origin(result: dict) -> float:
        (row,) = (r for r in result["rows"] if r["case"] == "bootseer_p2p" and r["nodes"] == 16)
        return sum(row["origin_bytes"]["sim"].values())

    assert origin(validate(lab)) == pytest.approx(once + 16 * size["checkpoint"])
    lab["p2p_shared"] = ["image_hot", "env_snapshot", "checkpoint"]
    assert origin(validate(lab)) == pytest.approx(once + 2 * size["checkpoint"])


def test_production_p2p_reads_each_part_once_and_stays_flat() -> None:
    """At 1,000 nodes the store serves the hot pack, the snapshot and each of the 8
    checkpoint parts once, and the job is ready about when one node is."""
    params = Production(node_counts=(1, 1000))
    result = extrapolate(with_costs(synthetic_lab(counts=(1,))), params,
                         [with_costs(synthetic_lab(counts=(1,)), 2.0)])
    one, many = result["cases"]["bootseer_p2p"]["runs"]
    size = params.per_node_bytes()
    assert one["served_bytes"]["hdfs"] == pytest.approx(sum(
        size[a] for a in ("image_hot", "env_snapshot", "checkpoint")))
    assert many["served_bytes"]["hdfs"] == pytest.approx(
        size["image_hot"] + size["env_snapshot"] + params.checkpoint_bytes)
    assert result["p2p_ready_n1000_over_n1"] == pytest.approx(many["max_s"] / one["max_s"])
    # one node's time, and at most each object's wait for its members (alone: none)
    settle = params.swarm_settle_s * sum(params.rounds().values())
    assert one["max_s"] < many["max_s"] <= one["max_s"] + settle + 1e-6


def test_production_fetches_the_snapshots_shards_a_few_at_a_time() -> None:
    """5 GB of environment in 32 MiB shards is 150 shards, 8 at a time: 19 rounds after the
    manifest's; the image's manifest, hot list and hot pack are 3, the checkpoint's files 1."""
    assert Production().rounds() == {"image_hot": 3, "env_snapshot": 20, "checkpoint": 1}


@pytest.mark.parametrize(("nodes", "waited"), [(1, 0.0), (2, 1.5), (16, 1.5)])
def test_a_swarm_fetch_waits_for_its_members_once_per_object_in_turn(
        nodes: int, waited: float) -> None:
    """Three objects fetched in turn, each waiting 0.5 s for its members: 1.5 s before the
    bytes move, at any N > 1; alone, a node waits for nobody."""
    fleet = Fleet(nodes, NIC, (Origin("hdfs", 4, 40 * MB, Placement(8 * MB, 1)),),
                  swarm_settle=0.5)
    phases = [Phase("ready", 0.0, Fetch("pack", SIZE, "hdfs", spread=4, peers=True,
                                         rounds=3))]
    assert simulate(fleet, phases).summary()["max_s"] == pytest.approx(SIZE / NIC + waited)

"""The fleet simulator's network on cases with known answers: one flow on one link, N
equal flows on one bottleneck, two bottlenecks in series, max-min shares, arrivals."""

from __future__ import annotations

import pytest
import simpy

from bootseer_dev.fleetsim import Link, Network

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


def test_a_restart_of_one_node_reproduces_the_start_it_was_calibrated_from() -> None:
    from bootseer_dev.fleetsim.restart import Fleet, Origin, Phase, simulate

    link = 50 * MB
    phases = [Phase.calibrated("image_ready", 5.0, 100 * MB, "hdfs", link),
              Phase.calibrated("env_ready", 3.0, 50 * MB, "hdfs", link),
              Phase.calibrated("ready", 1.0, 0, "hdfs", link)]
    assert [p.seconds for p in phases] == [pytest.approx(3.0), pytest.approx(2.0), 1.0]
    fleet = Fleet(1, nic_rate=link, origins=(Origin("hdfs", 1, 1000 * MB),))
    (times,) = simulate(fleet, phases).phases
    assert times == {"image_ready": pytest.approx(5.0), "env_ready": pytest.approx(8.0),
                     "ready": pytest.approx(9.0)}


@pytest.mark.parametrize("nodes", [1, 4, 64])
def test_nodes_share_one_origin_and_striped_reads_balance_many(nodes: int) -> None:
    from bootseer_dev.fleetsim.restart import Fleet, Origin, Phase, simulate

    one = Fleet(nodes, 1000 * MB, (Origin("registry", 1, 50 * MB),))
    outcome = simulate(one, [Phase("image_ready", 2.0, 10 * MB, "registry")])
    assert outcome.ready() == [pytest.approx(2.0 + nodes * 10 / 50)] * nodes
    many = Fleet(nodes, 1000 * MB, (Origin("hdfs", 4, 25 * MB),))
    outcome = simulate(many, [Phase("ready", 0.0, 100 * MB, "hdfs", spread=4)])
    assert outcome.summary()["max_s"] == pytest.approx(nodes * 100 / 100)
    assert outcome.summary()["origin_max_over_mean"] == pytest.approx(1.0)
    assert sum(outcome.served["hdfs"]) == pytest.approx(nodes * 100 * MB)

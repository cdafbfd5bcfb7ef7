"""The fixed and per-byte split of a step's CPU work (:mod:`bootseer_dev.fleetsim.costs`) on
known answers."""

from __future__ import annotations

import pytest
from support.fleet import synthetic_lab, with_costs

from bootseer_dev.fleetsim.costs import Cost, fit, step_costs
from bootseer_dev.fleetsim.production import Production, node_limit, priced

MB = 1e6


def test_a_line_through_two_sizes_is_its_fixed_and_per_byte_parts() -> None:
    cost = fit([(10 * MB, 3.0), (20 * MB, 5.0)])  # 1 core-second + 0.2 per MB
    assert cost.fixed == pytest.approx(1.0)
    assert cost.per_byte * MB == pytest.approx(0.2)
    assert cost.at(100 * MB) == pytest.approx(21.0)


def test_noisy_points_at_three_sizes_are_fitted_by_least_squares() -> None:
    # 2 + 0.1/MB, with +-0.1 of noise that sums to nothing
    cost = fit([(10 * MB, 3.1), (20 * MB, 3.8), (30 * MB, 5.1)])
    assert cost == Cost(pytest.approx(2.0), pytest.approx(0.1 / MB))


def test_no_part_is_negative() -> None:
    """Work that falls as bytes grow is noise around a fixed cost; a line that would
    cross zero above it is all per byte (through the origin)."""
    assert fit([(10 * MB, 2.1), (20 * MB, 1.9)]) == Cost(pytest.approx(2.0), 0.0)
    through = fit([(10 * MB, 1.0), (20 * MB, 3.0)])
    assert through.fixed == 0.0
    assert through.per_byte * MB == pytest.approx((10 * 1 + 20 * 3) / (100 + 400))


def test_a_step_that_grows_with_nothing_is_fixed_and_one_size_cannot_be_split() -> None:
    assert fit([(0.0, 0.5), (0.0, 0.7)]) == Cost(pytest.approx(0.6), 0.0)
    with pytest.raises(ValueError, match="two sizes"):
        fit([(10 * MB, 1.0), (10 * MB, 1.2)])


def test_each_steps_cost_is_fitted_from_the_lab_at_two_sizes() -> None:
    labs = [with_costs(synthetic_lab(counts=(1,)), scale) for scale in (1.0, 2.0)]
    costs = step_costs(labs, "bootseer_prestaged")
    assert set(costs) == {"env", "started", "imported", "checkpoint", "ready"}
    # the restore grows with the snapshot, the load with the checkpoint
    assert costs["env"] == Cost(pytest.approx(0.5), pytest.approx(0.1 / MB))
    assert costs["checkpoint"] == Cost(pytest.approx(0.5), pytest.approx(0.1 / MB))
    assert costs["imported"] == Cost(pytest.approx(0.5), 0.0)
    with pytest.raises(ValueError, match="two sizes"):
        step_costs(labs[:1], "bootseer_prestaged")


def test_production_prices_the_fixed_part_on_one_core_and_bytes_over_a_steps_cores() -> None:
    """0.5 core-seconds fixed and 0.1 a MB: pip's 1 GB of wheels on one core is 100.5 s,
    the prestaged checkpoint's 1 GB over 32 cores 0.5 + 100 / 32 s; a node's limit is its
    bytes over its NIC plus its fixed costs."""
    labs = [with_costs(synthetic_lab(counts=(1,)), scale) for scale in (1.0, 2.0)]
    prod = dict.fromkeys(labs[0]["per_node_bytes"], 1e9)
    baseline, _ = priced("baseline", step_costs(labs, "baseline"), labs[0], prod, 32.0)
    assert baseline["env"] == (pytest.approx(100.5), 0.0)
    assert baseline["imported"] == (pytest.approx(0.5), 0.0)
    prestaged = step_costs(labs, "bootseer_prestaged")
    own, _ = priced("bootseer_prestaged", prestaged, labs[0], prod, 32.0)
    assert own["checkpoint"] == (pytest.approx(0.5 + 100 / 32), 0.0)
    params = Production()
    p2p = step_costs(labs, "bootseer_p2p")
    fetched = 3e9  # the hot pack, the snapshot and the checkpoint part
    assert node_limit("bootseer_p2p", p2p, prod, params) == pytest.approx(
        fetched / (params.nic_gbit_s * 1e9 / 8) + 0.5 * len(p2p))

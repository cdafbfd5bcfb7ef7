"""Each step's CPU work on a node, split into a fixed part and a part per byte.

The lab at a fixed CPU budget per node (``bench-restart --node-cpu``) measures what every
node's cgroup spent in each phase of its start (``phases``: ``cpu_s``). One lab size says
how much work a step is, not how it grows: a container's start or an interpreter's
imports cost the same for any checkpoint, a restore's unpacking grows with the snapshot.
Runs at two artifact sizes or more (``bench-restart --artifact-scale``) tell the two apart:
a step's core-seconds against the bytes of the artifacts its work grows with
(:attr:`bootseer_dev.fleetsim.calibrate.Step.scales_with`), fitted by least squares
(:func:`fit`), give a :class:`Cost`. Production (:mod:`.production`) then prices each step
at its own bytes and cores instead of scaling the lab's seconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from .calibrate import CASES, Pacing, Step, lab_case, repeats, runs


@dataclass(frozen=True)
class Cost:
    """A step's CPU work: ``fixed`` core-seconds, plus ``per_byte`` core-seconds for each
    byte of the artifacts it grows with."""

    fixed: float
    per_byte: float

    def at(self, nbytes: float) -> float:
        return self.fixed + self.per_byte * nbytes


def fit(points: Sequence[tuple[float, float]]) -> Cost:
    """The least-squares line through (bytes, core-seconds) points, with neither part
    negative: work that shrinks as bytes grow is measurement noise around a fixed cost
    (the mean), and a negative fixed part is refitted through the origin (all per byte).
    A step that grows with no bytes (0 at every size) is all fixed; points at one size
    of some bytes cannot be split: ValueError."""
    sizes = {nbytes for nbytes, _ in points}
    if sizes == {0.0}:
        return Cost(statistics.fmean(c for _, c in points), 0.0)
    if len(sizes) < 2:
        raise ValueError("a fixed and a per-byte part need runs at two sizes at least")
    mean_b = statistics.fmean(b for b, _ in points)
    mean_c = statistics.fmean(c for _, c in points)
    slope = (sum((b - mean_b) * (c - mean_c) for b, c in points)
             / sum((b - mean_b) ** 2 for b, _ in points))
    if slope <= 0:
        return Cost(mean_c, 0.0)
    if mean_c - slope * mean_b < 0:
        return Cost(0.0, sum(b * c for b, c in points) / sum(b * b for b, _ in points))
    return Cost(mean_c - slope * mean_b, slope)


def intervals(lab: dict, case: str) -> list[tuple[Step, ...]]:
    """``case``'s steps as the lab ran it, grouped by the mark that ends them: each marked
    step with the unmarked ones before it (the lab measures them as one phase)."""
    out: list[tuple[Step, ...]] = []
    pending: list[Step] = []
    for step in lab_case(lab, case).steps:
        pending.append(step)
        if step.mark:
            out.append(tuple(pending))
            pending = []
    return out


def grows_with(interval: Sequence[Step]) -> set[str]:
    """The artifacts an interval's work grows with."""
    return {a for step in interval for a in step.scales_with}


def interval_bytes(lab: dict, case: str) -> dict[str, float]:
    """Per marked step of ``case`` but the teardown: the bytes of the artifacts its
    interval's work grows with."""
    nbytes = lab["per_node_bytes"]
    return {steps[-1].name: sum(nbytes[a] or 0.0 for a in grows_with(steps))
            for steps in intervals(lab, case) if not steps[-1].teardown}


def step_costs(labs: Sequence[dict], case: str) -> dict[str, Cost]:
    """Each marked step's :class:`Cost` in ``case``, fitted on the N = 1 runs of ``labs``
    (the same lab at different artifact sizes): its node's cgroup CPU in that phase
    against :func:`interval_bytes`."""
    points: dict[str, list[tuple[float, float]]] = {}
    for lab in labs:
        run = runs(lab, case).get(1)
        if not run or not run["nodes"]:
            continue
        nodes = [node for node in repeats(run) if "phases" in node]
        for step, nbytes in interval_bytes(lab, case).items():
            if nodes and all(step in node["phases"] for node in nodes):
                cpu = statistics.median(node["phases"][step]["cpu_s"] for node in nodes)
                points.setdefault(step, []).append((nbytes, cpu))
    return {step: fit(found) for step, found in points.items()}


def paced(case: str, interval: Sequence[Step]) -> bool:
    """Whether an interval's per-byte work runs beside its bytes (``Phase.paced``): it has
    one fetch of its own (not the warm's), on its first step. An interval that fetches
    several artifacts in turn (the p2p staging: hot pack, snapshot, checkpoint) does its
    work before them: which of its bytes a part of it waits for, the lab does not say."""
    warm = CASES[case].warm
    return [s for s in interval if s.artifact and s.artifact not in warm] == [interval[0]]


def pacing(labs: Sequence[dict], case: str) -> Pacing:
    """Of each :func:`paced` interval of ``case``, on its first step, the share of its CPU
    work that is per byte (:func:`step_costs` at the first lab's sizes)."""
    costs, nbytes, lab = step_costs(labs, case), interval_bytes(labs[0], case), labs[0]
    out: Pacing = {}
    for steps in intervals(lab, case):
        cost = costs.get(steps[-1].name)
        if cost is None or not paced(case, steps):
            continue
        work = cost.at(nbytes.get(steps[-1].name, 0.0))
        if work > 0:
            out[steps[0].name] = cost.per_byte * nbytes[steps[-1].name] / work
    return out

"""A flow-level simulator of a fleet restart (issue #16), calibrated from the lab.

:mod:`.network` moves bytes over links shared max-min fairly, on SimPy's event loop;
:mod:`.placement` says which uplinks a node's bytes leave from (HDFS blocks on DataNodes),
:mod:`.peers` which of the job's other nodes' uplinks when they share them (a swarm);
:mod:`.restart` runs a start (and a warm beside it) on N nodes over it; :mod:`.calibrate`
fits each case's own seconds to the lab's N = 1 runs and checks N > 1 against the lab;
:mod:`.production` extrapolates to a stated production fleet. :func:`report` does all
three for ``bench-restart`` (docs/SIMULATOR.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .calibrate import validate
from .network import Flow, Link, Network
from .placement import Placement
from .production import Production, extrapolate, plot

__all__ = ["Flow", "Link", "Network", "Placement", "Production", "extrapolate", "plot",
           "report", "validate"]


def report(lab: dict, png: Path, params: Production | None = None,
           sizes: Sequence[dict] = ()) -> dict:
    """The simulator's part of ``bench-results/restart.json``, from its ``lab`` section
    and the same lab at other artifact sizes (``sizes``: their N = 1 runs): the validation
    against the lab, the extrapolation to ``params`` (default: the stated production
    assumptions), their headline figures, and the plot written to ``png``."""
    validation = validate(lab, sizes)
    extrapolation = extrapolate(lab, params or Production(), sizes)
    return {"validation": validation, "extrapolation": extrapolation,
            "sim_max_validation_error": validation["max_error"],
            "sim_bootseer_vs_baseline_n1000": extrapolation["bootseer_vs_baseline_n1000"],
            "sim_p2p_ready_n1000_over_n1": extrapolation["p2p_ready_n1000_over_n1"],
            "sim_p2p_ready_n1000_s": extrapolation["p2p_ready_n1000_s"],
            "node_limit_n1000_s": extrapolation["node_limit_n1000_s"],
            "png": str(plot(extrapolation, Path(png)))}

"""`python -m bootseer_dev.fleetsim REPORT.json --png out.png`: the simulator's report on a
``bench-restart`` result (its ``lab`` section), as tables."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import report


@click.command()
@click.argument("result", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--png", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Where to write the extrapolation's plot.")
@click.option("--fit-with", "fit_with", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A bench-restart result of the same lab at another artifact size.")
def main(result: Path, png: Path, fit_with: tuple[Path, ...]) -> None:
    """Validate the simulator against RESULT's lab runs and extrapolate it to production."""
    lab = json.loads(result.read_text()).get("lab")
    if not lab:
        sys.exit(f"{result} has no 'lab' section")
    out = report(lab, png, sizes=[json.loads(path.read_text())["lab"] for path in fit_with])
    validation, extrapolation = out["validation"], out["extrapolation"]
    click.echo("validation: the lab's fleet simulated, against the lab (time to ready, s)")
    placement = validation["placement"]
    click.echo(f"HDFS: {placement['block_size'] / 2**20:g} MiB blocks, replication "
               f"{placement['replication']}, fan-out one replica per "
               f"{placement['readers_per_replica']} readers up to {placement['max_replicas']}; "
               f"seed {placement['seed']} (DN max/mean: lab, sim, sim over "
               f"{placement['seeds']} seeds min-median-max)")
    click.echo(f"{'case':20} {'N':>4} {'lab p50':>8} {'sim p50':>8} {'err':>6} "
               f"{'lab max':>8} {'sim max':>8} {'err':>6} {'DN lab':>6} {'DN sim':>6} "
               f"{'DN seeds':>14}  limited by")
    for r in validation["rows"]:
        seeds = r["sim_datanode_max_over_mean_seeds"]
        click.echo(f"{r['case']:20} {r['nodes']:>4} {r['lab_p50_s']:>8.2f} "
                   f"{r['sim_p50_s']:>8.2f} {r['error_p50']:>6.1%} {r['lab_max_s']:>8.2f} "
                   f"{r['sim_max_s']:>8.2f} {r['error_max']:>6.1%} "
                   f"{_ratio(r['lab_datanode_max_over_mean'])} "
                   f"{_ratio(r['sim_datanode_max_over_mean'])} "
                   f"{_spread(seeds):>14}  {r['sim_limited_by']}"
                   + ("  (calibration)" if r["calibration_run"] else ""))
    click.echo("cores a node's task keeps busy (N = 1 core-seconds / own seconds): " + ", ".join(
        f"{case} {c['cores']:.2f}" for case, c in validation["calibration"].items()))
    error = validation["max_error"]
    click.echo(f"max error: {'n/a' if error is None else f'{error:.1%}'}. "
               f"{validation['note']}")
    for warning in validation["warnings"] + extrapolation["warnings"]:
        click.echo(f"warning: {warning}")
    click.echo("\nextrapolation (assumed production fleet; every parameter an assumption):")
    click.echo("  " + ", ".join(f"{k}={v}" for k, v in extrapolation["parameters"].items()
                                if k != "per_node_bytes"))
    click.echo("  per node: " + ", ".join(
        f"{k} {v / 1e9:.2f} GB" for k, v in extrapolation["parameters"]["per_node_bytes"].items()))
    click.echo(f"  own seconds: {extrapolation['rules']['own_seconds']}")
    click.echo(f"  node limit: {extrapolation['rules']['node_limit']}")
    click.echo(f"  placement: {extrapolation['rules']['placement']}")
    click.echo(f"{'case':20} {'N':>5} {'p50 s':>9} {'p99 s':>9} {'max s':>9} {'repl':>4} "
               f"{'DN max/mean':>11} {'origin GB':>10} {'peer GB':>9}  limited by")
    for case, data in extrapolation["cases"].items():
        for r in data["runs"]:
            click.echo(f"{case:20} {r['nodes']:>5} {r['p50_s']:>9.1f} {r['p99_s']:>9.1f} "
                       f"{r['max_s']:>9.1f} {r['replication']:>4} "
                       f"{_ratio(r['datanode_max_over_mean']):>11} "
                       f"{sum(r['served_bytes'].values()) / 1e9:>10.1f} "
                       f"{r['peer_bytes'] / 1e9:>9.1f}  {r['limited_by']}")
    for case, data in extrapolation["cases"].items():
        click.echo(f"{case}: a node's limit {data['node_limit_s']:.1f} s; costs (fixed core-s, "
                   "per-byte core-s/GB): " + ", ".join(
                       f"{step} {c['fixed']:.2f} + {c['per_byte'] * 1e9:.2f}"
                       for step, c in data["costs"].items()))
    ratio, p2p = out["sim_bootseer_vs_baseline_n1000"], out["sim_p2p_ready_n1000_over_n1"]
    click.echo(f"bootseer / baseline at 1,000 nodes: {'n/a' if ratio is None else f'{ratio:.3f}'}"
               f"; bootseer_p2p at 1,000 nodes / 1: {'n/a' if p2p is None else f'{p2p:.3f}'}"
               f"   (simulated in {extrapolation['runtime_s']:.1f} s; plot: {out['png']})")


def _ratio(value: float | None) -> str:
    return "-".rjust(6) if value is None else f"{value:>6.2f}"


def _spread(seeds: dict | None) -> str:
    return "-" if seeds is None else f"{seeds['min']:.2f}-{seeds['median']:.2f}-{seeds['max']:.2f}"


if __name__ == "__main__":
    main()

"""``bootseer report``: where startup time went, per phase, for this node's recent starts.

Reads the node's timeline (:mod:`bootseer.agents.timeline`) through the agent when one answers,
else from the timeline file itself. A table for people, ``--json`` for scripts,
``--png FILE`` for a chart (needs matplotlib: ``pip install 'bootseer[report]'``).
"""

from __future__ import annotations

import json
import re
import statistics
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from bootseer.cli import AppContext, pass_app
from bootseer.errors import BootseerError
from bootseer.progress import console

if TYPE_CHECKING:
    from bootseer.agents.timeline import StartRecord

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: float | None = None) -> float:
    """``30m``, ``6h``, ``2d`` (ago) or an ISO date/time -> Unix seconds."""
    now = time.time() if now is None else now
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2)]
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise click.BadParameter(f"{text!r}: give a duration ago (30m, 6h, 2d) or an ISO "
                                 f"date/time (2026-11-21T09:00)") from None


@click.command()
@click.option("--since", default="24h", show_default=True,
              help="Starts since this long ago (30m, 6h, 2d) or this ISO date/time.")
@click.option("--json", "as_json", is_flag=True, help="Print the starts as JSON.")
@click.option("--png", "png", type=click.Path(dir_okay=False, path_type=Path),
              help="Also draw the breakdown as a chart into this PNG file.")
@click.option("--job", help="The whole job instead of this node: every node's latest start "
                            "of JOB, as the nodes' agents published them to the store.")
@pass_app
def report(app: AppContext, since: str, as_json: bool, png: Path | None,
           job: str | None) -> None:
    """Startup time per phase (image, environment, checkpoint, ready) of recent starts."""
    if job is not None:
        _report_job(app, job, as_json, png)
        return
    starts = _load(app, parse_since(since))
    if as_json:
        click.echo(json.dumps([s.to_json() for s in starts], indent=2))
    elif not starts:
        console.print(f"no starts recorded since {since} on this node")
    else:
        out = Console()  # the report is the result: stdout, wide enough when piped
        if not out.is_terminal:
            out = Console(width=160)
        out.print(breakdown_table(starts))
    if png is not None:
        draw(starts, png)
        console.print(f"chart written to {png}")


def _report_job(app: AppContext, job: str, as_json: bool, png: Path | None) -> None:
    """A job's latest restart across its nodes: who held it back, and in which phase."""
    from bootseer.agents import jobreport

    try:
        starts = jobreport.load(app.store, job)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--job") from None
    if not starts:
        raise BootseerError(f"no node has published a start of job {job} to "
                            f"{app.loaded.config.store} (node agents publish the starts of "
                            f"containers labelled io.bootseer.job={job})")
    summary = jobreport.summarize(job, starts)
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=2))
    else:
        Console(width=160).print(job_table(summary))
    if png is not None:
        restart = jobreport.latest_restart(starts)
        draw([item.start for item in restart], png, [item.node for item in restart])
        console.print(f"chart written to {png}")


def job_table(summary) -> Table:  # jobreport.JobSummary
    table = Table(title=f"job {summary.job}: {summary.nodes} nodes, latest restart "
                        f"(seconds from the phase before)")
    for name in ("", "p50", "p99", "max"):
        table.add_column(name, justify="right" if name else "left")
    rows = [(title, summary.phases.get(phase)) for phase, title in COLUMNS]
    rows.append(("exited", summary.phases.get("exited")))
    for title, spread in rows:
        if spread is not None:
            table.add_row(title, _seconds(spread.p50), _seconds(spread.p99),
                          _seconds(spread.max))
    if summary.startup is not None:
        table.add_section()
        table.add_row("startup", _seconds(summary.startup.p50), _seconds(summary.startup.p99),
                      _seconds(summary.startup.max), style="bold")
    table.add_section()
    for laggard in summary.slowest:
        title = dict(COLUMNS).get(laggard.slowest_phase, laggard.slowest_phase)
        table.add_row(f"slow: {laggard.node}", "", "", _seconds(laggard.seconds))
        table.add_row(f"  most in {title}", "", "", _seconds(laggard.phase_seconds))
    return table


def _load(app: AppContext, since: float) -> list[StartRecord]:
    from bootseer.agents.client import answering_agent
    from bootseer.agents.timeline import Timeline, timeline_path

    cfg = app.loaded.config
    with answering_agent(cfg.agent.socket) as agent:
        if agent is not None:
            return agent.starts(since)
    # No agent (or a dead one's socket): the file has everything it recorded.
    path = timeline_path(cfg)
    if not path.exists():
        return []
    timeline = Timeline(path)
    try:
        return timeline.starts(since)
    finally:
        timeline.close()


#: The columns of the breakdown: the time from the phase before to this one.
COLUMNS = (("image_ready", "rootfs"), ("env_ready", "environment"),
           ("checkpoint_first_byte", "checkpoint"), ("ready", "to ready"))


def breakdown_table(starts: list[StartRecord]) -> Table:
    table = Table(title="startup by phase (seconds from the phase before)")
    for name in ("started", "image", "workload", "runtime", "pod"):
        table.add_column(name)
    for _, title in COLUMNS:
        table.add_column(title, justify="right")
    table.add_column("startup", justify="right", style="bold")
    for s in starts:
        parts = s.breakdown()
        when = time.strftime("%m-%d %H:%M:%S", time.localtime(min(s.phases.values(),
                                                                   default=0)))
        table.add_row(when, s.image or "-", s.workload or "-", s.runtime or "-",
                      s.pod or "-", *[_seconds(parts.get(phase)) for phase, _ in COLUMNS],
                      _seconds(s.startup_seconds))
    if len(starts) > 1:
        medians = []
        for phase, _ in COLUMNS:
            values = [v for s in starts if (v := s.breakdown().get(phase)) is not None]
            medians.append(_seconds(statistics.median(values)) if values else "-")
        totals = [s.startup_seconds for s in starts if s.startup_seconds is not None]
        table.add_section()
        table.add_row(f"median of {len(starts)}", "", "", "", "", *medians,
                      _seconds(statistics.median(totals)) if totals else "-")
    return table


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def draw(starts: list[StartRecord], path: Path, labels: list[str] | None = None) -> None:
    """Stacked horizontal bars, one per start, one colour per phase; each labelled with
    its image and time, or with ``labels`` (a job's node names)."""
    try:
        import matplotlib
    except ImportError:
        raise BootseerError("--png needs matplotlib: pip install 'bootseer[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * max(1, len(starts))))
    names, shown = labels or [], set()
    labels = []
    for row, s in enumerate(starts):
        parts, left = s.breakdown(), 0.0
        for number, (phase, title) in enumerate(COLUMNS):
            width = parts.get(phase)
            if width is None:
                continue
            ax.barh(row, width, left=left, color=f"C{number}",
                    label=None if title in shown else title)
            shown.add(title)
            left += width
        began = time.localtime(min(s.phases.values(), default=0))
        labels.append(names[row] if names else
                      f"{s.image or '?'} {time.strftime('%H:%M:%S', began)}")
    ax.set_yticks(range(len(starts)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the container was created")
    ax.set_title("Bootseer: startup by phase")
    if shown:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

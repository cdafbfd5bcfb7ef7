"""What every benchmark shares: cold reads and how a figure is reported."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any


def drop_page_cache() -> None:
    """Write dirty pages back and drop the page cache, so the next read comes from disk."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat: two readings around a
    run give its CPU busy fraction (near 1.0: the run was bound by CPU, not by the link)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The machine's CPU busy fraction between two :func:`cpu_times` readings."""
    return (after[0] - before[0]) / max(1, after[1] - before[1])


def figure(runs: list[float], digits: int = 3) -> dict[str, Any]:
    """A reported figure: the median and the raw runs it comes from."""
    return {"median": round(statistics.median(runs), digits),
            "runs": [round(r, digits) for r in runs]}


class RunFailed(RuntimeError):
    """A measured run did not do what it was supposed to: the figures would be wrong."""


def median_of(values: list[Any]) -> Any:
    """The median of the values that are there (None where a run did not report one)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def select_cases(spec: str, known: tuple[str, ...]) -> list[str]:
    """``--cases a,b``: the named subset, or a clear exit for an unknown name."""
    cases = [c.strip() for c in spec.split(",") if c.strip()]
    unknown = set(cases) - set(known)
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; known: {', '.join(known)}")
    return cases

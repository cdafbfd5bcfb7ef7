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


def figure(runs: list[float], digits: int = 3) -> dict[str, Any]:
    """A reported figure: the median and the raw runs it comes from."""
    return {"median": round(statistics.median(runs), digits),
            "runs": [round(r, digits) for r in runs]}

"""Progress bars for long work, uv-style: shown on a terminal, silent everywhere else."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

#: Messages and progress go to stderr; stdout carries results (digests, JSON) only.
console = Console(stderr=True, highlight=False, soft_wrap=True)  # errors stay one line


@contextmanager
def byte_progress(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Yield an ``advance(n_bytes)`` callback drawing a transfer bar while the block runs."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    with progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)

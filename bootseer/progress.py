"""Progress bars for long work, uv-style: shown on a terminal, silent everywhere else."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

#: Messages and progress go to stderr; stdout carries results (digests, JSON) only.
console = Console(stderr=True, highlight=False, soft_wrap=True)  # errors stay one line


class Advance:
    """``advance(n_bytes)``; ``advance.add_total(n)`` when the total is learnt later."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress, self._task = progress, task
        self._total = 0

    def __call__(self, n: int) -> None:
        self._progress.advance(self._task, n)

    def add_total(self, more: int) -> None:
        """Grow the total (work whose size is learnt in parts)."""
        self._total += more
        self._progress.update(self._task, total=self._total)


@contextmanager
def byte_progress(description: str, total: int | None) -> Iterator[Advance]:
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
        yield Advance(progress, task)

"""Progress bars for long work, uv-style: shown on a terminal, silent everywhere else."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

#: Messages and progress go to stderr; stdout carries results (digests, JSON) only.
console = Console(stderr=True, highlight=False, soft_wrap=True)  # errors stay one line


class Advance:
    """``advance(n_bytes)``; ``advance.add_total(n)`` when the total is learnt later. With
    no bar (``progress`` None: not a terminal) it does nothing."""

    def __init__(self, progress: Progress | None, task: TaskID | None) -> None:
        self._progress, self._task = progress, task
        self._total = 0

    def __call__(self, n: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)  # type: ignore[arg-type]

    def add_total(self, more: int) -> None:
        """Grow the total (work whose size is learnt in parts)."""
        self._total += more
        if self._progress is not None:
            self._progress.update(self._task, total=self._total)  # type: ignore[arg-type]


@contextmanager
def byte_progress(description: str, total: int | None) -> Iterator[Advance]:
    """Yield an ``advance(n_bytes)`` callback drawing a transfer bar while the block runs
    (on a terminal; elsewhere it draws nothing)."""
    if not console.is_terminal:
        yield Advance(None, None)
        return
    # Imported here: rich.progress costs every CLI start ~30 ms, and only a terminal
    # draws a bar.
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    with progress:
        task = progress.add_task(description, total=total)
        yield Advance(progress, task)

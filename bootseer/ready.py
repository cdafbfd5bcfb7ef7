"""The workload's side of a recording: say "the start is over".

A container started by Bootseer while its start is being recorded gets the environment
variable ``BOOTSEER_READY_FILE``: a path on a small directory shared with the host. The
workload creates that file when it is up (its first training step, its server listening),
with ``bootseer.mark_ready()``, ``bootseer ready`` or plain ``touch "$BOOTSEER_READY_FILE"``
in an image without Bootseer. The recorder ends the recording when the file appears, so
the hot list holds what the start read, not what the job read afterwards.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

READY_FILE_ENV = "BOOTSEER_READY_FILE"


def ready_file() -> Path | None:
    """Where to signal readiness, or None when nothing is recording this start."""
    value = os.environ.get(READY_FILE_ENV)
    return Path(value) if value else None


def mark_ready() -> bool:
    """Tell Bootseer this start is over; False (and nothing done) outside a recorded start.

    Safe to call more than once and from any process of the workload.
    """
    path = ready_file()
    if path is None:
        log.debug("%s is not set: no recording to end", READY_FILE_ENV)
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(f"{os.getpid()}\n")
    os.replace(tmp, path)  # appears whole: a watcher never sees it half written
    return True

"""The workload's side of a recording: say "the start is over".

A container started by Bootseer while its start is being recorded gets the environment
variable ``BOOTSEER_READY_FILE``: a path on a small directory shared with the host. The
workload creates that file when it is up (its first training step, its server listening),
with ``bootseer.mark_ready()``, ``bootseer ready`` or plain ``touch "$BOOTSEER_READY_FILE"``
in an image without Bootseer. The recorder ends the recording when the file appears, so
the hot list holds what the start read, not what the job read afterwards.

The same directory carries the start's other milestones for its timeline (``bootseer
report``): :func:`mark_phase` leaves a ``phase.<name>`` file holding the time the phase
was reached (``bootseer env run`` marks ``env_ready``, the checkpoint API
``checkpoint_first_byte``); the host reads them when the container stops. The first mark
of a phase stays.
"""

from __future__ import annotations

import logging
import os
import time
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
    mark_phase("ready")
    return True


def phase_file(directory: Path, phase: str) -> Path:
    return directory / f"phase.{phase}"


_marked: set[str] = set()  # phases this process marked already: later calls are free


def mark_phase(phase: str) -> bool:
    """Note that this start reached ``phase`` now; False (nothing done) outside a Bootseer
    start. Only the first mark of a phase counts; later ones are ignored. Cheap enough to
    call on every read of a checkpoint."""
    if phase in _marked:
        return True
    path = ready_file()
    if path is None:
        return False
    _marked.add(phase)
    final = phase_file(path.parent, phase)
    if final.exists():
        return True
    tmp = path.with_name(f".phase.{phase}.{os.getpid()}")
    try:
        tmp.write_text(f"{time.time():.6f}\n")
        os.link(tmp, final)  # create-only, whole: the first mark stays
    except FileExistsError:
        pass
    except OSError as exc:  # a read-only or vanished directory must not fail the job
        log.debug("could not mark phase %s: %s", phase, exc)
    finally:
        tmp.unlink(missing_ok=True)
    return True


def read_phases(directory: Path) -> dict[str, float]:
    """The phases marked in ``directory`` (the host's side), with their times; the ready
    file's own mtime stands for ``ready`` when only the file was touched."""
    phases: dict[str, float] = {}
    for entry in directory.glob("phase.*"):
        try:
            phases[entry.name.removeprefix("phase.")] = float(entry.read_text().strip())
        except (OSError, ValueError):
            log.warning("ignoring the unreadable phase mark %s", entry)
    ready = directory / "ready"
    if "ready" not in phases and ready.exists():
        phases["ready"] = ready.stat().st_mtime
    return phases

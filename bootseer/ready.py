"""The workload's side of a recording: say "the start is over".

A container started by Bootseer while its start is being recorded gets the environment
variable ``BOOTSEER_READY_FILE``: a path on a small directory shared with the host. The
workload creates that file when it is up (its first training step, its server listening),
with ``bootseer.mark_ready()``, ``bootseer ready`` or plain ``touch "$BOOTSEER_READY_FILE"``
in an image without Bootseer. The recorder ends the recording when the file appears, so
the hot list holds what the start read, not what the job read afterwards.

The same directory carries the start's other milestones for its timeline (``bootseer
report``): :func:`mark_phase` leaves a ``phase.<name>`` file holding the time the phase
was reached (``bootseer env run`` marks ``env_ready``, the checkpoint API registers
:class:`CheckpointMilestones` with its readers for ``checkpoint_first_byte``); the host
reads them when the container stops. The first mark of a phase stays.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path

log = logging.getLogger(__name__)

READY_FILE_ENV = "BOOTSEER_READY_FILE"
#: Where a container finds its signal directory (the ready file, phase marks).
SIGNAL_DIR = "/run/bootseer"


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


class CheckpointMilestones:
    """The start's timeline as a checkpoint readers' observer
    (:class:`bootseer.stripedfs.observer.ReadObserver`): the first bytes any reader hands
    the job mark ``checkpoint_first_byte``."""

    def first_byte(self, name: str) -> None:
        mark_phase("checkpoint_first_byte")


#: What the host reads of a signal directory at most: the directory is the container's
#: to write, so its entries and their sizes are bounded (a phase mark is a time: 20 bytes).
MAX_SIGNAL_ENTRIES = 256
MAX_MARK_BYTES = 64


def read_phases(directory: Path) -> dict[str, float]:
    """The phases marked in ``directory`` (the host's side), with their times; the ready
    file's own mtime stands for ``ready`` when only the file was touched.

    The directory is written by the container, so nothing in it is trusted: entries are
    opened relative to the directory, without following symlinks and without blocking
    (a FIFO), only regular files count, at most :data:`MAX_MARK_BYTES` of each and
    :data:`MAX_SIGNAL_ENTRIES` entries are read. What does not pass is ignored.
    """
    phases: dict[str, float] = {}
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW |
                         os.O_CLOEXEC)
    except OSError as exc:
        log.warning("cannot read the signal directory %s: %s", directory, exc)
        return phases
    try:
        with os.scandir(dir_fd) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_SIGNAL_ENTRIES:
                    log.warning("%s holds more than %d entries; reading no further",
                                directory, MAX_SIGNAL_ENTRIES)
                    break
                if entry.name.startswith("phase."):
                    text = read_small_file(dir_fd, entry.name, MAX_MARK_BYTES)
                    try:
                        phases[entry.name.removeprefix("phase.")] = float(text or "")
                    except ValueError:
                        log.warning("ignoring the phase mark %s/%s", directory, entry.name)
        if "ready" not in phases:
            try:
                st = os.stat("ready", dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                pass
            else:
                if stat.S_ISREG(st.st_mode):
                    phases["ready"] = st.st_mtime
    finally:
        os.close(dir_fd)
    return phases


def read_small_file(dir_fd: int, name: str, limit: int) -> str | None:
    """At most ``limit`` bytes of the regular file ``name`` in the directory ``dir_fd``,
    as text; None if it is anything else (a symlink, a FIFO, a device), or unreadable.
    Never blocks: ``O_NONBLOCK`` makes opening a FIFO return at once, and it is then
    refused as not a regular file."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)

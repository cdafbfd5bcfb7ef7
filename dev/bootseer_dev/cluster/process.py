"""Start, recognise and stop the cluster's Java processes, by PID recorded in the state dir.

Stopping must hit exactly what we started, never a recycled PID and never someone else's
cluster: each JVM carries a marker system property naming its state dir and role, and we
check that marker in /proc/PID/cmdline (and the process start time) before signalling.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["ProcessRecord", "launch", "is_alive_and_ours", "why_not_running", "terminate",
           "log_tail", "load_record", "marker_for"]

log = logging.getLogger(__name__)


def marker_for(state_dir: Path, role: str) -> str:
    """The -D option that tags a JVM as `role` of the cluster in `state_dir`."""
    return f"-Dbootseer_dev.cluster={state_dir}#{role}"


def _proc_starttime(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may contain spaces; fields after the closing paren are space-separated.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@dataclass
class ProcessRecord:
    """What we know about one started JVM; saved as pids/<role>.json."""

    role: str
    pid: int
    starttime: int
    marker: str
    log: str

    def save(self, pid_dir: Path) -> Path:
        pid_dir.mkdir(parents=True, exist_ok=True)
        path = pid_dir / f"{self.role}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)
        return path


def load_record(path: Path) -> ProcessRecord | None:
    try:
        return ProcessRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def launch(role: str, argv: list[str], log_path: Path, marker: str,
           env: dict[str, str] | None = None) -> ProcessRecord:
    """Start argv in its own session (own process group) with stdout+stderr to log_path.

    Own session: Ctrl-C in the shell that ran `start` must not take the cluster down, and
    the cluster must survive the CLI process exiting.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=env, close_fds=True)
    start = _proc_starttime(proc.pid) or 0
    # Popen objects reap their child on GC; detach so the JVM outlives this handle cleanly.
    proc.returncode = 0  # tell Popen.__del__ there is nothing to warn about
    log.debug("started %s pid=%d log=%s", role, proc.pid, log_path)
    return ProcessRecord(role=role, pid=proc.pid, starttime=start, marker=marker,
                         log=str(log_path))


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our child (it is, when started in-process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def why_not_running(rec: ProcessRecord) -> str | None:
    """None if rec.pid is running and still is the JVM we started, else the reason."""
    _reap(rec.pid)
    state = _proc_state(rec.pid)
    if state in (None, "Z", "X"):
        return f"pid {rec.pid} has exited" if state else f"pid {rec.pid} does not exist"
    start = _proc_starttime(rec.pid)
    if rec.starttime and start != rec.starttime:
        return f"pid {rec.pid} was recycled (start time {start} != {rec.starttime})"
    # cmdline reads back empty while the process is between exec()s (the java launcher
    # re-execs itself) or exiting; give it a moment rather than call it a stranger.
    cmdline: list[bytes] = []
    for _ in range(50):
        try:
            cmdline = Path(f"/proc/{rec.pid}/cmdline").read_bytes().split(b"\0")
        except OSError as exc:
            return f"cannot read /proc/{rec.pid}/cmdline: {exc}"
        if cmdline != [b""]:
            break
        time.sleep(0.01)
    if rec.marker.encode() not in cmdline:
        return f"pid {rec.pid} is not ours (no {rec.marker} in {cmdline[:8]})"
    return None


def is_alive_and_ours(rec: ProcessRecord) -> bool:
    """True if rec.pid is running and still is the JVM we started (not a recycled PID)."""
    return why_not_running(rec) is None


def terminate(rec: ProcessRecord, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> bool:
    """Signal the process if it is ours; escalate to SIGKILL after timeout_s. True if it was
    running. SIGKILL (sig=9) is what fault tests use to emulate a crashed DataNode."""
    if not is_alive_and_ours(rec):
        return False
    log.info("stopping %s (pid %d) with %s", rec.role, rec.pid, signal.Signals(sig).name)
    try:
        os.kill(rec.pid, sig)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_alive_and_ours(rec):
            return True
        time.sleep(0.05)
    log.warning("%s (pid %d) ignored %s for %.0fs, sending SIGKILL", rec.role, rec.pid,
                signal.Signals(sig).name, timeout_s)
    try:
        os.kill(rec.pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    for _ in range(100):
        if not is_alive_and_ours(rec):
            break
        time.sleep(0.05)
    return True


def log_tail(path: Path | str, lines: int = 40) -> str:
    """The last lines of a log, for error messages that say *why* a start failed."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])

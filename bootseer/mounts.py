"""FUSE mounts served by a child process: start one, wait for it, tell if it is there, end it.

The FUSE server runs in a process of its own, started before it opens any store (so a
JVM is never forked) and detached from the terminal; the caller returns once the kernel
shows the mount. Liveness comes from ``/proc/mounts``, because ``os.path.ismount`` says
False for a mount whose server died (the stat fails with ENOTCONN).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from bootseer.errors import BootseerError

log = logging.getLogger(__name__)


def is_mounted(mountpoint: Path) -> bool:
    target = str(Path(mountpoint).absolute())
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)


def server_log(directory: Path, what: str) -> Path:
    """A new log file for a server, in ``directory`` (made 0700 if new): never a name in a
    shared directory such as ``/tmp``, where another user could have put a symlink."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"{what}-{os.getpid()}-{secrets.token_hex(4)}.log"
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    return path


def spawn_mount(args: list[str], mountpoint: Path, what: str, timeout: float,
                log_path: Path) -> int:
    """Run ``args`` (a foreground FUSE server) detached, its output appended to
    ``log_path``; return its PID once mounted."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW |
                 os.O_CLOEXEC, 0o600)
    with open(fd, "ab") as log_file:
        child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log_file,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not is_mounted(mountpoint):
        if child.poll() is not None:
            raise BootseerError(f"the mount of {what} failed: "
                                f"{log_path.read_text(errors='replace').strip()[-800:]}")
        if time.monotonic() > deadline:
            child.terminate()
            raise BootseerError(f"{what} was not mounted within {timeout:.0f}s (log: {log_path})")
        time.sleep(0.01)
    return child.pid


def wait_for_file(path: Path, pid: int, timeout: float) -> None:
    """Wait for a server started by :func:`spawn_mount` to write ``path`` after its unmount
    (its last work, such as storing a recording, comes before); not for the process to exit,
    which for a JVM-hosting process can take a while longer."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child: watch /proc instead
            done = 0 if Path(f"/proc/{pid}").exists() else pid
        if done and not path.exists():
            raise BootseerError(f"the mount server (pid {pid}) exited without writing {path}")
        if time.monotonic() > deadline:
            raise BootseerError(f"the mount server (pid {pid}) did not write {path} within "
                                f"{timeout:.0f}s")
        time.sleep(0.01)


def check_mountpoint(mountpoint: Path) -> None:
    if is_mounted(mountpoint):
        raise BootseerError(f"{mountpoint} is already a mount point (unmount it first)")
    if not mountpoint.is_dir():
        raise BootseerError(f"mount point {mountpoint} is not a directory (mkdir it first)")


def unmount(mountpoint: Path, *, attempts: int = 10) -> None:
    """Unmount a FUSE or overlay mount (also one whose FUSE server died).

    A mount that is busy for a moment (a container's last process exiting) is retried;
    one that stays busy is detached lazily. Unmounting something not mounted is a no-op.
    """
    if not is_mounted(mountpoint):
        return
    # A user's FUSE mount is theirs to unmount only through the setuid fusermount3.
    fusermount = shutil.which("fusermount3") or shutil.which("fusermount")
    command = ["umount", str(mountpoint)]
    if os.geteuid() != 0 and fusermount:
        command = [fusermount, "-u", str(mountpoint)]
    error = ""
    for attempt in range(attempts):
        result = subprocess.run(command, capture_output=True, text=True,
                                stdin=subprocess.DEVNULL)
        if result.returncode == 0 or not is_mounted(mountpoint):
            return
        error = result.stderr.strip()
        time.sleep(0.05 * (attempt + 1))
    log.warning("unmounting %s: %s; detaching it lazily", mountpoint, error)
    result = subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, text=True,
                            stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise BootseerError(f"could not unmount {mountpoint}: {result.stderr.strip()}")

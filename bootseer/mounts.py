"""FUSE mounts served by a child process: tell if one is there, wait for its server, end it.

A server is started by :func:`bootseer.serve.spawn_server`. Liveness comes from
``/proc/mounts``, because ``os.path.ismount`` says False for a mount
whose server died (the stat fails with ENOTCONN).
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


def wait_for_file(path: Path, pid: int, timeout: float) -> None:
    """Wait for a server (:func:`bootseer.serve.spawn_server`) to write ``path`` after its unmount
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

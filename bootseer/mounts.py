"""FUSE mounts served by a child process: start one, wait for it, tell if it is there, end it.

The FUSE server runs in a process of its own, started before it opens any store (so a
JVM is never forked) and detached from the terminal; the caller returns once the kernel
shows the mount. Liveness comes from ``/proc/mounts``, because ``os.path.ismount`` says
False for a mount whose server died (the stat fails with ENOTCONN).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bootseer.errors import BootseerError


def is_mounted(mountpoint: Path) -> bool:
    target = str(Path(mountpoint).absolute())
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)


def spawn_mount(args: list[str], mountpoint: Path, what: str, timeout: float) -> int:
    """Run ``args`` (a foreground FUSE server) detached; return its PID once mounted."""
    log_path = Path(tempfile.gettempdir()) / f"bootseer-mount-{os.getpid()}.log"
    with open(log_path, "ab") as log_file:
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
        time.sleep(0.05)
    return child.pid


def check_mountpoint(mountpoint: Path) -> None:
    if is_mounted(mountpoint):
        raise BootseerError(f"{mountpoint} is already a mount point (unmount it first)")
    if not mountpoint.is_dir():
        raise BootseerError(f"mount point {mountpoint} is not a directory (mkdir it first)")


def unmount(mountpoint: Path) -> None:
    """Unmount a FUSE or overlay mount, also one whose FUSE server died."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    commands = ([[tool, "-u", str(mountpoint)]] if tool else []) + [["umount", str(mountpoint)]]
    errors = []
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode == 0:
            return
        errors.append(result.stderr.strip())
    raise BootseerError(f"could not unmount {mountpoint}: {'; '.join(errors)}")

"""The kernel's mount table, for the mounts Bootseer makes: FUSE mounts served by a child
process (tell if one is there, wait for its server, end it) and overlays (mount one, find
one and its layers).

A server is started by :func:`bootseer.serve.spawn_server`. Liveness comes from
``/proc/mounts``, because ``os.path.ismount`` says False for a mount
whose server died (the stat fails with ENOTCONN).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
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
    which can take a while longer."""
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


@dataclass(frozen=True)
class OverlayMount:
    """An overlay in this mount namespace, as ``/proc/self/mountinfo`` shows it."""

    target: str
    lowers: tuple[str, ...]  # the top one first; data-only layers too
    upper: str | None


def overlays() -> list[OverlayMount]:
    """Every overlay mount of this mount namespace, in the order they were mounted."""
    found = []
    with open("/proc/self/mountinfo") as table:
        for line in table:
            mount, _, fs = line.partition(" - ")
            fields, described = mount.split(), fs.split()
            if len(fields) < 5 or len(described) < 3 or described[0] != "overlay":
                continue
            options = dict(o.partition("=")[::2] for o in described[2].split(","))
            found.append(OverlayMount(
                _unescape(fields[4]),
                tuple(p for p in options.get("lowerdir", "").split(":") if p),
                options.get("upperdir") or None))
    return found


def overlay_at(target: Path) -> OverlayMount | None:
    """The overlay mounted at ``target`` (the top one, if several are), or None."""
    path = os.path.realpath(target)  # the kernel shows the path it resolved
    return next((m for m in reversed(overlays()) if m.target == path), None)


def overlays_reading(path: Path) -> bool:
    """Whether an overlay of this mount namespace has a layer at or below ``path`` (it must
    not be removed from under it)."""
    top = os.path.abspath(path)
    return any(layer == top or layer.startswith(top + "/")
               for m in overlays() for layer in (*m.lowers, m.upper or ""))


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (``\\040`` for a space, ...) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_overlay(lowers: Sequence[Path], upper: Path, work: Path, target: Path, *,
                  data: Sequence[Path] = (), volatile: bool = False) -> None:
    """Mount an overlay of ``upper`` (writable) over ``lowers`` (the top one first) at
    ``target``.

    ``upper`` and ``work`` must be on the same file system; missing directories are made.
    The overlay is ``nosuid,nodev``: a container's root (or an environment) is written by
    its user, and a setuid-root binary or a device node left there must not work for
    anyone who reaches the directory from the host (nor, inside a container, escalate: it
    runs as if ``no_new_privileges`` were set). ``data``: data-only lower layers, searched
    in order for the files the lower layers redirect to (a metadata image,
    :mod:`bootseer.prefetch.metaimage`); they need ``metacopy`` and ``redirect_dir``.
    ``volatile``, for an upper thrown away with the mount (a container's root): the overlay
    never syncs the upper's file system, neither on fsync nor at unmount, where it would
    wait for every dirty page of that whole file system, the node cache's writes of the
    same start included (0.5-0.7 s of the agent's release of a lazy start in bench-image,
    0.013 s volatile). An upper that must survive a crash keeps the default.
    """
    for path in (*lowers, upper, work, target, *data):
        if any(c in str(path) for c in ",:\n"):
            raise BootseerError(f"overlay paths cannot contain ',' or ':': {path}")
    for lower in lowers:
        if not lower.is_dir():
            raise BootseerError(f"overlay lower directory {lower} does not exist")
    for path in (upper, work, target):
        path.mkdir(parents=True, exist_ok=True)
    layers = ":".join(str(p.resolve()) for p in lowers)
    layers += "".join(f"::{p.resolve()}" for p in data)
    options = f"lowerdir={layers},upperdir={upper.resolve()},workdir={work.resolve()}"
    if data:
        options += ",metacopy=on,redirect_dir=on"
    if volatile:
        options += ",volatile"
    proc = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", "nosuid,nodev," + options,
                           str(target)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise BootseerError(f"mounting an overlay at {target} failed: {proc.stderr.strip()}"
                            f"{' (needs root)' if os.geteuid() != 0 else ''}")

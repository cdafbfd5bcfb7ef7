"""FUSE connections: mounted, cloned, unmounted. No libfuse.

A connection is a ``/dev/fuse`` file the kernel ties to a mount. Whoever holds it decides
how long the mount lives: closing the last file of a connection aborts it.

* Root mounts with mount(2) itself (:func:`mount_fd`): the node agent does, and keeps the
  file while server processes come and go (:func:`clone_fd`).
* Anyone else asks the setuid ``fusermount3`` (:func:`fusermount_fd`), which mounts and
  hands the file back over a socket (``_FUSE_COMMFD``, the protocol libfuse speaks with it).

Either way the caller gets the same file, so one server (:mod:`bootseer.fuse.server`)
serves every mount, privileged or not.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import shutil
import socket
import struct
import subprocess
from pathlib import Path

from bootseer.fuse import FuseError
from bootseer.fuse import proto as p

log = logging.getLogger(__name__)

#: Readahead on the mount: the kernel's default (128 KiB) is its cap in FUSE_INIT, and a
#: server can only lower it; it is raised through sysfs before INIT. Files are read to the
#: end in larger steps: a Python start sends a third fewer READs.
READAHEAD = 1 << 20

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MNT_DETACH = 2


def fsname(source: str) -> str:
    """A mount's source name as a mount option list can carry it: a comma, a backslash or
    an ``=`` in a URL would otherwise end the option and start another (``,suid``)."""
    return "".join("_" if c in ",\\=" or not c.isprintable() else c for c in source)


def mount_fd(mountpoint: Path, source: str, *, subtype: str = "bootseer") -> int:
    """Mount an empty FUSE connection read-only at ``mountpoint``; return its /dev/fuse fd.

    Root only (mount(2) needs CAP_SYS_ADMIN). The mount is ``nosuid,nodev``, readable by
    all users subject to the files' own bits (``allow_other,default_permissions``). The
    kernel queues FUSE_INIT at once; calls on the mount wait until a server answers it.
    """
    if os.geteuid() != 0:
        raise FuseError("mounting a FUSE connection by fd needs root (CAP_SYS_ADMIN); "
                        "without it, fusermount3 mounts (fusermount_fd)")
    fd = _open_device()
    target = os.path.realpath(mountpoint)  # now: once mounted, a stat waits for a server
    options = (f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other,"
               f"default_permissions")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(fsname(source).encode(), os.fsencode(target), f"fuse.{subtype}".encode(),
                  ctypes.c_ulong(MS_RDONLY | MS_NOSUID | MS_NODEV), options.encode()) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise FuseError(f"mounting FUSE at {mountpoint} failed: {os.strerror(err)}")
    _raise_readahead(target)
    return fd


def fusermount_fd(mountpoint: Path, source: str, *, subtype: str = "bootseer") -> int:
    """Have ``fusermount3`` mount a connection read-only at ``mountpoint``; return its fd.

    For users without CAP_SYS_ADMIN. Other users see the mount only if ``/etc/fuse.conf``
    has ``user_allow_other`` (root's always do).
    """
    fusermount = shutil.which("fusermount3")
    if fusermount is None:
        raise FuseError("fusermount3 is not installed (Debian: apt install fuse3)")
    options = ["ro", "nosuid", "nodev", "default_permissions", f"fsname={fsname(source)}",
               f"subtype={subtype}"]
    if os.geteuid() == 0 or _user_allow_other():
        options.append("allow_other")
    target = os.path.realpath(mountpoint)  # now: once mounted, a stat waits for a server
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        result = subprocess.run(
            [fusermount, "-o", ",".join(options), "--", target],
            pass_fds=(theirs.fileno(),), capture_output=True, text=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "_FUSE_COMMFD": str(theirs.fileno())}, check=False)
        if result.returncode != 0:
            raise FuseError(f"fusermount3 could not mount {mountpoint}: "
                            f"{result.stderr.strip() or f'exit {result.returncode}'}")
        ours.settimeout(10)
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    if not fds:
        raise FuseError(f"fusermount3 mounted {mountpoint} but sent no /dev/fuse file")
    for extra in fds[1:]:
        os.close(extra)
    os.set_inheritable(fds[0], False)
    _raise_readahead(target)
    return fds[0]


def open_connection(mountpoint: Path, source: str, *, subtype: str = "bootseer") -> int:
    """A mounted connection at ``mountpoint``: by mount(2) as root, else by fusermount3."""
    if os.geteuid() == 0:
        return mount_fd(mountpoint, source, subtype=subtype)
    return fusermount_fd(mountpoint, source, subtype=subtype)


def detach(mountpoint: Path) -> None:
    """Unmount ``mountpoint`` lazily (the server sees its connection end): what a server
    that mounted for itself does when asked to stop. Errors are logged: the mount may be
    gone already."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.umount2(os.fsencode(os.path.realpath(mountpoint)), MNT_DETACH) != 0:
            log.warning("unmounting %s: %s", mountpoint, os.strerror(ctypes.get_errno()))
        return
    result = subprocess.run(["fusermount3", "-u", "-z", "--", str(mountpoint)],
                            capture_output=True, text=True, stdin=subprocess.DEVNULL,
                            check=False)
    if result.returncode != 0:
        log.warning("unmounting %s: %s", mountpoint, result.stderr.strip())


def clone_fd(fd: int) -> int:
    """A new /dev/fuse file attached to ``fd``'s connection, with its own request queue."""
    clone = _open_device()
    try:
        fcntl.ioctl(clone, p.FUSE_DEV_IOC_CLONE, struct.pack("=I", fd))
    except OSError as exc:
        os.close(clone)
        raise FuseError(f"cannot attach to FUSE connection fd {fd}: {exc.strerror} "
                        f"(not a mounted /dev/fuse file?)") from exc
    return clone


def _open_device() -> int:
    try:
        return os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise FuseError(f"cannot open /dev/fuse: {exc.strerror} (is the fuse module loaded, "
                        f"the device present in this container?)") from exc


def _user_allow_other() -> bool:
    with contextlib.suppress(OSError), open("/etc/fuse.conf") as conf:
        return any(line.split("#")[0].strip() == "user_allow_other" for line in conf)
    return False


def _raise_readahead(target: str) -> None:
    """Set the readahead of the mount at ``target`` (a real path) to :data:`READAHEAD`:
    its backing device info in sysfs, named after the device number, found in mountinfo
    (a stat of the mount would wait for a server). Advice only, root only: a failure is
    logged."""
    if os.geteuid() != 0:
        return
    for char in "\\ \t\n":  # mountinfo escapes these as octal
        target = target.replace(char, f"\\{ord(char):03o}")
    device = None
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:  # the last mount on the path is the one just made
            fields = line.split()
            if fields[4] == target:
                device = fields[2]
    try:
        Path(f"/sys/class/bdi/{device}/read_ahead_kb").write_text(str(READAHEAD >> 10))
    except OSError as exc:
        log.warning("could not raise the readahead of %s (bdi %s): %s", target, device, exc)

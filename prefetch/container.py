"""Run a command in a root filesystem with runc, and overlay mounts to give it a writable root.

:func:`run_rootfs` is ``docker run --rm --network none IMAGE ARGV`` without Docker: it
writes an OCI bundle (``config.json`` with the defaults ``runc spec`` and Docker use:
new pid/ipc/uts/mount/network namespaces, ``/proc``, ``/dev`` on tmpfs, read-only
``/sys``, masked ``/proc`` paths, Docker's default capability set), runs it in the
foreground with no terminal, captures its output, and deletes the container. runc keeps
its state in a private ``--root`` directory, so the host's ``/run/runc`` is left alone.
The network namespace is new and empty (no interfaces are set up): nothing the images
here run needs a network.

:func:`overlay_mount` gives a container a writable root over a read-only lower directory
(an unpacked image, or the lazy image's FUSE mount): writes land in ``upper``, the lower
directory never changes. Both need root.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from bootseer.errors import BootseerError
from bootseer.mounts import mount_overlay, unmount

log = logging.getLogger(__name__)

DEFAULT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root"}
# Docker's default set (moby oci/caps/defaults.go): enough for apt and friends, no admin.
DEFAULT_CAPABILITIES = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
]
_MASKED_PATHS = [
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
    "/proc/scsi",
]
_READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


class RuncError(BootseerError):
    """runc or mount is missing, or a mount failed; the message says what to do."""


def _runc() -> str:
    path = shutil.which("runc") or ("/usr/sbin/runc" if os.path.isfile("/usr/sbin/runc")
                                    else None)
    if path is None:
        raise RuncError("runc is not installed; run scripts/install-system-deps.sh "
                        "(or apt-get install runc)")
    return path


def bundle_config(rootfs: Path, argv: Sequence[str], env: Mapping[str, str], *,
                  readonly: bool = False, cwd: str = "/", hostname: str = "bootseer",
                  binds: Mapping[str, Path] | None = None) -> dict:
    """The ``config.json`` of a bundle that runs ``argv`` as root in ``rootfs``.

    ``binds`` maps container paths to host directories, bind-mounted read-write.
    """
    root_path = Path(os.path.realpath(rootfs))  # runc wants it absolute, not a symlink
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620",
                     "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]
    if readonly:
        mounts.append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                       "options": ["nosuid", "nodev", "mode=1777"]})
    for destination, source in (binds or {}).items():
        mounts.append({"destination": destination, "type": "bind",
                       "source": str(Path(source).resolve()),
                       "options": ["rbind", "rw", "nosuid", "nodev"]})
    caps = list(DEFAULT_CAPABILITIES)
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(argv),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": cwd,
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": str(root_path), "readonly": readonly},
        "hostname": hostname,
        "mounts": mounts,
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "maskedPaths": _MASKED_PATHS,
            "readonlyPaths": _READONLY_PATHS,
        },
    }


def run_rootfs(rootfs: str | Path, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
               timeout: float = 60, readonly: bool = False, cwd: str = "/",
               text: bool = True,
               binds: Mapping[str, Path] | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` as root in a container whose root is ``rootfs``; return its exit code,
    stdout and stderr (runc's own errors land in stderr too).

    ``env`` is added to (and overrides) ``PATH`` and ``HOME``. On timeout the container is
    killed and deleted, and :class:`subprocess.TimeoutExpired` raised.
    """
    rootfs = Path(rootfs)
    if not (rootfs / "bin").exists() and not (rootfs / "usr").is_dir():
        raise RuncError(f"{rootfs} does not look like a root filesystem (no /bin, no /usr)")
    config = bundle_config(rootfs, argv, DEFAULT_ENV | dict(env or {}), readonly=readonly,
                           cwd=cwd, binds=binds)
    return run_config(config, timeout=timeout, text=text)


def run_config(config: dict, *, timeout: float = 60,
               text: bool = True) -> subprocess.CompletedProcess:
    """Run the bundle ``config.json`` (:func:`bundle_config`, perhaps changed since) with
    runc in the foreground; its exit code, stdout and stderr, as :func:`run_rootfs`."""
    runc = _runc()
    argv = list(config["process"]["args"])
    container = f"bootseer-{uuid.uuid4().hex[:12]}"
    with tempfile.TemporaryDirectory(prefix="bootseer-runc-") as tmp:
        bundle, state = Path(tmp) / "bundle", Path(tmp) / "state"
        bundle.mkdir()
        state.mkdir(mode=0o700)
        (bundle / "config.json").write_text(json.dumps(config, indent=2))
        cmd = [runc, "--root", str(state), "run", "--bundle", str(bundle), container]
        log.debug("running %s: %s", container, argv)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=text)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _delete(runc, state, container)
            proc.kill()
            proc.communicate()
            raise
        finally:
            _delete(runc, state, container)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def _delete(runc: str, state: Path, container: str) -> None:
    """``runc delete --force``: kills what is left and removes the container (no error if
    ``runc run`` already removed it, as it does when the process exits)."""
    subprocess.run([runc, "--root", str(state), "delete", "--force", container],
                   stdin=subprocess.DEVNULL, capture_output=True)


@contextlib.contextmanager
def overlay_mount(lower: Path, upper: Path, work: Path, target: Path) -> Iterator[Path]:
    """:func:`~bootseer.mounts.mount_overlay` for the ``with`` block; yields ``target``,
    unmounts after."""
    mount_overlay([lower], upper, work, target)
    try:
        yield target
    finally:
        unmount(target)

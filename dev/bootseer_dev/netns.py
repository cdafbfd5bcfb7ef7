"""Named network namespaces (``ip netns``): make, enter, delete.

The fleet lab puts every emulated node and every HDFS server in a namespace of its own;
the dev cluster's JVMs and health checks then have to run in or reach into them. Three
ways in, for three needs:

* a process started in one: :func:`enter_argv` prefixes ``nsenter --net=...``, which
  enters only the network namespace and then execs the command (same pid, so a PID record
  names the real process). ``ip netns exec`` is not used: it also gives the process a
  mount namespace of its own, so a node agent's FUSE mounts would be invisible to the
  runtime and runc that start containers on them;
* a socket of this process in one: :func:`call_in` runs a function in a short-lived thread
  that has joined the namespace (``setns`` of a network namespace is per thread); a socket
  keeps the namespace it was created in, so the caller can use it afterwards;
* ``ip -n NAME ...`` for links, addresses and routes (:func:`ip`).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["NetnsError", "NETNS_DIR", "add", "call_in", "delete", "enter_argv", "exists",
           "inode", "ip", "netns_available", "pids"]

T = TypeVar("T")

NETNS_DIR = Path("/run/netns")
_CLONE_NEWNET = 0x40000000


class NetnsError(RuntimeError):
    """A namespace operation failed; the message has the command's own error."""


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=30)
    if check and proc.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed (rc={proc.returncode}): "
                         f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def netns_available() -> str | None:
    """None if this process can make network namespaces, else why not."""
    for tool in ("ip", "nsenter"):
        if not shutil.which(tool):
            return f"{tool} not found (apt-get install iproute2 util-linux)"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)"
    return None


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``ip [-n NETNS] ARGS``."""
    return _run(["ip", *(["-n", netns] if netns else []), *args], check=check)


def exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def add(name: str) -> None:
    """``ip netns add NAME`` and bring its loopback up."""
    ip("netns", "add", name)
    ip("link", "set", "lo", "up", netns=name)


def pids(name: str) -> list[int]:
    """The processes whose network namespace is NAME (``ip netns pids``)."""
    proc = ip("netns", "pids", name, check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def delete(name: str) -> bool:
    """``ip netns del NAME`` (its links, and their qdiscs, go with it); False if absent."""
    if not exists(name):
        return False
    ip("netns", "del", name)
    return True


def inode(name: str) -> int:
    """The namespace's identity (compare with ``os.stat('/proc/PID/ns/net').st_ino``)."""
    return os.stat(NETNS_DIR / name).st_ino


def enter_argv(name: str) -> list[str]:
    """The prefix that runs a command in namespace NAME (network only, see above)."""
    return ["nsenter", f"--net={NETNS_DIR / name}", "--"]


def call_in(name: str, fn: Callable[[], T]) -> T:
    """``fn()`` in namespace NAME, in a thread of its own that ends with it."""
    libc = ctypes.CDLL(None, use_errno=True)
    out: dict[str, object] = {}

    def run() -> None:
        try:
            fd = os.open(NETNS_DIR / name, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise NetnsError(f"setns({name}): {os.strerror(err)}")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=run, name=f"netns-{name}", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]  # type: ignore[return-value]

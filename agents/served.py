"""A served connection: one FUSE connection the agent holds, and the server serving it.

A container's mount is one of these for its lazy image and one per checkpoint directory
(:mod:`bootseer.agents.mounts`), each supervised the same way. The agent mounts the
connection itself (:func:`bootseer.fuse.connection.mount_fd`) and keeps its /dev/fuse
file; the server process, started from the connection's spec
(:func:`bootseer.serve.spawn_server`, on a spare when one is there), serves a copy. That
is what makes a mount outlive its server:

- **takeover**: a server that died is replaced by one that takes the connection over
  (its spec's :meth:`takeover`). Only the requests the dead server had read and not
  answered fail (``ECONNABORTED``); those still queued are answered by the new one.
- **adoption**: servers are sessions of their own, so an agent that restarts finds them
  serving (``state.json``) and takes its copy of the connection's file back from the
  live server (``pidfd_getfd``), so it can replace that server too.
- **teardown**: the connection is unmounted, its file closed first where no server is
  left (so the unmount never waits for a server that will not come), and the server
  waited for (killed after a while).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bootseer.errors import BootseerError
from bootseer.fuse.connection import mount_fd
from bootseer.mounts import is_mounted, unmount
from bootseer.serve import ServerSpec, Spare, decode, encode, spawn_server, with_fd
from bootseer.store.local import pid_alive

log = logging.getLogger(__name__)

#: Seconds a first server may take to load its image or list its checkpoint directory.
SERVER_START_TIMEOUT = 120.0
#: Seconds a torn-down connection's server may take to exit before it is killed.
TEARDOWN_WAIT = 30.0


@dataclass
class Served:
    """One connection and its current server, as the agent tracks it (persisted in the
    container's ``state.json``, all but :attr:`held`)."""

    spec: ServerSpec  # how its servers are started (``fuse_fd``: the agent's file then)
    log: Path  # its servers' output
    pid: int  # the server now
    fd: int  # the connection's /dev/fuse file, by its number in that server
    deaths: int = 0
    failed: bool = False  # the server died and could not be replaced
    #: This agent's copy of the connection's file; None once closed, or lost.
    held: int | None = field(default=None, compare=False)

    @classmethod
    def open(cls, spec: ServerSpec, log_path: Path, spare: Spare | None = None) -> Served:
        """Mount ``spec.mountpoint`` as a connection this agent holds and start its first
        server (on ``spare``, if given), returning once it serves; nothing stays mounted
        if it fails."""
        held = mount_fd(spec.mountpoint, spec.fsname)
        spec = with_fd(spec, held)
        try:
            started = spawn_server(spec, log_path, timeout=SERVER_START_TIMEOUT, spare=spare)
        except BaseException:
            os.close(held)
            unmount(spec.mountpoint)
            raise
        assert started.fuse_fd is not None
        return cls(spec, log_path, started.pid, started.fuse_fd, held=held)

    def serving(self) -> bool:
        reap(self.pid)
        return pid_alive(self.pid)

    def take_over(self) -> None:
        """Its server died: start one that takes the connection over (not waited for:
        the connection is live, its requests wait in the kernel's queue)."""
        self.deaths += 1
        if self.held is None or not is_mounted(self.spec.mountpoint):
            raise BootseerError("the connection is gone")
        started = spawn_server(with_fd(self.spec.takeover(), self.held), self.log,
                               timeout=SERVER_START_TIMEOUT, wait=False)
        assert started.fuse_fd is not None
        self.pid, self.fd = started.pid, started.fuse_fd

    def adopt(self) -> bool:
        """After an agent restart: take this agent's copy of the connection's file back
        from its live server. False (and :attr:`failed`) if server and file are gone."""
        self.held = _take_fd(self.pid, self.fd) if pid_alive(self.pid) else None
        if self.held is None:
            self.failed = True
        return self.held is not None

    def close(self, *, wait: float | None = TEARDOWN_WAIT) -> None:
        """Unmount the connection and let it go; wait ``wait`` seconds for its server
        to exit, then kill it (None: do not wait; the caller waits for its report)."""
        held, self.held = self.held, None
        if held is not None and not pid_alive(self.pid):
            os.close(held)  # no server: end the connection, so unmounting cannot wait
            held = None
        unmount(self.spec.mountpoint)
        if held is not None:
            os.close(held)
        if wait is not None:
            wait_or_kill(self.pid, wait)

    def status(self) -> dict[str, Any]:
        return {"pid": self.pid, "serving": pid_alive(self.pid),
                "server_deaths": self.deaths, "failed": self.failed}

    def to_json(self) -> dict[str, Any]:
        return {"spec": json.loads(encode(self.spec)), "log": str(self.log), "pid": self.pid,
                "fd": self.fd, "deaths": self.deaths, "failed": self.failed}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Served:
        return cls(decode(json.dumps(body["spec"]).encode()), Path(body["log"]),
                   int(body["pid"]), int(body["fd"]), int(body["deaths"]),
                   bool(body["failed"]))


def wait_or_kill(pid: int, timeout: float) -> None:
    """Wait for the server ``pid`` to exit; SIGKILL it after ``timeout`` seconds."""
    deadline, killed = time.monotonic() + timeout, False
    while pid_alive(pid):
        reap(pid)
        if time.monotonic() > deadline:
            if killed:  # not even SIGKILL ended it: stop waiting, say so
                log.error("server %d did not die after SIGKILL", pid)
                return
            log.warning("server %d did not exit within %.0f s; killing it", pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline, killed = time.monotonic() + 5.0, True
        time.sleep(0.02)
    reap(pid)


def _take_fd(pid: int, number: int) -> int | None:
    """A copy of file ``number`` of process ``pid`` (``pidfd_getfd``, Linux 5.6), if it is
    a FUSE connection: how a restarted agent gets back the connection of a mount it
    adopts. None if the process or the file is gone."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        fd = ctypes.CDLL(None, use_errno=True).syscall(_SYS_PIDFD_GETFD, pidfd, number, 0)
        if fd < 0:
            log.warning("pidfd_getfd(%d, %d): %s", pid, number,
                        os.strerror(ctypes.get_errno()))
            return None
        if os.readlink(f"/proc/self/fd/{fd}") != "/dev/fuse":
            os.close(fd)
            return None
        return fd
    finally:
        os.close(pidfd)


_SYS_PIDFD_GETFD = 438  # x86_64 and aarch64 alike (the unified syscall table)


def reap(pid: int) -> None:
    """Collect a server that was this agent's child and has exited (no zombies)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


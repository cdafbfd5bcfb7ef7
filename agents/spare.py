"""Spare servers: a mount server's process started before a container needs it.

A mount's servers (the lazy image's, each checkpoint directory's) are processes of
:mod:`bootseer.agents.runserver`. Starting one costs a second or two of CPU: the
interpreter, Bootseer's imports, and the store's connection.
Spent at mount time, all of it lies on the container's start, and when many containers
start at once on few cores it is most of their start. A spare pays it beforehand, the way
nydus keeps a daemon ready to take a connection over: started by the agent with the
agent's configuration, it imports the servers' code, connects to the store, then waits on
a socket for the spec it is to serve (what :func:`bootseer.serve.spawn_server` would have
started a process for) with the FUSE connection it is to serve and the log it is to
write; then it serves that spec, in its own process, exactly as a server started for it
would.

A spare serves once. While it waits it runs at the lowest priority (nice 19, and the same
for its autogroup, since it is a session of its own), so getting ready never slows a start
on the node; it takes back the normal priority when it is given a connection. The agent
keeps :attr:`AgentConfig.spare_servers` of them and starts the next one as it hands one
out. A spare that died, or any failure to hand one over, costs nothing but the time to
start a server the ordinary way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bootseer import typedjson
from bootseer.config import Config
from bootseer.serve import MAX_SPEC, RUNNER, ServerSpec, decode

log = logging.getLogger(__name__)

#: The byte a spare sends once it is ready (imports done, store connected).
READY = b"R"
#: Nice value of a waiting spare.
SPARE_NICE = 19


@dataclass
class Spare:
    """A started spare: its process and the agent's end of its socket."""

    process: subprocess.Popen
    control: socket.socket

    def alive(self) -> bool:
        return self.process.poll() is None

    def ready(self) -> bool:
        """Whether it is warm: its :data:`READY` waits, unread, on the socket."""
        try:
            return self.control.recv(len(READY), socket.MSG_PEEK | socket.MSG_DONTWAIT) == READY
        except OSError:  # nothing yet (BlockingIOError), or gone
            return False

    def hand_over(self, spec: bytes, fuse_fd: int, log_fd: int,
                  timeout: float) -> int | None:
        """Give the spare ``spec`` (:func:`bootseer.serve.encode`'s), the FUSE connection
        and the log. The connection's number in the spare (what a restarted agent takes
        back with ``pidfd_getfd``); None if it did not take them within ``timeout`` (it
        died, say): the caller then starts a server the ordinary way."""
        set_priority(0, self.process.pid)  # if it is still getting ready, it is needed now
        try:
            socket.send_fds(self.control, [spec], [fuse_fd, log_fd])
            self.control.settimeout(timeout)
            answer = b""
            while not answer.endswith(b"\n") and len(answer) < 32:
                chunk = self.control.recv(32)
                if not chunk:
                    break
                answer += chunk
            number = int(answer.removeprefix(READY).strip())
        except (OSError, ValueError) as exc:
            log.warning("spare server %d could not take a mount: %s", self.process.pid, exc)
            self.discard()
            return None
        self.control.close()
        return number

    def discard(self) -> None:
        self.control.close()
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()


class SparePool:
    """Up to ``size`` spares for the node ``config`` describes (its store, its caches);
    their output before a hand-over goes to ``log_path``."""

    def __init__(self, config: Config, log_path: Path, size: int) -> None:
        self.config, self.log_path, self.size = config, log_path, size
        self._spares: list[Spare] = []
        self._lock = threading.Lock()

    def fill(self) -> None:
        """Start spares until there are ``size`` live ones."""
        with self._lock:
            for dead in [s for s in self._spares if not s.alive()]:
                self._spares.remove(dead)
                dead.discard()
            while len(self._spares) < self.size:
                self._spares.append(self._start())

    def ready(self) -> int:
        """How many spares are warm (ready to serve at once)."""
        with self._lock:
            return sum(1 for s in self._spares if s.alive() and s.ready())

    def take(self) -> Spare | None:
        """A live spare (ready or still getting ready: either is ahead of a fresh start),
        or None; the pool starts its replacement."""
        with self._lock:
            while self._spares:
                spare = self._spares.pop(0)
                if spare.alive():
                    break
                spare.discard()
            else:
                spare = None
        if self.size:
            threading.Thread(target=self._fill_quietly, daemon=True).start()
        return spare

    def close(self) -> None:
        with self._lock:
            for spare in self._spares:
                spare.discard()
            self._spares.clear()

    def _fill_quietly(self) -> None:
        try:
            self.fill()
        except OSError as exc:
            log.warning("could not start a spare server: %s", exc)

    def _start(self) -> Spare:
        self.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW |
                     os.O_CLOEXEC, 0o600)
        try:
            with open(fd, "ab") as out, theirs:
                process = subprocess.Popen(
                    [sys.executable, "-m", RUNNER, "spare", "--control-fd",
                     str(theirs.fileno())],
                    stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True, pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        assert process.stdin is not None
        with contextlib.suppress(OSError), process.stdin:  # died at once: seen as not alive
            process.stdin.write(json.dumps(typedjson.to_json(self.config)).encode())
        ours.setblocking(True)
        return Spare(process, ours)


def serve_spare(control_fd: int, warm_up: Callable[[], None]) -> ServerSpec | None:
    """The spare's side: lower its priority, ``warm_up()`` (imports, store connection),
    say it is ready, wait for a hand-over, and take it: the FUSE connection and the log
    put in place, the normal priority back, the connection's number told to the agent.
    The spec to serve, its ``fuse_fd`` naming the received connection; None if the agent
    went away first."""
    set_priority(SPARE_NICE)
    control = socket.socket(fileno=control_fd)
    warm_up()
    with contextlib.suppress(OSError):
        control.sendall(READY)
    try:
        message, fds, _, _ = socket.recv_fds(control, MAX_SPEC, 2)
    except OSError:
        control.close()
        return None
    if len(fds) != 2 or not message:
        for fd in fds:
            os.close(fd)
        control.close()
        return None
    fuse_fd, log_fd = fds
    try:
        spec = dataclasses.replace(decode(message), fuse_fd=fuse_fd)
    except ValueError as exc:
        log.error("a spare was handed no spec it can serve: %s", exc)
        for fd in fds:
            os.close(fd)
        control.close()
        return None
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    set_priority(0)
    with contextlib.suppress(OSError):
        control.sendall(f"{fuse_fd}\n".encode())
    control.close()
    return spec


def set_priority(nice: int, pid: int = 0) -> None:
    """Process ``pid``'s nice value (0: this one) and its autogroup's (a session of its own
    is its own autogroup, whose weight is what the scheduler compares with other
    sessions). Lowering a nice value takes root; elsewhere it stays as it was."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid or 'self'}/autogroup").write_text(f"{nice}\n")

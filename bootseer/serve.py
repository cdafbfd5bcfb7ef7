"""Server processes: each technique's spec, carried to the process that serves it.

A FUSE server (a lazy image's, a checkpoint directory's) runs in a process of its own,
started before it opens any store (so a store client's threads are never forked) and in
a session of its own (so it outlives whoever started it). Its whole contract with that
caller is its spec, a frozen dataclass its technique owns (:class:`ImageServerSpec`,
:class:`CheckpointServerSpec`) holding everything it needs, the node's configuration
included: a server reads no config file, no environment and no command line, so what
``bootseer image mount``, the node agent and a spare server start is the same server.

:func:`spawn_server` is the one way to start one: the process is ``python -m
bootseer.agents.runserver serve KIND SOURCE MOUNTPOINT`` (the arguments only say, in
``ps``, what it serves), its spec is written as JSON to its stdin, and the caller waits
until it serves. A spare (:mod:`bootseer.agents.spare`), started ahead of need, gets the
same JSON over its socket instead. :func:`decode` reads a spec back within bounds and
refuses anything that is not one, whole and well-typed (:mod:`bootseer.typedjson`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bootseer import boundedjson, typedjson
from bootseer.errors import BootseerError
from bootseer.mounts import is_mounted
from bootseer.prefetch.serverspec import ImageServerSpec
from bootseer.stripedfs.serverspec import CheckpointServerSpec

#: A server's spec: one kind per technique.
ServerSpec = ImageServerSpec | CheckpointServerSpec
KINDS: dict[str, type[ServerSpec]] = {ImageServerSpec.KIND: ImageServerSpec,
                                      CheckpointServerSpec.KIND: CheckpointServerSpec}
#: Largest spec read: a few dozen fields and the node's configuration, some KiB.
MAX_SPEC = 256 << 10
#: The module every server process runs (it may reach the node agent, for peer reads).
RUNNER = "bootseer.agents.runserver"


def encode(spec: ServerSpec) -> bytes:
    return json.dumps({"kind": spec.KIND, "spec": typedjson.to_json(spec)}).encode()


def decode(data: bytes) -> ServerSpec:
    """The spec :func:`encode` wrote; ValueError for anything else."""
    body = boundedjson.loads(data, limit=MAX_SPEC, what="a server spec")
    if not isinstance(body, dict) or set(body) != {"kind", "spec"} or \
            body["kind"] not in KINDS:
        raise ValueError(f"not a server spec (kinds: {', '.join(KINDS)})")
    return typedjson.from_json(KINDS[body["kind"]], body["spec"])


def command(spec: ServerSpec) -> list[str]:
    """A server process's command line (its spec comes on stdin)."""
    return [sys.executable, "-m", RUNNER, "serve", spec.KIND, spec.source, str(spec.mountpoint)]


class Spare(Protocol):
    """A server process started ahead of need, waiting for its spec
    (:class:`bootseer.agents.spare.Spare`)."""

    process: subprocess.Popen

    def hand_over(self, spec: bytes, fuse_fd: int, log_fd: int, timeout: float) -> int | None:
        """Give it ``spec``, the connection and the log: the connection's number in it,
        or None if it did not take them (the caller starts a server the ordinary way)."""


@dataclass(frozen=True)
class Started:
    pid: int
    fuse_fd: int | None  # the spec's connection, by its number in the server


def spawn_server(spec: ServerSpec, log_path: Path, *, timeout: float, wait: bool = True,
                 spare: Spare | None = None) -> Started:
    """Start a server for ``spec``, its output appended to ``log_path``, on ``spare`` if
    one is given and takes it. With ``wait``, return once it serves: for a connection the
    caller holds (``spec.fuse_fd``), once it creates ``spec.ready_file``; otherwise once
    the kernel shows the mount. A server that exits first, or is not serving within
    ``timeout`` seconds, is killed and the error carries its log's tail."""
    data = encode(spec)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW |
                     os.O_CLOEXEC, 0o600)
    with open(log_fd, "ab") as log_file:
        number = None
        if spare is not None and spec.fuse_fd is not None:
            number = spare.hand_over(data, spec.fuse_fd, log_fd, timeout)
        if spare is not None and number is not None:
            child = spare.process
        else:
            number = spec.fuse_fd
            child = subprocess.Popen(
                command(spec), stdin=subprocess.PIPE, stdout=log_file,
                stderr=subprocess.STDOUT, start_new_session=True,
                pass_fds=() if spec.fuse_fd is None else (spec.fuse_fd,))
            assert child.stdin is not None
            try:
                with child.stdin:
                    child.stdin.write(data)
            except OSError:  # it exited before reading it: judged below
                pass
    ready = spec.ready_file if spec.fuse_fd is not None else None
    deadline = time.monotonic() + timeout
    while wait and not (is_mounted(spec.mountpoint) if spec.fuse_fd is None else
                        ready is None or ready.exists()):
        exited = child.poll() is not None
        if exited or time.monotonic() > deadline:
            child.kill()
            child.wait()
            tail = log_path.read_text(errors="replace").strip()[-800:]
            raise BootseerError(f"the server of {spec.what} failed: {tail}" if exited else
                                f"the server of {spec.what} was not serving within "
                                f"{timeout:.0f}s: {tail}")
        time.sleep(0.01)
    return Started(child.pid, number)


def with_fd(spec: ServerSpec, fuse_fd: int) -> ServerSpec:
    """``spec`` serving the connection ``fuse_fd`` (its number in the server)."""
    return dataclasses.replace(spec, fuse_fd=fuse_fd)

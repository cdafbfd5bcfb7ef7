"""``bootseer-runtime-shim``: an OCI runtime shim in front of runc, for Docker and containerd.

Engines are configured with ``bootseer-runtime`` (Docker ``daemon.json`` ``"runtimes"``,
containerd ``io.containerd.runc.v2`` with ``BinaryName``), a POSIX sh front
(``agents/bootseer-runtime``) that sends every call but those that may be ``create`` or
``run`` straight to runc, and those here, with runc's command line as it came. This shim
acts on ``create`` and ``run`` of a container that asked for Bootseer (see
:mod:`bootseer.agents.oci`): it asks the node agent for the container's lazy root, rewrites the
bundle's ``config.json`` to use it (and to release it in a poststop hook), then execs runc
with the very same arguments. Everything else (other commands, containers that did not ask)
is exec'd into runc at once, config untouched: this path imports nothing heavy and parses
only the command line. A container that asked for Bootseer but cannot get its root fails to
be created, with the reason on stderr and in runc's log file (where Docker and containerd
read a runtime's error), because its engine image is only a stub; so does one whose config
is too large or nested too deep to tell whether it asked (:data:`MAX_CONFIG_BYTES`,
:data:`bootseer.boundedjson.MAX_DEPTH`).

The real runc: ``$BOOTSEER_RUNC``, else ``runc`` on ``PATH``, else ``/usr/sbin/runc``.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.errors import BootseerError

if TYPE_CHECKING:
    from bootseer.agents.mountapi import ContainerMount
    from bootseer.agents.oci import Labels

RUNC_ENV = "BOOTSEER_RUNC"
#: runc's global flags that take a value (urfave/cli: ``--flag value`` or ``--flag=value``,
#: one or two dashes). Everything else before the command is a boolean flag.
_GLOBAL_VALUE_FLAGS = {"log", "log-format", "root", "criu", "rootless"}
#: Flags of ``create`` and ``run`` that take a value.
_COMMAND_VALUE_FLAGS = {"bundle", "b", "console-socket", "pid-file", "preserve-fds"}
_ACTS_ON = {"create", "run"}


#: runc's state directory when ``--root`` is not given (run as root).
DEFAULT_ROOT = "/run/runc"
#: An OCI config (or state) is KiB, a few MiB with a huge environment: the shim and the
#: hook (root) read no more of what a container's creator wrote.
MAX_CONFIG_BYTES = 16 << 20


@dataclass(frozen=True)
class RuncCall:
    """The parts of a runc command line the shim needs."""

    command: str | None
    bundle: Path | None = None  # --bundle; runc's default is the current directory
    container_id: str | None = None
    log: Path | None = None
    log_format: str = "text"
    #: --root: where this engine (containerd namespace, Docker's moby) keeps containers;
    #: with the id, it names the container on the node (mountapi.mount_key).
    root: str = DEFAULT_ROOT


def _flag(arg: str) -> tuple[str, str | None]:
    """``--name=value`` -> ("name", "value"); ``-name`` -> ("name", None)."""
    name, eq, value = arg.lstrip("-").partition("=")
    return name, value if eq else None


def parse(args: list[str]) -> RuncCall:
    """Find the command and what ``create``/``run`` need in runc's arguments (no argv[0])."""
    options: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        name, value = _flag(args[i])
        if name in _GLOBAL_VALUE_FLAGS and value is None:
            i += 1
            value = args[i] if i < len(args) else ""
        if value is not None:
            options[name] = value
        i += 1
    if i >= len(args):
        return RuncCall(None)
    command, rest = args[i], args[i + 1:]
    call = RuncCall(command, log=Path(options["log"]) if options.get("log") else None,
                    log_format=options.get("log-format", "text"),
                    root=options.get("root") or DEFAULT_ROOT)
    if command not in _ACTS_ON:
        return call
    bundle, container_id = None, None
    j = 0
    while j < len(rest):
        arg = rest[j]
        if arg.startswith("-") and arg != "-":
            name, value = _flag(arg)
            if name in _COMMAND_VALUE_FLAGS and value is None:
                j += 1
                value = rest[j] if j < len(rest) else None
            if name in ("bundle", "b"):
                bundle = value
        elif container_id is None:
            container_id = arg
        j += 1
    return RuncCall(command, Path(bundle) if bundle else None, container_id, call.log,
                    call.log_format, call.root)


def real_runc() -> str:
    path = os.environ.get(RUNC_ENV) or shutil.which("runc") or "/usr/sbin/runc"
    if not os.path.isfile(path):
        sys.stderr.write(f"bootseer-runtime: runc not found at {path}; install runc or set "
                         f"{RUNC_ENV} to its path\n")
        sys.exit(127)
    return path


class ShimError(BootseerError):
    """The container asked for Bootseer and cannot have its lazy root; says why."""


def agent_socket() -> Path:
    """The node agent's socket, as the Bootseer config has it (env, files, defaults)."""
    from bootseer.config import load_config

    return load_config().config.agent.socket


def request_mount(socket: Path, labels: Labels, container_id: str,
                  runtime: str, namespace: str = "") -> ContainerMount:
    """Ask the node agent for the container's lazy root (the client is imported only here)."""
    from bootseer.agents.client import AgentClient, AgentUnavailable
    from bootseer.errors import BootseerError

    try:
        with AgentClient(socket) as client:
            return client.mount(labels.mount_request(container_id, runtime, namespace))
    except AgentUnavailable as exc:
        raise ShimError(f"container {container_id} asked for the lazy image "
                        f"{labels.image!r}, but {exc}. Is the node agent running "
                        f"(`bootseer agent`, socket {socket})?") from exc
    except (BootseerError, ValueError) as exc:
        raise ShimError(f"the node agent refused container {container_id} the lazy image "
                        f"{labels.image!r}: {exc}") from exc


def release_mount(socket: Path, mount_id: str, exit_code: int | None = None,
                  rootfs: str | None = None) -> None:
    """Give a mount back to the agent (raises :class:`bootseer.agents.client.AgentError` and
    friends: the caller decides whether that matters). Returns once the mounts are gone:
    the engine, waiting on this, removes the container meanwhile; the agent completes the
    start's record (its server's report, a recording stored) on its own."""
    from bootseer.agents.client import AgentClient

    with AgentClient(socket) as client:
        client.release(mount_id, exit_code, rootfs, wait=False)


def hook_path(argv0: str) -> Path:
    """``bootseer-hook`` installed beside this script (or beside the Python running it)."""
    for directory in (Path(argv0).absolute().parent, Path(sys.executable).absolute().parent):
        if (directory / "bootseer-hook").is_file():
            return directory / "bootseer-hook"
    raise ShimError(f"bootseer-hook is not installed next to {argv0}; reinstall Bootseer "
                    "(pip install) so bootseer-runtime and bootseer-hook share a directory")


def prepare_bundle(call: RuncCall, argv0: str) -> None:
    """Rewrite the bundle's config for Bootseer if the container asked for it.

    Load, check, get the mount, modify a copy, then replace the file at once: a failure at
    any step leaves the config as it was (and fails the create).
    """
    from bootseer import boundedjson
    from bootseer.agents import oci
    from bootseer.jsonfile import write_json

    path = (call.bundle or Path.cwd()) / "config.json"
    try:
        spec = boundedjson.load_file(path, limit=MAX_CONFIG_BYTES, what=str(path))
    except boundedjson.JSONLimitError:
        raise  # too large or deep to tell whether it asks for Bootseer: refused
    except (OSError, ValueError):
        return  # not ours to judge: runc says what is wrong with the bundle
    labels = oci.requested(spec)  # bad Bootseer settings fail the create (SpecError)
    if labels is None:
        return
    hook = hook_path(argv0)
    socket = agent_socket()
    mount = request_mount(socket, labels, call.container_id, "bootseer-runtime", call.root)
    try:
        # The hook finds the mount from runc's state (the container's id) and this root,
        # never from anything the container's config says.
        poststop = oci.Hook(str(hook), ["bootseer-hook", "poststop", "--runtime-root",
                                        call.root], [f"BOOTSEER_AGENT_SOCKET={socket}"])
        write_json(path, oci.rewrite(spec, mount, poststop),
                   mode=path.stat().st_mode & 0o7777)
    except BaseException:
        try:
            release_mount(socket, mount.id)
        except Exception as exc:  # the error that matters is the one being raised
            sys.stderr.write(f"bootseer-runtime: could not release mount {mount.id}: {exc}\n")
        raise


def _fail(call: RuncCall, message: str) -> None:
    """Say why on stderr and in runc's log, where Docker and containerd look for it."""
    sys.stderr.write(f"bootseer-runtime: {message}\n")
    if call.log is None:
        return
    import json
    import time

    text = f"bootseer-runtime: {message}"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # RFC 3339, as Go parses it
    try:
        with open(call.log, "a") as log:
            if call.log_format == "json":
                log.write(json.dumps({"level": "error", "msg": text, "time": now}) + "\n")
            else:
                log.write(f"time={now} level=error msg={json.dumps(text)}\n")
    except OSError:
        pass  # stderr has it


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
    runc = real_runc()
    call = parse(argv[1:])
    if call.command in _ACTS_ON and call.container_id:
        try:
            prepare_bundle(call, argv[0])
        except Exception as exc:  # never forward after a failed modification
            _fail(call, f"container {call.container_id}: {exc}")
            sys.exit(1)
    os.execv(runc, [runc, *argv[1:]])

"""``bootseer-hook``: the OCI hook, for podman and CRI-O (hooks.d) and for the shim's containers.

Stages (the first argument, else told apart by what comes on stdin: an OCI state has a
``status``, a config does not; hooks.d gives every stage of one file the same arguments):

* ``precreate`` (a containers/common extension podman and CRI-O run before creating the
  container): the OCI config comes on stdin and the config to use goes to stdout. A
  container that asked for Bootseer (:mod:`bootseer.agents.oci`) gets its lazy root from the node
  agent and the same rewrite the shim does, minus the poststop hook (the engine runs its
  hooks.d poststop hook itself). The engine has not named the container yet, so the mount
  gets a fresh, unguessable id of its own, kept in the ``io.bootseer.mount`` annotation
  (which the rewrite sets whatever the container brought). A container that did not ask
  passes unchanged, but for an ``io.bootseer.mount`` annotation of its own, which is
  removed: it could only name another container's mount. A failure exits non-zero: the
  engine then refuses to create the container, which is right, since its root would not
  be there.
* ``poststop``: the OCI state comes on stdin, and the container's own mount is released.
  Which mount that is comes from the engine's state, never from the container: with
  ``--runtime-root ROOT`` (the shim's hook), from the state's container id and runc's
  root; otherwise (hooks.d), from the bundle's ``config.json`` as the engine stored it
  from precreate's output, not from the state's annotations (podman gives its poststop
  hooks the annotations the container asked for). The agent also checks that the root the
  engine's config names is that mount's. Running twice, or after the mount is gone, is
  fine; a problem is logged and the hook still exits 0, since the container has stopped
  either way.

``deploy/hooks.d/bootseer.json`` installs both stages for containers annotated
``io.bootseer.image``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bootseer import boundedjson
from bootseer.agents import oci
from bootseer.agents.runtime import MAX_CONFIG_BYTES

STAGES = ("precreate", "poststop")


def precreate(spec: dict[str, Any]) -> dict[str, Any]:
    """The config the engine should use for ``spec``."""
    import uuid

    from bootseer.agents.runtime import agent_socket, request_mount

    labels = oci.requested(spec)
    if labels is None:  # not ours; nor may it name a mount of ours
        return oci.without_mount_annotation(spec)
    mount = request_mount(agent_socket(), labels, f"bootseer-{uuid.uuid4().hex}",
                          "bootseer-hook")
    return oci.rewrite(spec, mount)


def poststop_mount(state: dict[str, Any], runtime_root: str | None) -> tuple[str, str | None]:
    """The mount a stopped container ran on, and its root as the engine stored it (the
    proof the agent checks); ``ValueError`` if the engine's state names none."""
    from bootseer.agents.mountapi import mount_key

    bundle = state.get("bundle")
    spec = None
    if isinstance(bundle, str) and bundle:
        try:
            spec = boundedjson.load_file(Path(bundle) / "config.json",
                                         limit=MAX_CONFIG_BYTES, what="the bundle's config")
        except (OSError, ValueError):
            spec = None  # the bundle is gone already, or its config is unreadable
    rootfs = oci.root_path(spec, bundle) if isinstance(spec, dict) else None
    if runtime_root is not None:
        container_id = state.get("id")
        if not isinstance(container_id, str) or not container_id:
            raise ValueError("the OCI state names no container")
        return mount_key(container_id, runtime_root), rootfs
    found = oci.mount_id(spec) if isinstance(spec, dict) else None
    if found is None:
        raise ValueError("the container's config names no Bootseer mount")
    return found, rootfs


def poststop(state: dict[str, Any], runtime_root: str | None = None) -> None:
    from bootseer.agents.client import AgentError
    from bootseer.agents.runtime import agent_socket, release_mount

    try:
        mount, rootfs = poststop_mount(state, runtime_root)
    except ValueError as exc:
        sys.stderr.write(f"bootseer-hook poststop: nothing to release: {exc}\n")
        return
    try:
        release_mount(agent_socket(), mount, rootfs=rootfs)
    except AgentError as exc:
        # Already released (a second poststop, the agent restarted): nothing left to do.
        sys.stderr.write(f"bootseer-hook: mount {mount} not released: {exc}\n")


USAGE = ("usage: bootseer-hook [precreate | poststop [--runtime-root ROOT]]  (an OCI hook: "
         "the config or the state comes on stdin)\n")


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    runtime_root = None
    if args[1:2] == ["--runtime-root"] and len(args) == 3:
        runtime_root = args.pop()
        args.pop()
    if len(args) > 1 or (args and args[0] not in STAGES) or \
            (runtime_root is not None and args != ["poststop"]):
        sys.stderr.write(USAGE)
        sys.exit(2)
    raw = boundedjson.read_at_most(sys.stdin.buffer, MAX_CONFIG_BYTES + 1)
    try:
        document = boundedjson.loads(raw, limit=MAX_CONFIG_BYTES, what="stdin")
        stage = args[0] if args else ("poststop" if "status" in document else "precreate")
    except (ValueError, TypeError) as exc:
        sys.stderr.write(f"bootseer-hook: stdin is not an OCI config or state: {exc}\n")
        sys.exit(1)
    if stage == "poststop":
        try:
            poststop(document, runtime_root)
        except Exception as exc:  # the container has stopped anyway: say why, exit 0
            sys.stderr.write(f"bootseer-hook poststop: {exc}\n")
        return
    try:
        out = precreate(document)
    except Exception as exc:  # the engine then does not create the container
        sys.stderr.write(f"bootseer-hook precreate: {exc}\n")
        sys.exit(1)
    if out is document:
        sys.stdout.buffer.write(raw)  # exactly what came in
    else:
        sys.stdout.write(json.dumps(out))

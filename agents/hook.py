"""``bootseer-hook``: the OCI hook, for podman and CRI-O (hooks.d) and for the shim's containers.

Stages (the first argument, else told apart by what comes on stdin: an OCI state has a
``status``, a config does not; hooks.d gives every stage of one file the same arguments):

* ``precreate`` (a containers/common extension podman and CRI-O run before creating the
  container): the OCI config comes on stdin and the config to use goes to stdout. A
  container that asked for Bootseer (:mod:`agents.oci`) gets its lazy root from the node
  agent and the same rewrite the shim does, minus the poststop hook (the engine runs its
  hooks.d poststop hook itself). The engine has not named the container yet, so the mount
  gets an id of its own, kept in the ``io.bootseer.mount`` annotation. Anything else is
  echoed unchanged. A failure exits non-zero: the engine then refuses to create the
  container, which is right, since its root would not be there.
* ``poststop``: the OCI state comes on stdin. The mount the container ran on (annotation
  ``io.bootseer.mount`` in the state, else in the bundle's ``config.json``: podman gives its
  poststop hooks the annotations it was asked for, not the rewritten ones) is released.
  Running twice, or after the mount is gone, is fine; a problem is logged and the hook
  still exits 0, since the container has stopped either way.

``deploy/hooks.d/bootseer.json`` installs both stages for containers annotated
``io.bootseer.image``.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

from agents import oci

STAGES = ("precreate", "poststop")


def precreate(spec: dict[str, Any]) -> dict[str, Any]:
    """The config the engine should use for ``spec``."""
    from agents.runtime import agent_socket, request_mount

    labels = oci.requested(spec)
    if labels is None or oci.mount_id(spec):  # not ours, or already rewritten
        return spec
    mount = request_mount(agent_socket(), labels, f"bootseer-{uuid.uuid4().hex}",
                          "bootseer-hook")
    return oci.rewrite(spec, mount)


def poststop_mount(state: dict[str, Any]) -> str | None:
    """The mount a stopped container ran on, from its state or its bundle's config."""
    found = oci.mount_id(state)
    if found is None and state.get("bundle"):
        try:
            found = oci.mount_id(json.loads((Path(state["bundle"]) / "config.json")
                                            .read_text()))
        except (OSError, ValueError):
            return None  # the bundle is gone: nothing says it was ours
    return found


def poststop(state: dict[str, Any]) -> None:
    from agents.client import AgentError
    from agents.runtime import agent_socket, release_mount

    mount = poststop_mount(state)
    if mount is None:
        return
    try:
        release_mount(agent_socket(), mount)
    except AgentError as exc:
        # Already released (a second poststop, the agent restarted): nothing left to do.
        sys.stderr.write(f"bootseer-hook: mount {mount} not released: {exc}\n")


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] not in STAGES:
        sys.stderr.write("usage: bootseer-hook [precreate|poststop]  (an OCI hook: the "
                         "config or the state comes on stdin)\n")
        sys.exit(2)
    raw = sys.stdin.buffer.read()
    try:
        document = json.loads(raw)
        stage = args[0] if args else ("poststop" if "status" in document else "precreate")
    except (ValueError, TypeError) as exc:
        sys.stderr.write(f"bootseer-hook: stdin is not an OCI config or state: {exc}\n")
        sys.exit(1)
    if stage == "poststop":
        try:
            poststop(document)
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

"""The OCI config changes that give a container its lazy root: pure functions, no engine.

``bootseer-runtime`` (the shim Docker and containerd call instead of runc) and
``bootseer-hook`` (podman's and CRI-O's ``precreate`` hook) both do the same thing to a
container's ``config.json``: find out whether the container asked for Bootseer
(:func:`requested`), ask the node agent for the container's mount, then :func:`rewrite` the
config to use it. Keeping that here, apart from argument parsing and the agent call, lets
every change be tested on plain dictionaries.

A container asks for Bootseer with the OCI annotation ``io.bootseer.image=NAME`` (podman,
containerd, CRI-O, Docker >= 24 pass annotations through), or, because Docker 20.10 passes
neither labels nor annotations to the runtime, with the variable ``BOOTSEER_IMAGE=NAME``
in the container's environment (the way ``NVIDIA_VISIBLE_DEVICES`` works; the stub image of
``bootseer image docker-stub`` sets it). Each setting is looked up as an annotation first,
except the job, which is an annotation's only: a job's report and peers are shared by its
nodes, so joining one is for whoever starts the pod (and the operator's ``agent.jobs``),
never for an image's ``ENV``.

Under Kubernetes, containerd's CRI plugin copies a pod's annotations (those its runtime's
``pod_annotations`` lets through: ``io.bootseer.*``) into the config of every container of
the pod, its sandbox (``pause``) container included, and then writes annotations of its
own over them (:data:`CRI_CONTAINER_TYPE`, the pod's name and namespace). A pod cannot set
those: the sandbox always goes to runc untouched, and a start's pod is the engine's word.

:func:`rewrite` is a list of small modifiers applied to a copy of the config, so a failure
in any of them leaves the original untouched and nothing is forwarded half-modified.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bootseer.agents.mountapi import RECORD_MODES, ContainerMount, MountRequest
from bootseer.errors import BootseerError

ANNOTATION_PREFIX = "io.bootseer."
ENV_PREFIX = "BOOTSEER_"
#: The annotation the rewrite leaves: which agent mount the container runs on (the
#: poststop hook releases it).
MOUNT_ANNOTATION = "io.bootseer.mount"
#: Mount options of the signal directory (ready file, phase marks): writable, nothing else.
SIGNAL_MOUNT_OPTIONS = ("rbind", "rw", "nosuid", "nodev")

#: Written by containerd's CRI plugin after the pod's own annotations (see above).
CRI_CONTAINER_TYPE = "io.kubernetes.cri.container-type"
CRI_POD_NAME = "io.kubernetes.cri.sandbox-name"
CRI_POD_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"

Spec = dict[str, Any]
Modifier = Callable[[Spec], None]


class SpecError(BootseerError, ValueError):
    """The config cannot be read as an OCI config, or asks for Bootseer with bad values."""


@dataclass(frozen=True)
class Labels:
    """What a container asked of Bootseer: which lazy image, and for which start."""

    image: str
    workload: str = "default"
    job: str | None = None
    record: str = "auto"
    checkpoints: tuple[tuple[str, str], ...] = ()  # (name, store URL) to mount
    envs: tuple[str, ...] = ()  # snapshot keys to mount in the root
    pod: str | None = None  # "NAMESPACE/NAME" of a Kubernetes pod, from its engine

    def mount_request(self, container_id: str, runtime: str,
                      namespace: str = "") -> MountRequest:
        return MountRequest(id=container_id, image=self.image, workload=self.workload,
                            record=self.record, job=self.job, runtime=runtime,
                            checkpoints=dict(self.checkpoints), namespace=namespace,
                            envs=self.envs, pod=self.pod)


def parse_checkpoints(value: str | None) -> tuple[tuple[str, str], ...]:
    """``name=URL,name=URL`` (``io.bootseer.checkpoints`` / ``BOOTSEER_CHECKPOINTS``)."""
    pairs = []
    for item in filter(None, (part.strip() for part in (value or "").split(","))):
        name, eq, url = item.partition("=")
        if not eq or not name or not url:
            raise SpecError(f"{ANNOTATION_PREFIX}checkpoints / {ENV_PREFIX}CHECKPOINTS: "
                            f"{item!r} is not NAME=URL")
        pairs.append((name, url))
    return tuple(pairs)


def env_map(spec: Spec) -> dict[str, str]:
    """``process.env`` as a dict (a later duplicate wins, as in execve's consumers)."""
    env = (spec.get("process") or {}).get("env") or []
    return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)


def requested(spec: Spec) -> Labels | None:
    """The container's Bootseer settings, or None when it did not ask for Bootseer."""
    if not isinstance(spec, dict):
        raise SpecError("the OCI config is not a JSON object")
    annotations = spec.get("annotations") or {}
    if annotations.get(CRI_CONTAINER_TYPE) == "sandbox":
        return None  # a pod's pause container: the pod's annotations reach it too
    env = env_map(spec)

    def setting(name: str) -> str | None:
        value = annotations.get(ANNOTATION_PREFIX + name)
        if value is None:
            value = env.get(ENV_PREFIX + name.upper())
        return value or None

    image = setting("image")
    if image is None:
        return None
    record = setting("record") or "auto"
    if record not in RECORD_MODES:
        raise SpecError(f"{ANNOTATION_PREFIX}record / {ENV_PREFIX}RECORD is {record!r}; "
                        f"use one of {', '.join(RECORD_MODES)}")
    envs = tuple(filter(None, (k.strip() for k in (setting("envs") or "").split(","))))
    return Labels(image=image, workload=setting("workload") or "default",
                  job=annotations.get(ANNOTATION_PREFIX + "job") or None, record=record,
                  checkpoints=parse_checkpoints(setting("checkpoints")), envs=envs,
                  pod=pod_of(annotations))


def pod_of(annotations: dict[str, Any]) -> str | None:
    """The Kubernetes pod (``NAMESPACE/NAME``) containerd's CRI plugin created the
    container for, or None outside one."""
    name, namespace = annotations.get(CRI_POD_NAME), annotations.get(CRI_POD_NAMESPACE)
    if not name or not namespace:
        return None
    return f"{namespace}/{name}"


@dataclass(frozen=True)
class Hook:
    """One OCI hook entry (runtime-spec ``hooks.*[]``)."""

    path: str
    args: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "args": list(self.args)}
        if self.env:
            out["env"] = list(self.env)
        return out


def set_root(mount: ContainerMount) -> Modifier:
    """The agent's overlay replaces the engine's root; it is writable like a normal root."""
    def modify(spec: Spec) -> None:
        spec["root"] = {**(spec.get("root") or {}), "path": mount.rootfs, "readonly": False}
    return modify


def add_signal_mount(mount: ContainerMount) -> Modifier:
    """The ready file and phase marks' directory, shared with the agent (one mount per
    destination: an engine's own mount there would hide ours)."""
    def modify(spec: Spec) -> None:
        mounts = [m for m in spec.get("mounts") or []
                  if m.get("destination") != mount.signal_target]
        mounts.append({"destination": mount.signal_target, "type": "bind",
                       "source": mount.signal_dir, "options": list(SIGNAL_MOUNT_OPTIONS)})
        spec["mounts"] = mounts
    return modify


def merge_env(mount: ContainerMount) -> Modifier:
    """The agent's variables override; the image's Env fills in what the container did not
    set (a stub or empty engine image does not carry the lazy image's PATH and friends)."""
    def modify(spec: Spec) -> None:
        process = spec.setdefault("process", {})
        env = env_map(spec)
        for item in mount.image_config.get("Env") or []:
            name, _, value = item.partition("=")
            env.setdefault(name, value)
        env.update(mount.env)
        process["env"] = [f"{k}={v}" for k, v in env.items()]
    return modify


def set_workdir(mount: ContainerMount) -> Modifier:
    """An engine that did not know the image's WorkingDir left the cwd at "/"."""
    def modify(spec: Spec) -> None:
        process = spec.setdefault("process", {})
        workdir = mount.image_config.get("WorkingDir")
        if workdir and process.get("cwd", "/") == "/":
            process["cwd"] = workdir
    return modify


def add_poststop_hook(hook: Hook) -> Modifier:
    """runc runs poststop hooks at ``runc delete``: the mount is released there."""
    def modify(spec: Spec) -> None:
        hooks = spec.setdefault("hooks", {})
        hooks["poststop"] = [*(hooks.get("poststop") or []), hook.to_json()]
    return modify


def add_checkpoints_mount(mount: ContainerMount) -> Modifier:
    """The checkpoint mounts' directory, read-only, with the mounts in it (``rbind``; a
    slave of the host's, so nothing the container mounts there reaches the host)."""
    def modify(spec: Spec) -> None:
        if mount.checkpoints_dir is None:
            return
        spec["mounts"] = [*(m for m in spec.get("mounts") or []
                            if m.get("destination") != mount.checkpoints_target),
                          {"destination": mount.checkpoints_target, "type": "bind",
                           "source": mount.checkpoints_dir,
                           "options": ["rbind", "ro", "nosuid", "nodev", "rslave"]}]
    return modify


def annotate(mount: ContainerMount) -> Modifier:
    """Name the mount in the config, for the poststop hook and for anyone inspecting it."""
    def modify(spec: Spec) -> None:
        spec["annotations"] = {**(spec.get("annotations") or {}), MOUNT_ANNOTATION: mount.id}
    return modify


def modifiers(mount: ContainerMount, poststop: Hook | None = None) -> list[Modifier]:
    """Every change for ``mount``; ``poststop`` only where the engine does not run hooks
    itself (podman runs its hooks.d poststop hooks, so the hook passes None)."""
    out = [set_root(mount), add_signal_mount(mount), add_checkpoints_mount(mount),
           merge_env(mount), set_workdir(mount), annotate(mount)]
    if poststop is not None:
        out.append(add_poststop_hook(poststop))
    return out


def rewrite(spec: Spec, mount: ContainerMount, poststop: Hook | None = None) -> Spec:
    """A modified copy of ``spec`` that runs on ``mount``; ``spec`` itself never changes."""
    out = copy.deepcopy(spec)
    for modify in modifiers(mount, poststop):
        modify(out)
    return out


def mount_id(spec: dict[str, Any]) -> str | None:
    """The agent mount a config names, if any. Only a config the engine stored from
    Bootseer's own rewrite can be trusted to name it (:func:`annotate` overrides any value
    a container brings); an OCI state's annotations are the container's own."""
    value = (spec.get("annotations") or {}).get(MOUNT_ANNOTATION)
    return value if isinstance(value, str) and value else None


def without_mount_annotation(spec: Spec) -> Spec:
    """``spec`` without the annotation that names a mount: a container that brings one
    itself is naming someone else's (the same object when it has none)."""
    annotations = spec.get("annotations") or {}
    if MOUNT_ANNOTATION not in annotations:
        return spec
    out = copy.deepcopy(spec)
    del out["annotations"][MOUNT_ANNOTATION]
    return out


def root_path(spec: Spec, bundle: str) -> str | None:
    """The container's root as the engine stored it in its config (relative to the
    bundle, as runc reads it)."""
    path = (spec.get("root") or {}).get("path")
    if not isinstance(path, str) or not path:
        return None
    return os.path.normpath(os.path.join(bundle, path))

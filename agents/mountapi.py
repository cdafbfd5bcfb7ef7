"""What the runtime shim and the OCI hook ask of the agent for a container: its lazy root.

``POST /v1/mounts`` with a :class:`MountRequest` gives a :class:`ContainerMount`: a
writable root (an overlay over the lazy image, its hot list already prefetching) and what
the container's OCI config must add to use it. ``DELETE /v1/mounts/{id}`` releases it when
the container stops: the recording ends, the mounts go, and the start's timeline is
complete. Asking twice for the same id gives the same mount (runtimes retry).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

#: Container ids as Docker, podman, containerd and runc spell them.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

RECORD_MODES = ("auto", "always", "never")

#: Where a container finds its checkpoint mounts, one directory per name.
CHECKPOINTS_TARGET = "/mnt/checkpoints"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_id(container_id: str) -> str:
    if not isinstance(container_id, str) or not _ID.fullmatch(container_id):
        raise ValueError(f"container id must match {_ID.pattern}: {container_id!r}")
    return container_id


@dataclass(frozen=True)
class MountRequest:
    id: str  # the container's id (runc/Docker/podman): also the start's id in the timeline
    image: str  # a lazy image's name or id
    workload: str = "default"  # which hot list
    record: str = "auto"  # "auto": while the hot list is young; "always"; "never"
    job: str | None = None  # for `bootseer report`
    runtime: str = "oci"  # who asked: "bootseer-runtime", "bootseer-hook", ...
    #: Checkpoint directories to mount (striped reads), by name: the container sees each
    #: at ``CHECKPOINTS_TARGET/<name>``.
    checkpoints: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_id(self.id)
        if not isinstance(self.checkpoints, dict) or not all(
                isinstance(n, str) and _NAME.fullmatch(n) and isinstance(u, str) and u
                for n, u in self.checkpoints.items()):
            raise ValueError(f"'checkpoints' maps names ({_NAME.pattern}) to store URLs")
        if not isinstance(self.image, str) or not self.image:
            raise ValueError("'image' must name a lazy image")
        if self.record not in RECORD_MODES:
            raise ValueError(f"'record' must be one of {', '.join(RECORD_MODES)}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> MountRequest:
        return cls(id=body.get("id"), image=body.get("image"),
                   workload=str(body.get("workload") or "default"),
                   record=str(body.get("record") or "auto"), job=body.get("job"),
                   runtime=str(body.get("runtime") or "oci"),
                   checkpoints=body.get("checkpoints") or {})


@dataclass(frozen=True)
class ContainerMount:
    """A container's lazy root, and what its OCI config needs to use it."""

    id: str
    image: str
    image_id: str
    rootfs: str  # host path: the overlay to set as the config's root.path (writable)
    signal_dir: str  # host path to bind-mount at ``signal_target`` (ready file, phases)
    signal_target: str = "/run/bootseer"
    #: Variables the container gets (the ready file, the image id for `env run` keys).
    env: dict[str, str] = field(default_factory=dict)
    #: The image's OCI config ("config" of the image config: Env, Cmd, WorkingDir, ...).
    image_config: dict[str, Any] = field(default_factory=dict)
    recording: bool = False  # this start records the hot list
    #: Host directory holding the checkpoint mounts (a shared mount: a checkpoint server
    #: replaced after a crash shows up in the container too), to bind at
    #: ``checkpoints_target`` with slave propagation; None without checkpoints.
    checkpoints_dir: str | None = None
    checkpoints_target: str = CHECKPOINTS_TARGET

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ContainerMount:
        return cls(**{k: body[k] for k in cls.__dataclass_fields__ if k in body})

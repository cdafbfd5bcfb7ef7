"""What the runtime shim and the OCI hook ask of the agent for a container: its lazy root.

``POST /v1/mounts`` with a :class:`MountRequest` gives a :class:`ContainerMount`: a
writable root (an overlay over the lazy image, its hot list already prefetching) and what
the container's OCI config must add to use it. ``DELETE /v1/mounts/{id}`` releases it when
the container stops: the recording ends, the mounts go, and the start's timeline is
complete. Asking twice for the same id gives the same mount (runtimes retry).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from bootseer.agents import fields
from bootseer.agents.fields import (
    COMPONENT,
    CONTAINER_ID,
    IMAGE,
    JOB,
    POD,
    RUNTIME,
    SNAPSHOT_KEY,
)
from bootseer.ready import SIGNAL_DIR

RECORD_MODES = ("auto", "always", "never")

#: Where a container finds its checkpoint mounts, one directory per name.
CHECKPOINTS_TARGET = "/mnt/checkpoints"
#: Mount keys: a container id, and where its engine keeps it (see :func:`mount_key`).
_KEY = CONTAINER_ID


def check_id(container_id: str) -> str:
    """A mount key or a container id, as the API accepts them (``ValueError`` if not)."""
    return fields.name(container_id, "id", _KEY)


def mount_key(container_id: str, namespace: str) -> str:
    """The agent's name for a container's mount: its id, qualified by the engine state it
    lives in (``runc --root``: a containerd namespace, Docker's ``moby``). Two engines, or
    two namespaces of one, may use the same container id; they never share a mount."""
    if not namespace:
        return container_id
    digest = hashlib.sha256(namespace.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"{container_id[:115]}.{digest}"


@dataclass(frozen=True)
class MountRequest:
    id: str  # the container's id, from the engine (runc's argv, podman's hook)
    image: str  # a lazy image's name or id
    workload: str = "default"  # which hot list
    record: str = "auto"  # "auto": while the hot list is young; "always"; "never"
    job: str | None = None  # for `bootseer report`
    runtime: str = "oci"  # who asked: "bootseer-runtime", "bootseer-hook", ...
    #: Checkpoint directories to mount (striped reads), by name: the container sees each
    #: at ``CHECKPOINTS_TARGET/<name>``.
    checkpoints: dict[str, str] = field(default_factory=dict)
    #: Where the engine keeps the container (runc's ``--root``); part of the mount's key.
    namespace: str = ""
    #: Snapshots mounted in the root over the image, the first one on top
    #: (:mod:`bootseer.agents.envs`).
    envs: tuple[str, ...] = ()
    #: The Kubernetes pod (``NAMESPACE/NAME``) the engine created the container for
    #: (:func:`bootseer.agents.oci.pod_of`), for ``bootseer report``.
    pod: str | None = None

    def __post_init__(self) -> None:
        fields.name(self.id, "id", CONTAINER_ID)
        fields.name(self.image, "image", IMAGE)
        fields.name(self.workload, "workload", COMPONENT)
        fields.optional_name(self.job, "job", JOB)
        fields.optional_name(self.pod, "pod", POD)
        fields.name(self.runtime, "runtime", RUNTIME)
        if self.record not in RECORD_MODES:
            raise ValueError(f"'record' must be one of {', '.join(RECORD_MODES)}")
        if not isinstance(self.namespace, str) or len(self.namespace) > fields.MAX_URL:
            raise ValueError("'namespace' must be a path")
        if not isinstance(self.checkpoints, dict) or \
                len(self.checkpoints) > fields.MAX_ITEMS:
            raise ValueError(f"'checkpoints' maps at most {fields.MAX_ITEMS} names "
                             f"({COMPONENT.pattern}) to store URLs")
        for checkpoint, url in self.checkpoints.items():
            fields.name(checkpoint, "checkpoints", COMPONENT)
            fields.url(url, f"checkpoints.{checkpoint}")
        if not isinstance(self.envs, tuple) or len(set(self.envs)) != len(self.envs):
            raise ValueError("'envs' must name each snapshot once")
        fields.names(list(self.envs), "envs", SNAPSHOT_KEY)

    @property
    def key(self) -> str:
        """The mount's name at the agent (:func:`mount_key`)."""
        return mount_key(self.id, self.namespace)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "envs": list(self.envs)}

    @classmethod
    def from_json(cls, body: Any) -> MountRequest:
        body = fields.only(body, {f for f in cls.__dataclass_fields__}, "mount request")
        return cls(id=body.get("id"), image=body.get("image"),
                   workload=_default(body, "workload", "default"),
                   record=_default(body, "record", "auto"), job=body.get("job"),
                   runtime=_default(body, "runtime", "oci"),
                   checkpoints=_default(body, "checkpoints", {}),
                   namespace=_default(body, "namespace", ""), pod=body.get("pod"),
                   envs=fields.names(body.get("envs"), "envs", SNAPSHOT_KEY))


def _default(body: Any, name: str, default: Any) -> Any:
    value = body.get(name)
    return default if value is None else value


@dataclass(frozen=True)
class ContainerMount:
    """A container's lazy root, and what its OCI config needs to use it."""

    id: str
    image: str
    image_id: str
    rootfs: str  # host path: the overlay to set as the config's root.path (writable)
    signal_dir: str  # host path to bind-mount at ``signal_target`` (ready file, phases)
    signal_target: str = SIGNAL_DIR
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


@dataclass(frozen=True)
class PeerRead:
    """``POST /v1/p2p/read`` (root: the node's mount servers): ``length`` bytes at
    ``offset`` of image pack ``pack`` through the swarm of ``job``; 404 means read the
    store (:mod:`bootseer.p2p.demand`)."""

    job: str
    pack: str  # "packs/<sha256 hex>"
    offset: int
    length: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: Any) -> PeerRead:
        # Imported here: the runtime shim and the hook, Python processes on a container's
        # start, import this module and never read through peers.
        from bootseer.p2p.demand import MAX_READ
        from bootseer.prefetch.blockformat import pack_digest

        body = fields.only(body, {"job", "pack", "offset", "length"}, "peer read")
        pack = body.get("pack")
        if not isinstance(pack, str) or pack_digest(pack) is None:
            raise ValueError(f"pack: {pack!r} is not packs/<sha256 hex>")
        offset, length = body.get("offset"), body.get("length")
        if type(offset) is not int or type(length) is not int or offset < 0 or \
                not 0 < length <= MAX_READ:
            raise ValueError(f"offset, length: {offset!r}, {length!r} are not a range of at "
                             f"most {MAX_READ} bytes")
        return cls(fields.name(body.get("job"), "job", JOB), pack, offset, length)


@dataclass(frozen=True)
class PeerFileRead:
    """``POST /v1/p2p/read-file`` (root: the node's checkpoint mount servers): ``length``
    bytes at ``offset`` of the checkpoint file ``url`` as the server found it (``size``
    and ``mtime``: which version) through the swarm of ``job``; 404 means read the store
    (:meth:`bootseer.p2p.demand.DemandReads.read_file`). The agent applies
    ``checkpoint.allowed`` to ``url`` as to a mount's."""

    job: str
    url: str
    size: int
    mtime: float
    offset: int
    length: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: Any) -> PeerFileRead:
        from bootseer.p2p.demand import MAX_READ

        body = fields.only(body, {f for f in cls.__dataclass_fields__}, "peer read")
        size, mtime = body.get("size"), body.get("mtime")
        offset, length = body.get("offset"), body.get("length")
        if type(size) is not int or not 0 <= size < 1 << 63:
            raise ValueError(f"size: {size!r} is not an object's size")
        if type(mtime) not in (int, float) or not math.isfinite(mtime):
            raise ValueError(f"mtime: {mtime!r} is not a time")
        if type(offset) is not int or type(length) is not int or offset < 0 or \
                not 0 < length <= MAX_READ or offset + length > size:
            raise ValueError(f"offset, length: {offset!r}, {length!r} are not a range of at "
                             f"most {MAX_READ} bytes within the file")
        return cls(fields.name(body.get("job"), "job", JOB), fields.url(body.get("url"), "url"),
                   size, float(mtime), offset, length)

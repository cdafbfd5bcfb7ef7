"""Stub engine images: what Docker or podman needs to hold to run a lazy image.

An engine only runs images in its own storage, and the point of a lazy image is not to
pull it there. A stub is a ``docker save`` archive of one empty layer whose config carries
the lazy image's ``Cmd``, ``Entrypoint``, ``Env`` and ``WorkingDir`` (so ``docker run STUB``
means what ``docker run IMAGE`` would) plus ``BOOTSEER_IMAGE=NAME``: Docker 20.10 passes the
runtime neither labels nor annotations, but the environment is in the OCI config, so
``bootseer-runtime`` finds the lazy image there and swaps the empty root for the agent's
lazy one. Without that runtime the stub runs nothing (it has no files), which is the right
failure. The archive loads into Docker (:func:`load_into_docker`, the docker SDK), containerd
(``ctr image import``) and podman (``podman load -i``, which needs
``--annotation io.bootseer.image=NAME`` on top: its hook reads no environment).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from typing import Any

from bootseer.errors import BootseerError
from bootseer.nodecache import NodeCache
from bootseer.prefetch.lazyimage import load_manifest, resolve_image
from bootseer.store import BlobStore

#: The variable that names the lazy image to ``bootseer-runtime`` (see agents/oci.py).
IMAGE_ENV = "BOOTSEER_IMAGE"
#: What an engine's image config may carry over from the lazy image's.
_CARRIED = ("Cmd", "Entrypoint", "Env", "WorkingDir")


@dataclass(frozen=True)
class Stub:
    """A stub image: its tag, its image id (sha256 of its config) and the archive."""

    tag: str
    image_id: str
    archive: bytes


def stub_config(name: str, lazy_config: dict[str, Any]) -> dict[str, Any]:
    """The stub's runtime config: the lazy image's, plus ``BOOTSEER_IMAGE=name``."""
    config = {k: lazy_config[k] for k in _CARRIED if lazy_config.get(k)}
    env = [e for e in config.get("Env") or [] if not e.startswith(IMAGE_ENV + "=")]
    config["Env"] = [*env, f"{IMAGE_ENV}={name}"]
    return config


def _empty_layer() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT):
        pass
    return out.getvalue()


def build_stub(name: str, tag: str, image_config: dict[str, Any]) -> Stub:
    """A ``docker save`` archive of the stub of lazy image ``name`` (image config
    ``image_config``: the whole OCI image config, as the lazy manifest keeps it)."""
    layer = _empty_layer()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": image_config.get("architecture", "amd64"),
        "os": image_config.get("os", "linux"),
        "config": stub_config(name, image_config.get("config") or {}),
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": f"bootseer image docker-stub {name}",
                     "comment": "empty: bootseer-runtime runs the lazy image"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_hex = hashlib.sha256(config_bytes).hexdigest()
    members = {
        f"{config_hex}.json": config_bytes,
        f"{diff_id[7:]}/layer.tar": layer,
        "manifest.json": json.dumps([{"Config": f"{config_hex}.json", "RepoTags": [tag],
                                      "Layers": [f"{diff_id[7:]}/layer.tar"]}]).encode(),
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for member, data in members.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return Stub(tag, "sha256:" + config_hex, out.getvalue())


def lazy_stub(blobs: BlobStore, cache: NodeCache, name: str, tag: str) -> Stub:
    """The stub of the stored lazy image ``name`` (a name or an image id)."""
    try:
        image_id = resolve_image(blobs, name)
    except FileNotFoundError as exc:
        raise BootseerError(f"no lazy image {name!r} in the store; convert it first "
                            f"(bootseer image convert SOURCE --name {name})") from exc
    return build_stub(name, tag, load_manifest(blobs, image_id, cache).config)


def load_into_docker(stub: Stub, docker_host: str | None = None) -> str:
    """Load ``stub`` into the Docker engine at ``docker_host`` (else ``$DOCKER_HOST``, else
    the default socket); the engine's image id."""
    import docker
    from docker.errors import DockerException

    try:
        client = (docker.DockerClient(base_url=docker_host) if docker_host
                  else docker.from_env())
        try:
            (image,) = client.images.load(stub.archive)
            return image.id
        finally:
            client.close()
    except DockerException as exc:
        raise BootseerError(f"could not load the stub image into Docker "
                            f"({docker_host or 'DOCKER_HOST or the default socket'}): {exc}; "
                            f"is dockerd running and reachable?") from exc

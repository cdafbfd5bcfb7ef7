"""Write an OCI image layout directory: ``oci-layout``, ``index.json``, ``blobs/sha256/``.

The layers are already in ``blobs/sha256/`` (see :mod:`bootseer_dev.image.layers`); this
module adds the image config (architecture, os, ``Env``, ``Cmd``, the layers' ``diff_ids``,
one history record per layer), the manifest and the index that names the manifest. The
result is what ``skopeo copy ... oci:DIR`` would write, and what
:func:`bootseer.prefetch.image_source.open_image` reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .layers import LayerBlob

OCI_LAYOUT_VERSION = "1.0.0"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"
CREATED = "org.opencontainers.image.created"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# dpkg architecture → OCI (Go) architecture and variant.
_OCI_ARCH = {"amd64": ("amd64", None), "arm64": ("arm64", "v8"), "armhf": ("arm", "v7"),
             "armel": ("arm", "v5"), "i386": ("386", None), "ppc64el": ("ppc64le", None),
             "s390x": ("s390x", None), "riscv64": ("riscv64", None)}


def host_platform() -> tuple[str, str | None]:
    """The OCI architecture (and variant) of the Debian system we build on and for."""
    dpkg_arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True,
                               text=True, check=True).stdout.strip()
    return _OCI_ARCH.get(dpkg_arch, (dpkg_arch, None))


@dataclass(frozen=True)
class History:
    """One step of the build, for the config's ``history`` (``docker history`` shows it)."""

    created: str  # RFC 3339
    created_by: str
    comment: str = ""


def blob_path(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def _put_json(layout: Path, obj: object, media_type: str) -> dict:
    data = json.dumps(obj, indent=2, sort_keys=True).encode() + b"\n"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = blob_path(layout, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def write_layout(layout: Path, layers: Sequence[LayerBlob], history: Sequence[History], *,
                 cmd: Sequence[str], env: Sequence[str] = (f"PATH={DEFAULT_PATH}",),
                 ref_name: str, created: str, annotations: dict[str, str] | None = None) -> str:
    """Write config, manifest, ``index.json`` and ``oci-layout``; return the manifest digest.

    Every layer in ``layers`` must already be stored under its digest in ``layout``.
    """
    for layer in layers:
        if not blob_path(layout, layer.digest).is_file():
            raise FileNotFoundError(f"{layout}: layer blob {layer.digest} is not stored")
    arch, variant = host_platform()
    platform = {"architecture": arch, "os": "linux"} | ({"variant": variant} if variant else {})
    config = platform | {
        "created": created,
        "config": {"Env": list(env), "Cmd": list(cmd), "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": h.created, "created_by": h.created_by}
                    | ({"comment": h.comment} if h.comment else {}) for h in history],
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": _put_json(layout, config, CONFIG_TYPE),
        "layers": [{"mediaType": LAYER_GZIP_TYPE, "digest": layer.digest, "size": layer.size}
                   for layer in layers],
        "annotations": {CREATED: created} | (annotations or {}),
    }
    manifest_desc = _put_json(layout, manifest, MANIFEST_TYPE)
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": [manifest_desc | {"platform": platform,
                                       "annotations": {REF_NAME: ref_name}}],
    }
    _write_atomic(layout / "index.json", json.dumps(index, indent=2).encode() + b"\n")
    _write_atomic(layout / "oci-layout",
                  json.dumps({"imageLayoutVersion": OCI_LAYOUT_VERSION}).encode() + b"\n")
    return manifest_desc["digest"]


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def append_layer(layout: Path, root: Path, created_by: str, created: str) -> str:
    """Add the files under ``root`` as one more layer on top of the image in ``layout``
    (its only manifest), as a ``COPY root /`` would; return the new manifest's digest.
    The old manifest and config stay as unreferenced blobs."""
    from .layers import full, snapshot, write_layer

    index = json.loads((layout / "index.json").read_text())
    (desc,) = index["manifests"]
    manifest = json.loads(blob_path(layout, desc["digest"]).read_bytes())
    config = json.loads(blob_path(layout, manifest["config"]["digest"]).read_bytes())
    states = snapshot(root)
    tmp = layout / "blobs" / "sha256" / ".append.tmp"
    layer = write_layer(root, full(states), states, tmp)
    os.replace(tmp, blob_path(layout, layer.digest))
    config["rootfs"]["diff_ids"].append(layer.diff_id)
    config["history"].append({"created": created, "created_by": created_by})
    manifest["config"] = _put_json(layout, config, CONFIG_TYPE)
    manifest["layers"].append({"mediaType": LAYER_GZIP_TYPE, "digest": layer.digest,
                               "size": layer.size})
    index["manifests"] = [_put_json(layout, manifest, MANIFEST_TYPE)
                          | {k: v for k, v in desc.items()
                             if k not in ("digest", "size", "mediaType")}]
    _write_atomic(layout / "index.json", json.dumps(index, indent=2).encode() + b"\n")
    return index["manifests"][0]["digest"]

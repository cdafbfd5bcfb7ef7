"""OCI image layouts written by hand from layer tars: blobs, config, manifest, index; shared by
the image-source, manifest-format, lazy-image and FUSE-conformance tests."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import zstandard

from bootseer.prefetch.image_source import (
    OCI_LAYER_GZIP,
    OCI_LAYER_TAR,
    OCI_LAYER_ZSTD,
    OCI_MANIFEST,
)

__all__ = ["COMPRESS", "CONFIG_TYPE", "OCI_LAYER_GZIP", "config_for", "put_blob", "sha",
           "write_image", "write_layout"]

CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
COMPRESS = {OCI_LAYER_TAR: lambda b: b, OCI_LAYER_GZIP: lambda b: gzip.compress(b, mtime=0),
            OCI_LAYER_ZSTD: lambda b: zstandard.ZstdCompressor().compress(b)}


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def config_for(layers: list[bytes], arch: str = "amd64") -> bytes:
    return json.dumps({"architecture": arch, "os": "linux",
                       "config": {"Entrypoint": ["/bin/su"]},
                       "rootfs": {"type": "layers", "diff_ids": [sha(t) for t in layers]}}
                      ).encode()


def put_blob(root: Path, data: bytes, media_type: str, **extra) -> dict:
    path = root / "blobs" / "sha256" / sha(data).removeprefix("sha256:")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"mediaType": media_type, "digest": sha(data), "size": len(data), **extra}


def write_image(root: Path, layers: list[bytes], media_types: list[str], *,
                arch: str = "amd64", **extra) -> dict:
    """Blobs of one image into an OCI layout; returns the manifest's descriptor."""
    config = put_blob(root, config_for(layers, arch), CONFIG_TYPE)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config,
                "layers": [put_blob(root, COMPRESS[m](t), m) for t, m in zip(layers, media_types)]}
    return put_blob(root, json.dumps(manifest).encode(), OCI_MANIFEST,
                     platform={"os": "linux", "architecture": arch}, **extra)


def write_layout(root: Path, manifests: list[dict]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))
    return root

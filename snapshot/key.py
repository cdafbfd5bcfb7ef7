"""The snapshot key: a digest of everything that determines what a command installs.

Two runs with the same key must produce the same environment, so the key covers:

* the **base**: ``$BOOTSEER_IMAGE_ID`` inside a Bootseer container (the image id pins the
  whole root filesystem), else the OS (``ID``, ``VERSION_ID`` of ``/etc/os-release``), the
  Python version, the machine and the libc;
* the command's **argv**, verbatim;
* the **contents** of the key files (requirements, lock files), not their names, so the
  same lock file read through another relative path gives the same key;
* the named **environment variables**, names and values (an unset one differs from an
  empty one);
* the absolute **target paths** (a snapshot restores only where it was captured).

Nothing else: not the working directory, not other environment variables.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bootseer.snapshot.manifest import FORMAT

IMAGE_ID_ENV = "BOOTSEER_IMAGE_ID"
OS_RELEASE = Path("/etc/os-release")


@dataclass(frozen=True)
class KeyInputs:
    argv: tuple[str, ...]
    key_files: tuple[Path, ...] = ()
    env_vars: tuple[str, ...] = ()
    targets: tuple[Path, ...] = ()


def absolute_targets(paths: Sequence[Path | str]) -> tuple[str, ...]:
    """Targets as normalised absolute paths (symlinks in them are left as the user wrote)."""
    return tuple(os.path.abspath(p) for p in paths)


def base_identity(environ: Mapping[str, str]) -> dict[str, Any]:
    image = environ.get(IMAGE_ID_ENV)
    if image:
        return {"image": image}
    release = {}
    if OS_RELEASE.is_file():
        for line in OS_RELEASE.read_text().splitlines():
            name, _, value = line.partition("=")
            if name in ("ID", "VERSION_ID"):
                release[name] = value.strip().strip('"')
    libc, libc_version = platform.libc_ver()
    return {"os": release, "python": platform.python_version(),
            "machine": platform.machine(), "libc": f"{libc} {libc_version}".strip()}


def key_material(inputs: KeyInputs, environ: Mapping[str, str] | None = None
                 ) -> dict[str, Any]:
    """The canonical description that is hashed into the key (shown by ``env key``)."""
    environ = os.environ if environ is None else environ
    files = []
    for path in inputs.key_files:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        files.append("sha256:" + digest.hexdigest())
    return {"format": FORMAT, "base": base_identity(environ), "argv": list(inputs.argv),
            "key_files": files,
            "env": {name: environ.get(name) for name in sorted(set(inputs.env_vars))},
            "targets": list(absolute_targets(inputs.targets))}


def snapshot_key(material: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()

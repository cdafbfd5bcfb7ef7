"""The shim and the hook as the engines run them (this venv's ``bootseer-runtime`` and
``bootseer-hook``), an OCI bundle for runc, and a tool run that fails with its stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bootseer.prefetch.container import bundle_config

BIN = Path(sys.executable).parent
RUNTIME, HOOK = BIN / "bootseer-runtime", BIN / "bootseer-hook"
REPO = Path(__file__).resolve().parents[2]


def run_tool(*cmd: str | Path, env: dict[str, str] | None = None, check: bool = True,
             timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                            env={**os.environ, **(env or {})}, timeout=timeout,
                            stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} exited {result.returncode}: {result.stderr[-3000:]}")
    return result


def write_bundle(path: Path, rootfs: Path, argv: list[str], env: dict[str, str],
                 annotations: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    config = bundle_config(rootfs, argv, {"PATH": "/usr/bin:/bin", **env})
    config["annotations"] = annotations
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path

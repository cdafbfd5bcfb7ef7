"""``env run`` and ``env snapshot``: run a command, capture what it changed, publish it.

``env_run`` restores instead when the key's snapshot exists. A command that fails (exit
status other than 0) publishes nothing: half an install must never be restored elsewhere.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bootseer.errors import BootseerError
from bootseer.nodecache import NodeCache
from bootseer.snapshot.bytecode import compile_sources
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.key import KeyInputs, key_material, snapshot_key
from bootseer.snapshot.manifest import Manifest
from bootseer.snapshot.mount import mount_prestaged, restore_here
from bootseer.snapshot.pack import Capture, build_manifest, creation_info, publish, target_paths
from bootseer.snapshot.restore import OPEN_AHEAD, FirstShards, RestoreResult, load_manifest
from bootseer.snapshot.scan import diff, scan
from bootseer.store import BlobStore

#: In a container: the snapshots the node agent mounted in its root, comma-separated
#: (bootseer.agents.envs): ``env run`` of one of them restores nothing.
MOUNTED_ENVS = "BOOTSEER_ENVS_MOUNTED"


@dataclass(frozen=True)
class CaptureOutcome:
    exit_code: int
    manifest: Manifest | None = None  # None when the command failed
    published: bool = False  # False also when another node published the key first


@dataclass(frozen=True)
class RunOutcome:
    key: str
    capture: CaptureOutcome | None = None  # the command ran
    restored: RestoreResult | None = None  # or the snapshot was restored instead
    mounted_by_agent: bool = False  # or the node agent mounted it in this container


def _run(argv: list[str], environ: Mapping[str, str]) -> int:
    try:
        return subprocess.run(argv, env=dict(environ), check=False).returncode
    except FileNotFoundError:
        raise BootseerError(f"command not found: {argv[0]}") from None
    except PermissionError:
        raise BootseerError(f"command is not executable: {argv[0]}") from None


def capture_command(blobs: BlobStore, key: str, argv: list[str], paths: list[Path], *,
                    environ: Mapping[str, str], options: SnapshotOptions,
                    material: dict[str, Any] | None = None,
                    on_progress: Callable[[int], None] | None = None) -> CaptureOutcome:
    """Run ``argv``; if it succeeds, publish what it changed under ``paths`` as ``key``."""
    targets = target_paths(paths)
    before = [scan(Path(t)) for t in targets]
    code = _run(argv, environ)
    if code != 0:
        return CaptureOutcome(code)
    after = [scan(Path(t)) for t in targets]
    if options.bytecode:
        for target, old, new in zip(targets, before, after):
            sources = [os.path.join(target, rel) for rel in diff(old, new).changed
                       if rel.endswith(".py") and new[rel].kind == "file"]
            compile_sources(target, sources, environ)
        after = [scan(Path(t)) for t in targets]
    for target, old, new in zip(targets, before, after):
        if old and not new:
            raise BootseerError(f"the command removed the target {target}; a snapshot "
                                f"cannot record that (publishing nothing)")
    capture = Capture(targets, tuple(after),
                      tuple(diff(old, new) for old, new in zip(before, after)))
    manifest = build_manifest(blobs, capture, key, creation_info(argv, material),
                              options=options, on_progress=on_progress)
    return CaptureOutcome(code, manifest, publish(blobs, manifest))


def env_run(blobs: BlobStore, inputs: KeyInputs, *, environ: Mapping[str, str],
            options: SnapshotOptions, on_progress: Callable[[int], None] | None = None,
            cache: NodeCache | None = None) -> RunOutcome:
    material = key_material(inputs, environ)
    key = snapshot_key(material)
    if key in environ.get(MOUNTED_ENVS, "").split(","):
        return RunOutcome(key, mounted_by_agent=True)
    mounted = mount_prestaged(cache, key, options)
    if mounted is not None:
        return RunOutcome(key, restored=mounted)
    with FirstShards(options.concurrency + OPEN_AHEAD) as first:
        try:
            manifest = load_manifest(blobs, key, cache, first)
        except FileNotFoundError:
            manifest = None
        if manifest is not None:
            return RunOutcome(key, restored=restore_here(
                blobs, manifest, options=options, on_progress=on_progress,
                cache=cache, first=first))
    outcome = capture_command(blobs, key, list(inputs.argv), list(inputs.targets),
                              environ=environ, options=options, material=material,
                              on_progress=on_progress)
    return RunOutcome(key, capture=outcome)

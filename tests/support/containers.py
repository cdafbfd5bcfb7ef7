"""Commands in a container on a root the node agent mounted (no engine: runc directly)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

from bootseer.agents.mountapi import ContainerMount
from bootseer.mounts import unmount


def run_in(mount: ContainerMount, script: str, timeout: float = 120,
           ) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` in a container on ``mount``, with the image's environment and the
    mount's, its signal directory bound where the container expects it."""
    from bootseer.prefetch.container import run_rootfs

    env = dict(i.split("=", 1) for i in mount.image_config.get("Env", []))
    return run_rootfs(mount.rootfs, ["sh", "-c", script], env=env | mount.env,
                      binds={mount.signal_target: Path(mount.signal_dir)}, timeout=timeout)


def stop_agents(procs: Iterable[subprocess.Popen], cache_dir: Path) -> None:
    """Stop the agents ``procs``, then unmount whatever a failed test left mounted in the
    containers' directories under ``cache_dir`` (each server exits once unmounted)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)
    for container in (cache_dir / "containers").glob("*"):
        for target in ("rootfs", "meta", *(f"checkpoints/{c.name}" for c in
                                           container.glob("checkpoints/*")), "lower"):
            unmount(container / target)

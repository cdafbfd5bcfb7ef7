"""Where the mounts' servers live in the cgroup tree: out of the agent's own cgroup when
that cgroup is killed whole as the agent stops.

Under systemd, ``KillMode=process`` (``deploy/bootseer-agent.service``) stops the agent
alone: its servers, in the same cgroup, serve on until the next agent adopts them. A
Kubernetes DaemonSet has no such setting: when the agent's container stops, its runtime
kills every process of the container's cgroup (with ``hostPID``; without it, every process
of the container's PID namespace too). With ``agent.servers_cgroup`` set, each server
moves itself as it starts (:func:`enter`) into that group, in every cgroup hierarchy
mounted under ``agent.cgroup_root`` (the host's, through a hostPath), where its
container's end does not reach it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from bootseer.errors import BootseerError

#: A group's path below a hierarchy's root: names without "..", "/"-separated.
GROUP = re.compile(r"/?[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")


def hierarchies(root: Path) -> list[Path]:
    """The cgroup hierarchies (v2: one; v1: one per controller set) mounted at or below
    ``root``, as this process's mount namespace sees them."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        point = Path(fields[4])
        if fstype in ("cgroup", "cgroup2") and (point == root or root in point.parents):
            found.append(point)
    return sorted(found)


def make(group: str, root: Path) -> list[Path]:
    """``group`` in every hierarchy under ``root``, made where it is missing: its
    directories."""
    if not GROUP.fullmatch(group):
        raise BootseerError(f"agent.servers_cgroup {group!r} is not a cgroup path such as "
                            f"/bootseer-servers")
    found = hierarchies(root)
    if not found:
        raise BootseerError(f"no cgroup hierarchy is mounted under {root} "
                            f"(agent.cgroup_root)")
    paths = []
    for hierarchy in found:
        path = hierarchy
        for name in group.strip("/").split("/"):
            parent, path = path, path / name
            path.mkdir(exist_ok=True)
            _inherit_cpuset(parent, path)
        paths.append(path)
    return paths


def enter(group: str, root: Path, pid: int | None = None) -> None:
    """Move process ``pid`` (this one by default) into ``group`` in every hierarchy under
    ``root`` (:func:`make`)."""
    for path in make(group, root):
        (path / "cgroup.procs").write_text(str(os.getpid() if pid is None else pid))


def _inherit_cpuset(parent: Path, path: Path) -> None:
    """cgroup v1's cpuset: a new group has no CPUs and no memory nodes, and no process can
    join it, until it is given some: its parent's."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        if (path / name).is_file() and not (path / name).read_text().strip():
            (path / name).write_text((parent / name).read_text())

"""CPU accounting and quotas for the dev tools' processes: a cgroup per lab node or
server, an optional CPU quota on it, and the CPU-seconds it used.

In production every node has CPUs of its own, and so does every origin (a DataNode, the
registry); in the fleet lab they all share this machine's, so what each one costs is only
known if its processes are counted apart, and a cost is only the production one if each
gets the same CPU at every lab size. A node's cgroup holds its agent (and the servers the
agent starts), its Docker engine (and, through the engine's ``cgroup-parent``, its
containers) and the commands run "on" the node (:meth:`bootseer_dev.fleet.Lab.run`); an
origin's holds its server (the dev cluster's JVMs: ``ClusterSpec.cgroups``). Processes
enter at exec time, through :meth:`Hierarchies.enter_argv`, so that everything they
start is inside too.

Both cgroup layouts are handled: v2 (one hierarchy with the ``cpu`` controller:
``cpu.max``, ``cpu.stat``'s ``usage_usec``) and v1 (the ``cpu`` hierarchy for the quota,
``cpuacct`` for the usage; this project's CI machines mount v1 for both). A group is
named by its path below the hierarchy roots, e.g. ``bsl-lab/n3`` (node 3 of the lab
``lab``), which is also what Docker's ``cgroup-parent`` takes (``/bsl-lab/n3``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from bootseer_dev import netns

__all__ = ["CgroupError", "Hierarchies", "PERIOD_US", "placed_argv"]

#: The CPU quota's period (the kernel's default): a quota of q cores is q * PERIOD_US
#: microseconds of CPU in every period.
PERIOD_US = 100_000
CGROUP_ROOT = Path("/sys/fs/cgroup")


class CgroupError(RuntimeError):
    """No cgroup hierarchy with the cpu controller here, or a group without its usage."""


@dataclass(frozen=True)
class Hierarchies:
    """Where the cpu controller and CPU accounting live: one v2 root (both the same), or
    the v1 ``cpu`` and ``cpuacct`` roots (possibly one ``cpu,cpuacct`` mount)."""

    quota_root: Path
    usage_root: Path
    v2: bool
    #: Every cgroup hierarchy mounted: a container engine given a group as its
    #: ``cgroup-parent`` makes it in each (v1: memory, pids, ...), and removal must too.
    every_root: tuple[Path, ...]

    @classmethod
    def find(cls, root: Path = CGROUP_ROOT) -> Hierarchies:
        """The hierarchies of this machine: v2 if its root offers the cpu controller,
        else v1's."""
        mounts = _cgroup_mounts()
        every = tuple(sorted(mounts))
        for v2_root in (root, root / "unified"):
            controllers = v2_root / "cgroup.controllers"
            if controllers.is_file() and "cpu" in controllers.read_text().split():
                return cls(v2_root, v2_root, True, every)
        cpu, cpuacct = (next((m for m, c in mounts.items() if name in c), None)
                        for name in ("cpu", "cpuacct"))
        if cpu is None or cpuacct is None:
            raise CgroupError("no cgroup hierarchy with the cpu controller (v2) or the cpu "
                              "and cpuacct controllers (v1) is mounted")
        return cls(cpu, cpuacct, False, every)

    @property
    def roots(self) -> list[Path]:
        return sorted({self.quota_root, self.usage_root})

    def create(self, group: str, cores: float | None) -> None:
        """Make ``group`` (and its parents) in every hierarchy; with ``cores``, cap it to
        that many cores' worth of CPU time per period."""
        for root in self.roots:
            path = root / group
            if self.v2:  # a child's cpu.max needs cpu enabled in every parent's subtree
                for parent in reversed(path.relative_to(root).parents):
                    _enable_cpu(root / parent)
            path.mkdir(parents=True, exist_ok=True)
        self.set_quota(group, cores)

    def set_quota(self, group: str, cores: float | None) -> None:
        """``cores`` cores' worth of CPU per period for ``group``; None: no limit."""
        path = self.quota_root / group
        quota = -1 if cores is None else max(1000, round(cores * PERIOD_US))
        if self.v2:
            (path / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {PERIOD_US}")
        else:
            (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(quota))

    def usage_s(self, group: str) -> float:
        """CPU-seconds used by every process that ever ran in ``group`` or below it."""
        path = self.usage_root / group
        if self.v2:
            for line in (path / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            raise CgroupError(f"{path}/cpu.stat has no usage_usec")
        return int((path / "cpuacct.usage").read_text()) / 1e9

    def enter_argv(self, group: str) -> list[str]:
        """A prefix for a command line that moves the command into ``group`` (in every
        hierarchy) before it runs, so that all it starts is counted there too."""
        moves = " && ".join(f"echo $$ > {shlex.quote(str(root / group / 'cgroup.procs'))}"
                            for root in self.roots)
        return ["sh", "-c", f'{moves} && exec "$@"', "sh"]

    def pids(self, group: str) -> list[int]:
        """The processes in ``group`` and below it, in any hierarchy."""
        found: set[int] = set()
        for root in self.every_root:
            for procs in (root / group).rglob("cgroup.procs"):
                found.update(int(p) for p in _read(procs).split())
        return sorted(found)

    def remove(self, group: str) -> None:
        """Remove ``group`` and the groups below it (a container's under a node's) in
        every hierarchy, deepest first; it must hold no process any more."""
        for root in self.every_root:
            top = root / group
            if top.is_dir():
                for path in sorted((p for p in top.rglob("*") if p.is_dir()),
                                   key=lambda p: len(p.parts), reverse=True):
                    path.rmdir()
                top.rmdir()


def placed_argv(group: str | None, namespace: str | None) -> list[str]:
    """A prefix that runs a command in cgroup ``group`` (made already), then in network
    namespace ``namespace`` (:func:`bootseer_dev.netns.enter_argv`); either may be None.
    How the lab places a node's commands and every server it starts."""
    return [*(Hierarchies.find().enter_argv(group) if group else []),
            *(netns.enter_argv(namespace) if namespace else [])]


def _cgroup_mounts() -> dict[Path, set[str]]:
    """Every cgroup hierarchy mounted here, with its mount options (v1: its controllers
    among them)."""
    mounts: dict[Path, set[str]] = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, options, *_ = line.split()
        if fstype in ("cgroup", "cgroup2"):
            mounts[Path(point)] = set(options.split(",")) if fstype == "cgroup" else set()
    return mounts


def _enable_cpu(path: Path) -> None:
    control = path / "cgroup.subtree_control"
    if path.is_dir() and "cpu" not in control.read_text().split():
        control.write_text("+cpu")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:  # the group went while it was walked
        return ""

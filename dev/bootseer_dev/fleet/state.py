"""What a lab made, written down before or as it is made, so `down` removes exactly that.

Each item is recorded *before* it is created (a namespace, a link, a qdisc, a cgroup) or as
soon as it exists (a process: its pid is known only then), and the record is rewritten
atomically after every step. A `down` after `up` crashed half-way therefore finds everything that
might exist; removing what does not exist is skipped.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bootseer_dev.cluster.process import ProcessRecord

__all__ = ["Iface", "LabState"]


@dataclass(frozen=True)
class Iface:
    """An interface (veth end or bridge) or the qdisc on one: its namespace and name."""

    netns: str
    dev: str


@dataclass
class LabState:
    """The lab's record (state.json in its state dir)."""

    path: Path
    namespaces: list[str] = field(default_factory=list)
    links: list[Iface] = field(default_factory=list)     # veths (one end each) and bridges
    qdiscs: list[Iface] = field(default_factory=list)    # root htb qdiscs we added
    processes: list[ProcessRecord] = field(default_factory=list)  # agents, origins
    hdfs_state: str | None = None                        # the dev cluster's state dir
    mount_roots: list[str] = field(default_factory=list)  # dirs the agents mount under
    cgroups: list[str] = field(default_factory=list)     # groups made, below each root

    def save(self) -> None:
        data = asdict(self)
        del data["path"]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, path: Path) -> LabState:
        """The record at path; an empty one if there is none."""
        if not path.is_file():
            return cls(path)
        data = json.loads(path.read_text())
        return cls(path=path, namespaces=list(data["namespaces"]),
                   links=[Iface(**i) for i in data["links"]],
                   qdiscs=[Iface(**i) for i in data["qdiscs"]],
                   processes=[ProcessRecord(**r) for r in data["processes"]],
                   hdfs_state=data["hdfs_state"], mount_roots=list(data["mount_roots"]),
                   cgroups=list(data.get("cgroups", [])))

    def add(self, items: list, item) -> None:
        """Record item (in one of this record's lists) and save, before it is created."""
        if item not in items:
            items.append(item)
        self.save()

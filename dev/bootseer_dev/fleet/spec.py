"""What a lab looks like: how many nodes and DataNodes, their caps, and where each lives.

Every address comes from 198.18.0.0/15, the range RFC 2544 reserves for benchmarking, as
one layer-2 segment (the lab switch): the NameNode at 198.18.0.1, DataNode j at
198.18.1.(j+1), the registry at 198.18.2.1 and the wheel index at 198.18.2.2 (the
baselines' origins), node i at 198.19.0.0 + i + 1. Each member's only route is that /15
on its one link, so no packet can leave the lab.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import platformdirs

from bootseer_dev.cluster.units import LinkCap, format_rate

__all__ = ["LAB_NET", "LabSpec", "LabSpecError", "Member", "PRODUCTION_NIC", "default_state_dir"]

LAB_NET = ipaddress.IPv4Network("198.18.0.0/15")
_NAMENODE = ipaddress.IPv4Address("198.18.0.1")
_DATANODES = ipaddress.IPv4Address("198.18.1.0")
_NODES = ipaddress.IPv4Address("198.19.0.0")
_REGISTRY = ipaddress.IPv4Address("198.18.2.1")
_INDEX = ipaddress.IPv4Address("198.18.2.2")
#: The origins' ports: docker-registry's usual one, and the wheel index's HTTP.
REGISTRY_PORT = 5000
INDEX_PORT = 8080
MAX_DATANODES = 254
MAX_NODES = 65000
#: The production NIC the lab stands for (the issue's 25 Gb/s node NICs), in bytes/s.
PRODUCTION_NIC = 25e9 / 8
#: Port of each node agent's /metrics on its node's address (agent.metrics_listen).
METRICS_PORT = 9464
#: Port of each node agent's peer-to-peer session on its node's address (``--p2p``).
P2P_PORT = 6881


def default_state_dir() -> Path:
    """Where `up` records the lab and `status`/`down` find it: the per-user state dir."""
    return Path(platformdirs.user_state_dir("bootseer")) / "fleet"


class LabSpecError(ValueError):
    """An impossible lab (too many nodes, a name that makes bad interface names, ...)."""


@dataclass(frozen=True)
class Member:
    """One thing on the lab switch: its namespace, its address, its end of the switch
    port (the veth in the switch namespace) and the cap on its link (None: uncapped)."""

    role: str           # "node-3", "datanode-0", "namenode"
    netns: str
    address: str
    port: str           # interface name in the switch namespace
    cap: LinkCap | None


@dataclass
class LabSpec:
    """A lab of `nodes` emulated GPU nodes and an HDFS dev cluster of `datanodes`
    DataNodes (0: no HDFS; the nodes then share a file:// store in the state dir)."""

    nodes: int = 2
    datanodes: int = 1
    node_link: LinkCap = field(default_factory=lambda: LinkCap(25e6))
    datanode_link: LinkCap = field(default_factory=lambda: LinkCap(40e6))
    origins: bool = True     # a registry and a wheel index, each on its own capped link
    origin_link: LinkCap = field(default_factory=lambda: LinkCap(40e6))
    name: str = "lab"
    state_dir: Path = field(default_factory=lambda: default_state_dir())
    hdfs_base_port: int = 9000
    block_size: int = 8 << 20
    store: str = ""          # "" = the lab's HDFS (or file store without DataNodes)
    engines: bool = False    # a Docker engine per node, with Bootseer's runtime
    p2p: bool = False        # agents with peer-to-peer on, listening on P2P_PORT
    seed_after_start: float = 30.0  # their p2p.seed_after_start
    #: Each node's CPU quota in cores (its cgroup's), the same at every lab size; None:
    #: no quota (a node's CPU is still counted apart: :mod:`bootseer_dev.cgroups`).
    node_cpu: float | None = None
    #: Each origin's CPU quota in cores (the NameNode, each DataNode, the registry and the
    #: index: a cgroup each); None: no quota (their CPU is still counted apart).
    origin_cpu: float | None = None

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).absolute()
        self.validate()

    def validate(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise LabSpecError(f"--nodes must be in 1..{MAX_NODES}")
        if not 0 <= self.datanodes <= MAX_DATANODES:
            raise LabSpecError(f"--datanodes must be in 0..{MAX_DATANODES}")
        if not self.name.isalnum() or len(self.name) > 8:
            raise LabSpecError(f"lab name {self.name!r}: 1-8 letters or digits (it prefixes "
                               "namespace names)")
        for name, cores in (("--node-cpu", self.node_cpu), ("--origin-cpu", self.origin_cpu)):
            if cores is not None and not 0.01 <= cores <= 1024:
                raise LabSpecError(f"{name} must be in 0.01..1024 cores")
        for cap in (self.node_link, self.datanode_link, self.origin_link):
            if cap.delay_s:
                raise LabSpecError("a link delay needs sch_netem, which this kernel lacks: "
                                   "give a rate only")

    # ------------------------------------------------------------------ placement
    @property
    def switch_netns(self) -> str:
        return f"bsl-{self.name}-sw"

    @property
    def namenode(self) -> Member:
        return Member("namenode", f"bsl-{self.name}-nn", str(_NAMENODE), "nn", None)

    def datanode(self, j: int) -> Member:
        return Member(f"datanode-{j}", f"bsl-{self.name}-dn{j}", str(_DATANODES + j + 1),
                      f"dn{j}", self.datanode_link)

    @property
    def cgroup(self) -> str:
        """The lab's cgroup (below each hierarchy's root), holding one group per node and
        one per origin."""
        return f"bsl-{self.name}"

    def node_cgroup(self, i: int) -> str:
        """Node i's cgroup: every process of the node (:mod:`bootseer_dev.cgroups`)."""
        return f"{self.cgroup}/n{i}"

    def origin_cgroup(self, role: str) -> str:
        """The cgroup of origin ``role`` (the NameNode, a DataNode, the registry, the
        index): its server's processes."""
        return f"{self.cgroup}/{role}"

    def origin_roles(self) -> list[str]:
        """The lab's origins: its HDFS servers, then the registry and the index."""
        return [m.role for m in self.members() if not m.role.startswith("node-")]

    def node(self, i: int) -> Member:
        return Member(f"node-{i}", f"bsl-{self.name}-n{i}", str(_NODES + i + 1), f"n{i}",
                      self.node_link)

    @property
    def registry(self) -> Member:
        return Member("registry", f"bsl-{self.name}-reg", str(_REGISTRY), "reg",
                      self.origin_link)

    @property
    def index(self) -> Member:
        return Member("index", f"bsl-{self.name}-idx", str(_INDEX), "idx", self.origin_link)

    def members(self) -> list[Member]:
        """Everything on the switch: the HDFS servers and origins (if any), the nodes."""
        store = [self.namenode, *map(self.datanode, range(self.datanodes))] \
            if self.datanodes else []
        origins = [self.registry, self.index] if self.origins else []
        return store + origins + [self.node(i) for i in range(self.nodes)]

    @property
    def registry_address(self) -> str:
        """``host:port`` of the lab's registry (plain HTTP: engines call it insecure)."""
        return f"{self.registry.address}:{REGISTRY_PORT}"

    @property
    def index_url(self) -> str:
        """The lab's wheel index, for ``pip install --index-url``."""
        return f"http://{self.index.address}:{INDEX_PORT}/simple/"

    def store_url(self) -> str:
        if self.store:
            return self.store
        if self.datanodes:
            return f"hdfs://{self.namenode.address}:{self.hdfs_base_port}/bootseer"
        return (self.state_dir / "store").as_uri()

    def checkpoint_prefix(self) -> str:
        """The lab's HDFS as a whole: what its nodes' containers may mount as checkpoints
        (``checkpoint.allowed``)."""
        return f"hdfs://{self.namenode.address}:{self.hdfs_base_port}/"

    # ------------------------------------------------------------------ reporting
    def scale_down(self) -> str:
        """One line saying how far the lab's links are below production ones."""
        nic = PRODUCTION_NIC / self.node_link.rate_bytes_per_s
        text = (f"node NIC {format_rate(self.node_link.rate_bytes_per_s)} = 1/{nic:.0f} of a "
                f"25 Gb/s production NIC")
        if self.datanodes:
            dn = PRODUCTION_NIC / self.datanode_link.rate_bytes_per_s
            text += (f"; DataNode {format_rate(self.datanode_link.rate_bytes_per_s)} = "
                     f"1/{dn:.0f} of 25 Gb/s")
        return text + f": shrink artifacts by ~{nic:.0f}x (a 15 GB image -> {15e3 / nic:.0f} MB)"

    def to_json(self) -> str:
        data = asdict(self)
        data.update(state_dir=str(self.state_dir), node_link=self.node_link.to_json(),
                    datanode_link=self.datanode_link.to_json(),
                    origin_link=self.origin_link.to_json())
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LabSpec:
        data = json.loads(text)
        for key in ("node_link", "datanode_link", "origin_link"):
            data[key] = LinkCap.from_json(data[key])
        return cls(**data)

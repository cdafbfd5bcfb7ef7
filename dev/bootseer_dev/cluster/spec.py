"""What a dev cluster looks like: DataNode count, ports, block size, replication, link cap.

The spec is saved in the state dir at start, so `stop`, `status` and `env` (and a second
`start`) know the cluster without the caller repeating its options.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .paths import default_state_dir
from .units import LinkCap

__all__ = ["ClusterSpec", "DataNodePorts", "SpecError"]

MIN_CHECKSUM_CHUNK = 512  # dfs.bytes-per-checksum: the block size must be a multiple of it


class SpecError(ValueError):
    """An impossible cluster spec (bad block size, port clash, ...)."""


@dataclass(frozen=True)
class DataNodePorts:
    """The three ports of one DataNode. xfer serves block reads (RPC clients), http
    serves WebHDFS reads (the NameNode redirects OPEN there), ipc is DataNode admin RPC."""

    xfer: int
    http: int
    ipc: int


@dataclass
class ClusterSpec:
    """A local HDFS 2.7.3 cluster (on 127.0.0.1 unless placed elsewhere): one NameNode and
    `datanodes` DataNodes.

    Default ports are the Hadoop 3 defaults the brief uses (rpc 9000, http 9870, DataNode i
    at xfer 9866+10i, http 9864+10i, ipc 9867+10i). Anyone running a second cluster on the
    machine (tests!) must move them, most easily with ClusterSpec.with_base_port().
    """

    datanodes: int = 1
    state_dir: Path = field(default_factory=default_state_dir)
    namenode_rpc_port: int = 9000
    namenode_http_port: int = 9870
    datanode_port_base: int = 9866
    block_size: int = 128 * 1024 * 1024
    replication: int = 1
    link: LinkCap | None = None
    namenode_heap_mb: int = 512
    datanode_heap_mb: int = 512
    # Dead-DataNode detection takes 2*recheck + 10*heartbeat; Hadoop's default recheck of
    # 5 minutes makes fault tests wait ~10 minutes, 5 s makes it ~20 s.
    heartbeat_recheck_ms: int = 5000
    start_timeout_s: float = 90.0
    #: Where the servers listen: loopback by default. The fleet lab gives each server an
    #: address of its own (`datanode_hosts`, one per DataNode) and runs it in a network
    #: namespace of its own (`netns`: role, e.g. "namenode" or "datanode-0", -> name),
    #: and in a cgroup of its own (`cgroups`: role -> group, made by the caller), so that
    #: its CPU is counted and capped apart (:mod:`bootseer_dev.cgroups`).
    namenode_host: str = "127.0.0.1"
    datanode_hosts: list[str] = field(default_factory=list)
    netns: dict[str, str] = field(default_factory=dict)
    cgroups: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).absolute()
        self.validate()

    @classmethod
    def with_base_port(cls, base_port: int, **kwargs) -> ClusterSpec:
        """Ports from one base: NameNode rpc=base, http=base+1, DataNode i xfer=base+10+10i,
        http=base+8+10i, ipc=base+11+10i."""
        return cls(namenode_rpc_port=base_port, namenode_http_port=base_port + 1,
                   datanode_port_base=base_port + 10, **kwargs)

    def validate(self) -> None:
        if self.datanodes < 1:
            raise SpecError("need at least one DataNode")
        if self.replication < 1 or self.replication > self.datanodes:
            raise SpecError(f"replication {self.replication} must be in 1..{self.datanodes} "
                            "(the number of DataNodes)")
        if self.block_size <= 0 or self.block_size % MIN_CHECKSUM_CHUNK:
            raise SpecError(f"block size {self.block_size} must be a positive multiple of "
                            f"{MIN_CHECKSUM_CHUNK} (dfs.bytes-per-checksum)")
        if self.datanode_hosts and len(self.datanode_hosts) != self.datanodes:
            raise SpecError(f"{len(self.datanode_hosts)} DataNode hosts for "
                            f"{self.datanodes} DataNodes")
        if self.link and self.netns:
            raise SpecError("a link cap shapes lo, which servers in network namespaces do "
                            "not use (the fleet lab caps their own links)")
        ports = self.all_ports()
        if len(set(ports)) != len(ports):
            raise SpecError(f"port clash in {ports}")
        if min(ports) < 1024 or max(ports) > 65535:
            raise SpecError(f"ports must be in 1024..65535, got {min(ports)}..{max(ports)}")

    def datanode_ports(self, i: int) -> DataNodePorts:
        if not 0 <= i < self.datanodes:
            raise IndexError(f"no DataNode {i} (cluster has {self.datanodes})")
        b = self.datanode_port_base + 10 * i
        return DataNodePorts(xfer=b, http=b - 2, ipc=b + 1)

    def datanode_host(self, i: int) -> str:
        """The address DataNode i listens on and registers with."""
        self.datanode_ports(i)  # IndexError for a bad index
        return self.datanode_hosts[i] if self.datanode_hosts else self.namenode_host

    def all_ports(self) -> list[int]:
        ports = [self.namenode_rpc_port, self.namenode_http_port]
        for i in range(self.datanodes):
            p = self.datanode_ports(i)
            ports += [p.xfer, p.http, p.ipc]
        return ports

    def to_json(self) -> str:
        data = asdict(self)
        data["state_dir"] = str(self.state_dir)
        data["link"] = self.link.to_json() if self.link else None
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClusterSpec:
        data = json.loads(text)
        data["link"] = LinkCap.from_json(data.get("link"))
        data["state_dir"] = Path(data["state_dir"])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def same_cluster_as(self, other: ClusterSpec) -> bool:
        """Equal in everything that shapes the running cluster (timeouts do not)."""
        return replace(self, start_timeout_s=0) == replace(other, start_timeout_s=0)

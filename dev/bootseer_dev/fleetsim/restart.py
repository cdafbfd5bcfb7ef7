"""A job restart on N nodes, as flows and waits: what the fleet simulator computes.

Every node runs the same start, in the order a real start goes: its image
(``image_ready``), then its environment (``env_ready``), then its checkpoint (``ready``).
Each phase is a :class:`Phase`: some seconds a node spends on its own (CPU, a process
start, decompression: what does not depend on the network) and some bytes it reads from
an origin, over the origin's uplink and the node's NIC, shared max-min fairly with every
other transfer in flight (:mod:`.network`). An origin is a set of uplinks (a registry is
one; HDFS is its DataNodes, and a read striped over ``spread`` of them is one flow per
DataNode it touches, each 1/spread of the bytes).

Nothing here is a constant of ours: the seconds and bytes of each phase come from a
measured single-node start (:func:`Phase.calibrated`: its measured time, less what its
bytes take at the measured link), and the fleet's links from the parameters a run states.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import simpy

from .network import Link, Network


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float  # the node's own time in this phase (not waiting for bytes)
    bytes: float  # bytes it reads from ``origin``
    origin: str  # which origin serves them
    spread: int = 1  # uplinks of the origin one read is striped over (HDFS DataNodes)

    @classmethod
    def calibrated(cls, name: str, measured_s: float, nbytes: float, origin: str,
                   link_rate: float, spread: int = 1) -> Phase:
        """The phase as one node measured it alone: its own time is what the measured
        time leaves after its bytes crossed the narrowest link at ``link_rate``."""
        return cls(name, max(0.0, measured_s - nbytes / link_rate), nbytes, origin, spread)


@dataclass(frozen=True)
class Origin:
    name: str
    uplinks: int  # e.g. DataNodes
    rate: float  # bytes per second, each


@dataclass(frozen=True)
class Fleet:
    nodes: int
    nic_rate: float  # bytes per second, each node's downlink
    origins: tuple[Origin, ...]


@dataclass
class Outcome:
    """When each node reached each phase (seconds from the restart), and what each origin
    served."""

    phases: list[dict[str, float]] = field(default_factory=list)
    served: dict[str, list[float]] = field(default_factory=dict)

    def ready(self) -> list[float]:
        return [max(times.values(), default=0.0) for times in self.phases]

    def summary(self) -> dict[str, float]:
        ready = sorted(self.ready())
        return {"p50_s": statistics.median(ready), "max_s": ready[-1],
                "origin_max_over_mean": max(
                    (max(v) / statistics.mean(v) for v in self.served.values()
                     if statistics.mean(v) > 0), default=1.0)}


def simulate(fleet: Fleet, phases: list[Phase]) -> Outcome:
    """Every node of ``fleet`` starts at t = 0 and goes through ``phases`` in order."""
    env = simpy.Environment()
    network = Network(env)
    uplinks = {o.name: [Link(f"{o.name}{i}", o.rate) for i in range(o.uplinks)]
               for o in fleet.origins}
    unknown = {p.origin for p in phases} - set(uplinks)
    if unknown:
        raise ValueError(f"phases read from origins the fleet lacks: {sorted(unknown)}")
    outcome = Outcome(phases=[{} for _ in range(fleet.nodes)])

    def node(index: int):
        nic = Link(f"node{index}", fleet.nic_rate)
        for phase in phases:
            yield env.timeout(phase.seconds)
            links = uplinks[phase.origin]
            spread = min(phase.spread, len(links))
            first = (index * spread) % len(links)  # readers spread over the uplinks
            yield simpy.AllOf(env, [network.transfer(phase.bytes / spread,
                                                     [links[(first + k) % len(links)], nic])
                                    for k in range(spread)])
            outcome.phases[index][phase.name] = env.now

    for index in range(fleet.nodes):
        env.process(node(index))
    env.run()
    outcome.served = {name: [link.carried for link in links]
                      for name, links in uplinks.items()}
    return outcome

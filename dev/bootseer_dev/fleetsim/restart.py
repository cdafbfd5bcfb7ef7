"""A job restart on N nodes, as flows and waits: what the fleet simulator computes.

Every node starts at t = 0 and runs the same **phases** in order (a start: image,
environment, process, imports, checkpoint; then the container's teardown). A
:class:`Phase` is the node's own work (its seconds alone: CPU, process starts,
decompression, on ``cores`` cores) and then, if it has one, a :class:`Fetch`: bytes read
from an origin (or, ``upload``, written to it), striped (``spread > 1``) or one stream,
one flow per uplink it uses, each over the node's NIC, all shared max-min fairly with
every other flow in flight (:mod:`.network`). Which uplinks, and how many bytes from each,
is :mod:`.placement` 's: an HDFS origin's blocks sit on DataNodes drawn at random and each
reader draws a replica of each; other origins' readers are dealt over their uplinks in
turn, as a balancer spreads clients.

* **CPU pool** (``Fleet.cpus``): in the lab every node shares a few cores, of which an
  idle load (``Fleet.cpu_idle``: other processes' share) is not theirs. A phase's own work
  is then ``seconds x cores`` core-seconds, a flow over a ``cpu`` link of the pool's
  core-seconds per second and the task's own link of ``cores`` (a node's start is several
  processes and threads: it keeps up to ``cores`` busy): processor sharing, by the same
  progressive filling. Alone, a phase takes its seconds; two nodes of 2 core-seconds on
  2 threads each, on 2 cores, take 2 s (tested). Without a pool (production) each task
  has its cores to itself and takes its seconds.
* **A node's own cores** (``Fleet.node_cpus``): a CPU budget per node (the lab's
  cgroup quota, ``--node-cpu``; a production node's cores): every task of the node (its
  start, its warm) crosses one link of that many core-seconds per second, whatever the
  other nodes do (tested: a start and a warm of 1 core each on a node of 1 core take twice
  as long as alone).
* **Pipelining** (``Phase.paced``): the part of a step's own work done on its bytes as
  they arrive (its per-byte work: decompressing, checking, writing) runs beside its fetch,
  the rest (process and container starts, resolution: its fixed work) before it; the step
  ends when its bytes are in and that work is done. Alone on a node that is CPU-bound, a
  phase then takes its own seconds whatever the link; at N nodes its bytes slow it only
  once their share of the origins is slower than its work on them.
* **Teardown** (``Phase.teardown``): a phase after the node is ready (the container's
  removal once the job exits): its work loads the cores, its mark is not time to ready.
* **Warm overlap** (:class:`Warm`): a background task started at t = 0 on every node (the
  agent's ``warm``): its fetches one after another, in order (the agent stages the image,
  the environments, then the checkpoints), then its own work on them (unpacking, keeping
  the image's files whole: at a node's CPU budget, most of a warm). A phase whose fetch is
  of an artifact already in flight on its node waits for that flow instead of starting
  another: the bytes cross the network once, and the phase ends at the later of its own
  work and their arrival (plus its ``after`` seconds). The node's mark ``warm`` is when
  the warm ended.
* **Peers** (``Fetch.peers``, ``bootseer warm --job``): the M nodes that read the same
  part of an artifact are a swarm; member k reads pieces p % M == k from the origin, the
  rest from the others. So each node reads 1/M of its bytes from the origin (placed as a
  read of the whole, scaled) and (M - 1)/M in one flow over its NIC and a share of every
  other member's uplink (``nic_up``, and ``Fleet.peer_upload``'s cap, p2p.upload_rate):
  the others send it equal parts. The origin serves each part about once, whatever M.
  Each object of the artifact fetched in turn (``Fetch.rounds``: a hot pack after its
  image's manifest and hot list) first waits ``Fleet.swarm_settle`` for its members (the
  agent's fetch looks for their piece lists before it picks its store reads). Not
  modelled: that a piece must reach a member from the origin before it can be sent on (no
  wait for it: the peer flow may run ahead of the origin reads that feed it), that a
  member not yet fetching has nothing to send, and the CPU a node spends sending.
* **Node classes**: nodes that move the same bytes over the same uplinks of every origin
  behave identically (max-min shares are symmetric), so each class is simulated once, as
  flows of weight ``members`` over class links of ``members`` times a node's capacity.
  Per-node simulation (``grouped=False``) gives the same answer, slower; a test holds them
  equal. (Beyond a few nodes, :mod:`.placement` takes the readers' replica draws at what
  they average to, so that nodes still fall into few classes.)

Nothing here is a constant of ours: own seconds and bytes come from the lab
(:mod:`.calibrate`) or from stated production parameters (:mod:`.production`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, replace

import simpy

from .network import Link, Network
from .peers import Swarms
from .placement import Layout, Placement


@dataclass(frozen=True)
class Fetch:
    """Bytes of one artifact a node moves from (or, ``upload``, to) an origin."""

    artifact: str  # two fetches of one artifact on one node share one transfer
    bytes: float
    origin: str
    spread: int = 1  # uplinks of the origin it is striped over; 1: one stream
    upload: bool = False
    pieces: int = 1  # distinct parts of it the nodes read: node i reads part i % pieces
    fanout: bool = False  # its replication raised for the job's nodes (``bootseer job fanout``)
    peers: bool = False  # shared with the nodes that read its part (the job's swarm)
    rounds: int = 1  # objects of it fetched one after another (each settles in a swarm)

    def __post_init__(self) -> None:
        if self.peers and self.upload:
            raise ValueError("peers share what they read, not what they upload")


@dataclass(frozen=True)
class Phase:
    """A step of a start: its own seconds, then its bytes (if any) must be there while it
    does ``paced`` own seconds more beside them, then ``after`` own seconds more (what a
    prefetched step does once its bytes are in). Its own work keeps ``cores`` cores busy
    (a node's start is several processes and threads)."""

    name: str
    seconds: float
    fetch: Fetch | None = None
    after: float = 0.0
    cores: float = 1.0
    teardown: bool = False  # after the node is ready: it loads the cores, not time to ready
    #: Own seconds of work on the bytes as they arrive (a stream's decompression, checks
    #: and writes): it runs beside the fetch, and the phase waits for both.
    paced: float = 0.0


@dataclass(frozen=True)
class Warm:
    """A background task at t = 0: its fetches one after another (the agent's warm stages
    the image, then the environments, then the checkpoints), then its own seconds (what
    it does with them: unpacking the snapshot, keeping the image's files whole)."""

    seconds: float
    fetches: tuple[Fetch, ...]
    cores: float = 1.0


@dataclass(frozen=True)
class Origin:
    name: str
    uplinks: int  # e.g. DataNodes
    rate: float  # bytes per second, each, either way (the lab caps both ways alike)
    placement: Placement | None = None  # HDFS blocks on the uplinks; None: readers in turn


@dataclass(frozen=True)
class Fleet:
    nodes: int
    nic_rate: float  # bytes per second, each node's NIC, either way
    origins: tuple[Origin, ...]
    cpus: float | None = None  # cores all nodes share (the lab); None: each has its own
    node_cpus: float | None = None  # cores each node has to itself (a quota); None: any
    cpu_idle: float = 0.0  # of the shared cores, the share busy with other work (idle load)
    peer_upload: float | None = None  # bytes/s a node sends its peers at most; None: its NIC
    #: Seconds a swarm fetch (of more than one member) waits for its members before its
    #: store reads start, per object fetched in turn (``Fetch.rounds``).
    swarm_settle: float = 0.0

    @property
    def pool(self) -> float | None:
        """The core-seconds per second the nodes' work can have of the shared cores."""
        return self.cpus * (1 - self.cpu_idle) if self.cpus else None

    def origin(self, name: str) -> Origin:
        for origin in self.origins:
            if origin.name == name:
                return origin
        raise ValueError(f"the fleet has no origin {name!r}")

    def alone_s(self, fetch: Fetch) -> float:
        """Seconds one node alone takes for ``fetch``: its bytes over its NIC and the
        uplinks it reads them from (node 0's, as placed), no other work."""
        alone = replace(self, nodes=1, cpus=None, cpu_idle=0.0, node_cpus=None)
        return simulate(alone, [Phase("alone", 0.0, fetch)]).marks[0]["alone"]


@dataclass
class Outcome:
    """When each node reached each mark (seconds from t = 0: its phases' names, ``warm``,
    and ``fetched:ARTIFACT`` for each fetch's arrival), the bytes each origin uplink served,
    how long each resource's busiest link was full, and the shared cores' use."""

    marks: list[dict[str, float]]
    served: dict[str, list[float]]  # origin (or "ORIGIN_in": uploads) -> bytes per uplink
    full_s: dict[str, float]  # resource -> seconds its busiest link was full
    # The cores' busy share from t = 0 to the last mark, idle load included (the lab's
    # cpu_busy); None: no shared pool.
    cpu_used: float | None = None
    teardown: frozenset[str] = frozenset()  # marks after ready (not time to ready)
    peer_bytes: float = 0.0  # bytes the nodes received from each other

    def ready(self) -> list[float]:
        """Each node's time to ready: its last mark but a teardown's (a start and its warm
        both count)."""
        return [max((t for m, t in marks.items() if m not in self.teardown), default=0.0)
                for marks in self.marks]

    def summary(self) -> dict:
        """p50/p99/max of ready, bytes served per origin and its busiest uplink's over their
        mean (``max_over_mean``, the largest as ``origin_max_over_mean``), and what limited
        the restart: the
        resource whose busiest link was full for the largest share of the run, teardowns
        included (``own``: a task's cores, i.e. own work; ``cpu``: the shared pool;
        ``node_cpu``: a node's own cores;
        ``nic``/``nic_up``; an origin's uplinks; ``ORIGIN_in``: its downlinks, for
        uploads)."""
        ready = self.ready()
        job = max(ready)
        wall = max(max(marks.values(), default=0.0) for marks in self.marks)
        busy = {name: seconds / wall for name, seconds in self.full_s.items()
                if seconds > 0 and wall > 0}
        balance = {origin: max(v) / statistics.mean(v) for origin, v in self.served.items()
                   if statistics.mean(v) > 0}
        summary = {"p50_s": statistics.median(ready), "p99_s": percentile(ready, 99),
                   "max_s": job, "served_bytes": {k: sum(v) for k, v in self.served.items()},
                   "max_over_mean": balance,
                   "origin_max_over_mean": max(balance.values(), default=1.0),
                   "peer_bytes": self.peer_bytes,
                   "limited_by": max(busy, key=busy.__getitem__) if busy else None,
                   "busy": {k: round(v, 4) for k, v in sorted(busy.items(),
                                                              key=lambda kv: -kv[1])}}
        if self.cpu_used is not None:
            summary["cpu_used"] = self.cpu_used
        return summary


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def node_classes(fleet: Fleet, fetches: list[Fetch]) -> list[list[int]]:
    """Nodes grouped by the bytes they move over each uplink (:mod:`.placement`): each
    group behaves as one node."""
    return Layout(fleet, fetches).classes()


def simulate(fleet: Fleet, phases: list[Phase], warm: Warm | None = None,
             grouped: bool = True) -> Outcome:
    """Every node of ``fleet`` starts at t = 0, runs ``phases`` in order and, if given,
    ``warm`` beside them."""
    env = simpy.Environment()
    network = Network(env)
    fetches = [p.fetch for p in phases if p.fetch] + list(warm.fetches if warm else ())
    uplinks = {(o.name, upload): [Link(f"{o.name}{i}", o.rate) for i in range(o.uplinks)]
               for o in fleet.origins for upload in (False, True)}
    layout = Layout(fleet, fetches)
    classes = layout.classes() if grouped else [[i] for i in range(fleet.nodes)]
    pool = Link("cpu", fleet.pool) if fleet.pool else None
    resources: dict[str, list[Link]] = defaultdict(list)
    for (origin, upload), links in uplinks.items():
        resources[f"{origin}_in" if upload else origin] = links
    if pool:
        resources["cpu"] = [pool]
    node_cpus = [Link(f"node_cpu{index}", len(members) * fleet.node_cpus)
                 for index, members in enumerate(classes)] if fleet.node_cpus else None
    if node_cpus:
        resources["node_cpu"] = node_cpus
    nics = [{up: Link(f"nic{'_up' if up else ''}{index}", len(members) * fleet.nic_rate)
             for up in (False, True)} for index, members in enumerate(classes)]
    resources["nic"] = [nic[False] for nic in nics]
    resources["nic_up"] = [nic[True] for nic in nics]
    if fleet.peer_upload:
        resources["p2p_up"] = [Link(f"p2p_up{index}", len(members) * fleet.peer_upload)
                               for index, members in enumerate(classes)]
    swarms = Swarms(layout, classes, resources["nic_up"], resources.get("p2p_up"))
    class_marks: list[dict[str, float]] = [{} for _ in classes]
    from_peers = [0.0]  # bytes the nodes received from each other

    def node_class(index: int, members: list[int]):
        weight, nic = len(members), nics[index]
        in_flight: dict[str, simpy.Event] = {}

        def task() -> Link:
            """A task's own cores: as many as its running phase keeps busy at most."""
            link = Link(f"own{index}", weight)
            resources["own"].append(link)
            return link

        def own(seconds: float, cores: float, mine: Link) -> simpy.Event:
            """``seconds`` of work on ``cores`` cores: that many core-seconds, at most
            ``cores`` at a time (the task's link has no other flow: its phases are in turn)."""
            mine.capacity = cores * weight
            shared = [link for link in (pool, node_cpus[index] if node_cpus else None) if link]
            return network.transfer(seconds * cores, [mine, *shared], weight)

        def arrived(artifact: str) -> None:
            class_marks[index][f"fetched:{artifact}"] = env.now

        def one_by_one(routes, links: list[Link], mine: Link, share: float):
            for uplink, nbytes in routes:
                yield network.transfer(nbytes * share, [links[uplink], mine], weight)

        def moving(f: Fetch, swarm: int):
            """Its flows: its share of the origin (1 / swarm), and from a swarm the rest
            from the other members, after the swarm's settle wait."""
            if swarm > 1 and fleet.swarm_settle > 0:
                yield env.timeout(fleet.swarm_settle * f.rounds)
            links, routes = uplinks[f.origin, f.upload], layout.routes(f, members[0])
            if layout.sequential(f):
                flows = [env.process(one_by_one(routes, links, nic[f.upload], 1 / swarm))]
            else:
                flows = [network.transfer(nbytes / swarm, [links[uplink], nic[f.upload]],
                                          weight) for uplink, nbytes in routes]
            if swarm > 1:  # the rest from the other members, a share of each uplink
                path, shares = swarms.path(f, index)
                nbytes = f.bytes * (swarm - 1) / swarm
                flows.append(network.transfer(nbytes, [nic[False], *path], weight,
                                              (1.0, *shares)))
                from_peers[0] += nbytes * weight
            yield simpy.AllOf(env, flows)

        def fetch(f: Fetch) -> simpy.Event:
            if f.artifact not in in_flight:
                done = env.process(moving(f, layout.members(f, members[0])))
                done.callbacks.append(lambda _, artifact=f.artifact: arrived(artifact))
                in_flight[f.artifact] = done
            return in_flight[f.artifact]

        def start():
            mine = task()
            for phase in phases:
                yield own(phase.seconds, phase.cores, mine)
                beside = own(phase.paced, phase.cores, mine)
                yield simpy.AllOf(env, [fetch(phase.fetch), beside]) if phase.fetch else beside
                yield own(phase.after, phase.cores, mine)
                class_marks[index][phase.name] = env.now

        def warming():
            for f in warm.fetches:
                yield fetch(f)
            yield own(warm.seconds, warm.cores, task())
            class_marks[index]["warm"] = env.now

        env.process(start())
        if warm:
            env.process(warming())

    for index, members in enumerate(classes):
        node_class(index, members)
    env.run()
    marks: list[dict[str, float]] = [{} for _ in range(fleet.nodes)]
    for index, members in enumerate(classes):
        for node in members:
            marks[node] = class_marks[index]
    served = {name: [link.carried for link in links]
              for (name, upload), links in uplinks.items() if not upload}
    served.update({f"{name}_in": [link.carried for link in links]
                   for (name, upload), links in uplinks.items()
                   if upload and any(link.carried for link in links)})
    full_s = {name: max(link.full_s for link in links)
              for name, links in resources.items() if links}
    wall = max((max(m.values(), default=0.0) for m in class_marks), default=0.0)
    cpu_used = (pool.carried / (fleet.cpus * wall) + fleet.cpu_idle
                if pool and wall else None)
    return Outcome(marks, served, full_s, cpu_used,
                   frozenset(p.name for p in phases if p.teardown), from_peers[0])

"""Which uplinks a node's bytes leave from: HDFS blocks on DataNodes, or uplinks in turn.

**HDFS** (an :class:`.restart.Origin` with a :class:`Placement`): an artifact is a
sequence of blocks (``block_size``; the lab dict knows an artifact's bytes, not its files,
so B bytes are ceil(B / block size) blocks of equal size). Each block has ``replication``
replicas on distinct DataNodes drawn at random with a seeded RNG (HDFS's default placement
for a writer outside the cluster is random), and a reader reads each block from one of its
replicas drawn at random (the HDFS client tries a block's replicas in random order when
none is local). A block's bytes then leave that DataNode's uplink. A node reads part
``node % Fetch.pieces`` of an artifact (a checkpoint's data-parallel shards: each part is
read by every ``pieces``-th node, its blocks distinct from the other parts'). A striped
read (``spread > 1``) reads all its blocks at once: one flow per DataNode it reads from,
its bytes summed; a one-stream read (``spread == 1``) reads them one after another, in
order. **Fan-out** (``Fetch.fanout``): ``bootseer job fanout`` raised the artifact's
replication to :func:`bootseer.agents.fanout.replicas_for` the job's nodes, as the command
does for every object it names (checkpoints included); the added replicas join the ones
there were (the same draw, extended), and there are never more than the DataNodes.

Up to ``exact_nodes`` nodes every reader draws its replicas, as above. Beyond, drawing per
node would make every node unique (a class of its own: thousands of flows), so the
readers' draws are taken at what they average to over many readers: a striped read takes
each block's bytes evenly from its replicas, and the nodes of a one-stream read are dealt
over a block's replicas in turn (node ``i`` of a part takes replica ``i mod replication``).
Where the replicas are (the draw that makes DataNodes uneven) is still drawn. Nodes that
read alike form one class (:mod:`.restart`), so a restart has a class per part (and per
replica turn), whatever N.

**Other origins** (a registry's frontends, an index mirror) and uploads: a one-stream
read or upload is on one uplink, the nodes dealt over the uplinks in turn; a striped one
is spread evenly over ``spread`` uplinks from there.

**Peers** (``Fetch.peers``): the nodes that read the same part of an artifact are one
swarm (:meth:`Layout.members`); each reads its share of the pieces from the origin (the
routes above, scaled by :mod:`.restart`) and the rest from the others.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bootseer.agents.fanout import replicas_for

if TYPE_CHECKING:
    from .restart import Fetch, Fleet

#: (uplink index, bytes) in the order they are read.
Routes = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Placement:
    """How an origin keeps what it serves: HDFS blocks with replicas on its uplinks."""

    block_size: float  # bytes
    replication: int = 1  # replicas of each block (HDFS's dfs.replication)
    readers_per_replica: int = 4  # the fan-out's (``bootseer job fanout``'s default)
    max_replicas: int | None = None  # the fan-out's bound; None: the DataNodes
    seed: int = 0  # of every draw: the same seed, the same placement and reads
    exact_nodes: int = 16  # up to this many nodes, each reader draws its replicas

    def replicas(self, nodes: int, datanodes: int, fanout: bool = False) -> int:
        """Replicas of each block of an artifact ``nodes`` nodes read (raised by the
        fan-out if ``fanout``), at most the DataNodes."""
        wanted = self.replication
        if fanout:
            wanted = max(wanted, replicas_for(nodes, self.readers_per_replica,
                                              self.max_replicas or datanodes))
        return min(wanted, datanodes)

    def blocks(self, nbytes: float) -> list[float]:
        """The sizes of an artifact's blocks: ceil(bytes / block size), all equal."""
        count = math.ceil(nbytes / self.block_size)
        return [nbytes / count] * count if count else []

    def holders(self, artifact: str, part: int, blocks: int, datanodes: int
                ) -> tuple[tuple[int, ...], ...]:
        """Every DataNode in a random order, per block: its first r hold the block's r
        replicas (so raising the replication adds replicas to the ones there were)."""
        rng = random.Random(f"{self.seed}/{artifact}/{part}")
        orders = []
        for _ in range(blocks):
            order = list(range(datanodes))
            rng.shuffle(order)
            orders.append(tuple(order))
        return tuple(orders)


class Layout:
    """Where each node of ``fleet`` reads (or writes) each of ``fetches`` from, and the
    classes of nodes that read alike."""

    def __init__(self, fleet: Fleet, fetches: list[Fetch]) -> None:
        self.fleet = fleet
        self.fetches = fetches
        self._parts = math.lcm(1, *(f.pieces for f in fetches if self.placed(f)))
        # Replica turns a one-stream read deals its nodes over (beyond exact_nodes).
        self._turns = max((self.replicas(f) for f in fetches
                           if self.placed(f) and f.spread == 1), default=1)
        self._routes: dict[tuple, Routes] = {}

    def placed(self, fetch: Fetch) -> bool:
        """A read from an origin that keeps blocks (uploads are spread in turn)."""
        return self.fleet.origin(fetch.origin).placement is not None and not fetch.upload

    def replicas(self, fetch: Fetch) -> int:
        origin = self.fleet.origin(fetch.origin)
        return origin.placement.replicas(self.fleet.nodes, origin.uplinks, fetch.fanout)

    def sequential(self, fetch: Fetch) -> bool:
        """Its routes are read one after another (a one-stream read of blocks)."""
        return self.placed(fetch) and fetch.spread == 1

    def exact(self, fetch: Fetch) -> bool:
        """Each reader draws its own replicas (few nodes)."""
        return self.fleet.nodes <= self.fleet.origin(fetch.origin).placement.exact_nodes

    def routes(self, fetch: Fetch, node: int) -> Routes:
        """The uplinks ``node`` moves ``fetch`` 's bytes over, and how many bytes each."""
        origin = self.fleet.origin(fetch.origin)
        if not self.placed(fetch):
            spread = min(fetch.spread, origin.uplinks)
            first = (node * spread) % origin.uplinks
            return tuple(((first + k) % origin.uplinks, fetch.bytes / spread)
                         for k in range(spread))
        part = node % fetch.pieces
        reader = (node if self.exact(fetch) else
                  (node // self._parts) % self._turns if self.sequential(fetch) else None)
        key = (fetch.artifact, fetch.bytes, fetch.spread, fetch.fanout, part, reader)
        if key not in self._routes:
            self._routes[key] = self._read(fetch, part, reader)
        return self._routes[key]

    def _read(self, fetch: Fetch, part: int, reader: int | None) -> Routes:
        origin = self.fleet.origin(fetch.origin)
        placement, replicas = origin.placement, self.replicas(fetch)
        sizes = placement.blocks(fetch.bytes)
        holders = placement.holders(fetch.artifact, part, len(sizes), origin.uplinks)
        if reader is not None and self.exact(fetch):  # this reader's own draws
            rng = random.Random(f"{placement.seed}/{fetch.artifact}/{part}/reader{reader}")
            picks = [((h[rng.randrange(replicas)], size),) for h, size in zip(holders, sizes)]
        elif reader is not None:  # its turn among the part's readers
            picks = [((h[reader % replicas], size),) for h, size in zip(holders, sizes)]
        else:  # many readers' draws: each replica serves its share of them
            picks = [tuple((d, size / replicas) for d in h[:replicas])
                     for h, size in zip(holders, sizes)]
        if self.sequential(fetch):  # in order, a run of blocks on one DataNode as one
            runs: list[list] = []
            for (datanode, size), in picks:
                if runs and runs[-1][0] == datanode:
                    runs[-1][1] += size
                else:
                    runs.append([datanode, size])
            return tuple((d, b) for d, b in runs)
        per_datanode: dict[int, float] = defaultdict(float)
        for pick in picks:
            for datanode, size in pick:
                per_datanode[datanode] += size
        return tuple(sorted(per_datanode.items()))

    def members(self, fetch: Fetch, node: int) -> int:
        """The nodes of ``node`` 's swarm for ``fetch``: those that read its part (every
        ``pieces``-th node), when it is shared between peers; else 1 (itself)."""
        if not fetch.peers:
            return 1
        return len(range(node % fetch.pieces, self.fleet.nodes, fetch.pieces))

    def classes(self) -> list[list[int]]:
        """Nodes grouped by what they read from where (and, for a fetch shared between
        peers, in which swarm): each group behaves as one node (max-min shares are
        symmetric)."""
        groups: dict[tuple, list[int]] = defaultdict(list)
        for node in range(self.fleet.nodes):
            groups[tuple((self.routes(f, node), node % f.pieces if f.peers else None)
                         for f in self.fetches)].append(node)
        return list(groups.values())

    def served(self, origin: str) -> list[float]:
        """The bytes each uplink of ``origin`` serves for the nodes' reads (each artifact
        once per node, or its share of a swarm's), without simulating: the placement's
        answer alone."""
        served = [0.0] * self.fleet.origin(origin).uplinks
        reads = {f.artifact: f for f in self.fetches if f.origin == origin and not f.upload}
        for node in range(self.fleet.nodes):
            for fetch in reads.values():
                for uplink, nbytes in self.routes(fetch, node):
                    served[uplink] += nbytes / self.members(fetch, node)
        return served

"""Bytes over shared links, at flow level: every active flow gets its max-min fair rate.

A transfer of a restart (a node reading its hot pack from a DataNode, a checkpoint stripe,
an image layer from the registry) is a :class:`Flow` of some bytes over a path of
:class:`Link` s: the origin's uplink, the node's NIC, whatever lies between. Packets are
not modelled; rates are. Whenever a flow starts or ends, every flow's rate is recomputed
by progressive filling (the max-min fair allocation: raise all rates together, freeze the
flows of each link that fills, go on with the rest), which is what TCP flows sharing
bottlenecks converge to, and what the lab's tc-capped links enforce.

The event loop is SimPy's: ``yield network.transfer(bytes, path)`` from a SimPy process
waits until those bytes have arrived. Times are seconds, sizes bytes, capacities bytes per
second; no latency is modelled (the lab adds none either: its kernel has no netem). The
same arithmetic shares any capacity: CPU cores are a link of core-seconds per second.

A flow may stand for ``weight`` identical flows (a class of identical nodes, each with its
own NIC): it takes ``weight`` times its rate from every link it crosses, and a link of the
class (its NICs) has ``weight`` times one member's capacity, so each member gets exactly
what it would have had as a flow of its own: max-min shares are symmetric.

A flow may cross a link **in part** (its ``shares``, one per link of its path, 1 by
default): it loads that link with only that share of its rate. A node's download from
its job's other nodes (:mod:`.restart`'s peers) is one flow over its own NIC and a share
of each other node's uplink: its bytes come from all of them at once.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import simpy

#: Bytes a flow may have left and still count as done (float rounding of rate × time).
EPSILON = 1e-6


@dataclass(eq=False)
class Link:
    """A capacity shared by the flows crossing it; counts the bytes it carried and the
    seconds it was full (what tells a bottleneck)."""

    name: str
    capacity: float  # bytes per second
    carried: float = 0.0
    full_s: float = 0.0


@dataclass(eq=False)
class Flow:
    size: float  # per member
    path: tuple[Link, ...]
    done: simpy.Event
    weight: int = 1  # identical flows it stands for
    shares: tuple[float, ...] = ()  # of each link of path, the share it loads (empty: 1s)
    remaining: float = field(init=False)
    rate: float = 0.0
    started: float = 0.0

    def __post_init__(self) -> None:
        self.remaining = self.size
        self.shares = self.shares or (1.0,) * len(self.path)

    def crossings(self) -> Iterator[tuple[Link, float]]:
        """(link, share) for each link of its path."""
        return zip(self.path, self.shares)


class Network:
    """The flows in progress on a set of links, advanced by one SimPy process."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.flows: list[Flow] = []
        self._changed = env.event()
        self._updated = env.now
        self._full: list[Link] = []
        self._stale = False
        env.process(self._run())

    def transfer(self, size: float, path: list[Link] | tuple[Link, ...],
                 weight: int = 1, shares: tuple[float, ...] = ()) -> simpy.Event:
        """An event that fires when ``size`` bytes have crossed every link of ``path``
        (for each of ``weight`` identical flows), loading each with its share of them
        (``shares``, one per link; default: all of them)."""
        if size < 0 or not path or any(link.capacity <= 0 for link in path) or weight < 1 \
                or (shares and (len(shares) != len(path) or min(shares) <= 0)):
            raise ValueError("a transfer has a size >= 0, a weight >= 1, a path of links "
                             "with capacity and a share > 0 of each")
        done = self.env.event()
        if size == 0:
            done.succeed(0.0)
            return done
        self._advance()
        self.flows.append(Flow(float(size), tuple(path), done, weight, tuple(shares),
                               started=self.env.now))
        self._stale = True  # rates are recomputed once for all flows started at this instant
        if not self._changed.triggered:
            self._changed.succeed()
        return done

    # -- the loop -------------------------------------------------------------------------

    def _run(self):
        while True:
            if self._stale:  # before time moves on: flows started or ended at this instant
                self._reallocate()
            if not self.flows:
                yield self._changed
                self._changed = self.env.event()
                continue
            next_done = min(f.remaining / f.rate for f in self.flows)
            yield self.env.timeout(next_done) | self._changed
            if self._changed.triggered:
                self._changed = self.env.event()
            self._advance()
            finished = {f for f in self.flows if f.remaining <= EPSILON * max(1.0, f.size)}
            if finished:
                self.flows = [f for f in self.flows if f not in finished]
                for flow in finished:
                    flow.done.succeed(self.env.now - flow.started)
                self._stale = True

    def _advance(self) -> None:
        """Move every flow on by its rate since the last change."""
        elapsed = self.env.now - self._updated
        self._updated = self.env.now
        if elapsed <= 0:
            return
        for flow in self.flows:
            moved = min(flow.remaining, flow.rate * elapsed)
            flow.remaining -= moved
            for link, share in flow.crossings():
                link.carried += moved * flow.weight * share
        for link in self._full:
            link.full_s += elapsed

    def _reallocate(self) -> None:
        self._stale = False
        load: dict[Link, float] = {}
        for flow, rate in max_min_rates(self.flows).items():
            flow.rate = rate
            for link, share in flow.crossings():
                load[link] = load.get(link, 0.0) + rate * flow.weight * share
        self._full = [link for link, used in load.items()
                      if used >= link.capacity * (1 - EPSILON)]


def max_min_rates(flows: list[Flow]) -> dict[Flow, float]:
    """The max-min fair rate of every flow, per member (progressive filling).

    All flows rise together; the link with the least spare capacity per flow (member,
    times its share of the link) crossing it fills first, and its flows keep that rate; the
    others rise on. Each link's fill level (spare over the weighted shares still rising
    through it) only grows as flows freeze, so a heap of levels, refreshed when a link's
    flows change, finds each next full link: O(P log P) for P flow-link crossings, which
    keeps thousands of flows fast."""
    rates: dict[Flow, float] = {}
    spare: dict[Link, float] = {}
    rising: dict[Link, float] = defaultdict(float)  # weight x share of flows still rising
    left: dict[Link, int] = defaultdict(int)  # how many flows still rise through it
    crossing: dict[Link, list[Flow]] = defaultdict(list)
    for flow in flows:
        for link, share in flow.crossings():
            spare[link] = link.capacity
            rising[link] += flow.weight * share
            left[link] += 1
            crossing[link].append(flow)
    pushed = itertools.count()  # ties: first pushed first (links do not compare)
    latest = {link: spare[link] / rising[link] for link in spare}
    heap = [(level, next(pushed), link) for link, level in latest.items()]
    heapq.heapify(heap)
    while heap:
        level, _, link = heapq.heappop(heap)
        if latest.get(link) != level:
            continue  # an older level of a link whose flows changed since
        del latest[link]
        for flow in crossing[link]:
            if flow in rates:
                continue
            rates[flow] = level
            for other, share in flow.crossings():
                spare[other] -= level * flow.weight * share
                rising[other] -= flow.weight * share
                left[other] -= 1
                if other in latest and left[other] > 0:
                    # Never below the level reached (rounding): rates only rise.
                    latest[other] = max(level, spare[other] / rising[other])
                    heapq.heappush(heap, (latest[other], next(pushed), other))
                elif other in latest:
                    del latest[other]
    return rates

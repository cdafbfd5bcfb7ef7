"""The agent's Prometheus metrics (``GET /metrics``), fed by start records and ``warm``.

What an operator graphs: how many starts, how long each startup phase takes, where the
bytes came from (the store on demand, the store ahead of need, the node's cache), and how
far the prefetch lags behind the start. Counters grow as starts report to the agent
(``POST /v1/starts``); a phase's duration is observed once, when the phase and the one
before it are both known. The registry is the agent's own, not the process-global one,
so several agents in one process (tests) do not share counters.

With peer-to-peer on (``p2p.enabled``), also: the bytes warms fetched through the job's
swarm, from peers and from the store, and the swarm's own counters read at each scrape
(bytes uploaded to peers, peers connected, objects seeded, peers banned). Off, none of
these series exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from bootseer.agents.timeline import PHASES, StartRecord
from bootseer.agents.warm import WarmSummary
from bootseer.p2p import FetchResult

if TYPE_CHECKING:  # bootseer.p2p.swarm loads libtorrent: only for a swarm that exists
    from bootseer.p2p.demand import DemandCounts
    from bootseer.p2p.swarm import SwarmStats

_PHASE_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


class AgentMetrics:
    def __init__(self, swarm_stats: Callable[[], SwarmStats] | None = None,
                 demand: Callable[[], DemandCounts] | None = None) -> None:
        """``swarm_stats``: the node's swarm's counters, with peer-to-peer on; ``demand``:
        its demand reads'."""
        self.registry = CollectorRegistry()
        self.starts = Counter("bootseer_starts", "Container starts reported to the agent",
                              ["runtime"], registry=self.registry)
        self.phase_seconds = Histogram(
            "bootseer_startup_phase_seconds",
            "Seconds a start took to reach a phase from the phase before it",
            ["phase"], buckets=_PHASE_BUCKETS, registry=self.registry)
        self.startup_seconds = Histogram(
            "bootseer_startup_seconds", "Seconds from created to ready (or exit)",
            buckets=_PHASE_BUCKETS, registry=self.registry)
        self.fetched_bytes = Counter(
            "bootseer_fetched_bytes", "Compressed image bytes read from the store, by why",
            ["source"], registry=self.registry)  # demand, prefetch, warm
        self.block_reads = Counter(
            "bootseer_block_reads", "Image blocks the container read, by where they were",
            ["result"], registry=self.registry)  # hit (cache), miss (fetched)
        self.prefetch_seconds = Histogram(
            "bootseer_prefetch_seconds",
            "Seconds from a mount's start to its prefetch's last request (prefetch lag)",
            buckets=_PHASE_BUCKETS, registry=self.registry)
        for phase in PHASES[1:]:  # every series present from the start, at zero
            self.phase_seconds.labels(phase)
        for source in ("demand", "prefetch", "warm"):
            self.fetched_bytes.labels(source)
        for result in ("hit", "miss"):
            self.block_reads.labels(result)
        self.p2p_bytes: Counter | None = None
        if swarm_stats is not None:
            self.p2p_bytes = Counter(
                "bootseer_p2p_fetched_bytes",
                "Bytes of objects warms fetched through the job's swarm, by where they came "
                "from (peer: payload received, redundant bytes included)",
                ["source"], registry=self.registry)  # peer, store
            for source in ("peer", "store"):
                self.p2p_bytes.labels(source)
            self.registry.register(_SwarmCollector(swarm_stats, demand))

    def observe(self, before: StartRecord | None, after: StartRecord) -> None:
        """Count what a merge of start records added (nothing is counted twice)."""
        if before is None:
            self.starts.labels(after.runtime or "unknown").inc()
        old = before.breakdown() if before else {}
        for phase, seconds in after.breakdown().items():
            if phase not in old:
                self.phase_seconds.labels(phase).observe(seconds)
        if after.startup_seconds is not None and (
                before is None or before.startup_seconds is None):
            self.startup_seconds.observe(after.startup_seconds)
        if "image" in after.detail and not (before and "image" in before.detail):
            self._image_counts(after.detail["image"])

    def _image_counts(self, stats: dict) -> None:
        """A finished mount's statistics (``bootseer image run``'s report)."""
        self.fetched_bytes.labels("demand").inc(stats.get("bytes_fetched", 0))
        self.block_reads.labels("hit").inc(stats.get("cache_hits", 0))
        self.block_reads.labels("miss").inc(stats.get("blocks_fetched", 0))
        prefetch = stats.get("prefetch") or {}
        self.fetched_bytes.labels("prefetch").inc(prefetch.get("bytes_fetched", 0))
        if prefetch.get("done"):
            self.prefetch_seconds.observe(prefetch.get("seconds", 0.0))

    def warmed(self, summary: WarmSummary) -> None:
        self.fetched_bytes.labels("warm").inc(sum(p.store_bytes for p in summary.parts))

    def shared(self, results: list[FetchResult]) -> None:
        """Count what a warm's fetches through the swarm cost."""
        if self.p2p_bytes is None:
            return
        self.p2p_bytes.labels("peer").inc(sum(r.peer_bytes for r in results))
        self.p2p_bytes.labels("store").inc(sum(r.store_bytes for r in results))

    def exposition(self) -> tuple[bytes, str]:
        """The text format; reads the swarm's counters (waits up to a second for them)."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _SwarmCollector:
    """The swarm's own counters, read when Prometheus scrapes."""

    def __init__(self, stats: Callable[[], SwarmStats],
                 demand: Callable[[], DemandCounts] | None) -> None:
        self.stats, self.demand = stats, demand

    def collect(self) -> Iterator[Metric]:
        if self.demand is not None:  # mount servers' reads (bootseer.p2p.demand)
            counts = self.demand()
            yield CounterMetricFamily("bootseer_p2p_demand_reads",
                                      "Image pack ranges mount servers read through the "
                                      "swarm", value=counts.reads)
            yield CounterMetricFamily("bootseer_p2p_demand_bytes", "Bytes of those reads",
                                      value=counts.bytes)
            yield CounterMetricFamily("bootseer_p2p_demand_fallbacks",
                                      "Reads the swarm could not serve (read from the "
                                      "store)", value=counts.fallbacks)
        stats = self.stats()
        yield CounterMetricFamily("bootseer_p2p_uploaded_bytes",
                                  "Payload bytes this node sent to peers",
                                  value=stats.uploaded_bytes)
        yield GaugeMetricFamily("bootseer_p2p_peers", "Peer connections open now",
                                value=stats.peers)
        yield GaugeMetricFamily("bootseer_p2p_seeding", "Objects this node seeds now",
                                value=stats.seeding)
        yield GaugeMetricFamily("bootseer_p2p_banned_peers",
                                "Peer addresses blocked for sending data that failed its "
                                "hashes", value=stats.banned)

"""A job's starts across all its nodes, in the store: each node publishes, anyone reads.

A restart of a thousand-GPU job is as slow as its slowest node, and no single node's
timeline shows which node that was. So every node agent publishes each start that belongs
to a job (``io.bootseer.job``) to the store the job already uses, one small object per
node and start, rewritten whenever the start reaches a new phase::

    jobs/<job>/starts/<node>/<start id>.json      a StartRecord, as the node knows it

``bootseer report --job J`` reads them all (:func:`load`) and :func:`summarize` takes the
job's latest restart (each node's newest start): how many nodes, the p50, p99 and max of
every phase across them, and the slowest nodes with the phase that held each back.

The objects are hostile input to whoever reads them (any node, or anyone who can write
the store, may have written one): each is read only up to :data:`MAX_RECORD_BYTES`, parsed
within that and :data:`bootseer.boundedjson.MAX_DEPTH` and checked as an API body
(:meth:`StartRecord.from_request`); one that fails is skipped with a warning. A report
may read :data:`MAX_RECORDS` of them, so each keeps only what the report shows (its id
and phases): a record's ``detail``, up to 64 KiB of JSON, is some MiB as Python objects.
"""

from __future__ import annotations

import json
import logging
import math
import posixpath
from dataclasses import dataclass
from urllib.parse import quote

from bootseer import boundedjson
from bootseer.agents import fields
from bootseer.agents.timeline import PHASES, StartRecord
from bootseer.errors import BootseerError
from bootseer.store import Store

log = logging.getLogger(__name__)

PREFIX = "jobs"
#: A published record (phases, ids and the mount's statistics) is a few KiB.
MAX_RECORD_BYTES = 128 << 10
#: Nodes' starts read for one report.
MAX_RECORDS = 100_000


@dataclass(frozen=True)
class NodeStart:
    node: str
    start: StartRecord


def key(job: str, node: str, start_id: str) -> str:
    return posixpath.join(job_dir(job), "starts", node, f"{start_id}.json")


def job_dir(job: str) -> str:
    """Where a job's records go in the store: its name quoted (HDFS names cannot hold
    ``:``)."""
    fields.name(job, "job", fields.JOB)
    return posixpath.join(PREFIX, quote(job, safe="._-"))


def publish(store: Store, node: str, start: StartRecord) -> str | None:
    """Put ``start`` where its job's report finds it (a start without a job: nowhere)."""
    if start.job is None:
        return None
    fields.name(node, "node", fields.COMPONENT)
    path = key(start.job, node, start.id)
    store.put(path, json.dumps(start.to_json()).encode())
    return path


def load(store: Store, job: str) -> list[NodeStart]:
    """Every start published for ``job``, by node: of each, what the report shows."""
    fields.name(job, "job", fields.JOB)
    found: list[NodeStart] = []
    prefix = job_dir(job) + "/starts/"
    for info in store.list(prefix):
        node, _, name = info.key[len(prefix):].partition("/")
        if not name.endswith(".json") or "/" in name:
            continue
        if len(found) >= MAX_RECORDS:
            log.warning("job %s: more than %d starts published; reading the first only",
                        job, MAX_RECORDS)
            break
        try:
            fields.name(node, "node", fields.COMPONENT)
            start = _read(store, info.key)
        except (ValueError, TypeError, OSError, BootseerError) as exc:
            log.warning("skipping %s: %s", info.key, exc)
            continue
        if start.job == job:
            found.append(NodeStart(node, StartRecord(start.id, job, phases=start.phases)))
    return found


def _read(store: Store, key: str) -> StartRecord:
    """The start record at ``key``, checked, without its ``detail`` (the report shows
    none, and checking it would serialise it again)."""
    body = boundedjson.loads(store.get(key, MAX_RECORD_BYTES), limit=MAX_RECORD_BYTES,
                             what=key)
    if isinstance(body, dict):
        body.pop("detail", None)
    return StartRecord.from_request(body)


@dataclass(frozen=True)
class Spread:
    """One duration across the nodes of a restart."""

    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        ordered = sorted(values)
        return cls(_rank(ordered, 0.50), _rank(ordered, 0.99), ordered[-1])


@dataclass(frozen=True)
class Laggard:
    """A slow node of a restart, and the phase that cost it most."""

    node: str
    start_id: str
    seconds: float  # created → ready (or exit)
    slowest_phase: str
    phase_seconds: float


@dataclass(frozen=True)
class JobSummary:
    job: str
    nodes: int
    #: created → ready (or exit), across nodes; None if no node got that far.
    startup: Spread | None
    #: Each phase's time from the phase before it, across the nodes that reached it.
    phases: dict[str, Spread]
    slowest: list[Laggard]

    def to_json(self) -> dict:
        def spread(s: Spread | None) -> dict | None:
            return None if s is None else {"p50": s.p50, "p99": s.p99, "max": s.max}

        return {"job": self.job, "nodes": self.nodes, "startup": spread(self.startup),
                "phases": {name: spread(s) for name, s in self.phases.items()},
                "slowest": [vars(laggard) for laggard in self.slowest]}


def latest_restart(starts: list[NodeStart]) -> list[NodeStart]:
    """The job's latest restart: each node's newest start (by ``created``), slowest first."""
    latest: dict[str, NodeStart] = {}
    for item in starts:
        created = item.start.phases.get("created", 0.0)
        held = latest.get(item.node)
        if held is None or created > held.start.phases.get("created", 0.0):
            latest[item.node] = item
    return sorted(latest.values(), key=lambda i: (-(i.start.startup_seconds or 0.0), i.node))


def summarize(job: str, starts: list[NodeStart], *, slowest: int = 5) -> JobSummary:
    """The job's latest restart (:func:`latest_restart`) across its nodes."""
    restart = latest_restart(starts)
    by_phase: dict[str, list[float]] = {}
    laggards = []
    for item in restart:
        breakdown = item.start.breakdown()
        for phase, seconds in breakdown.items():
            by_phase.setdefault(phase, []).append(seconds)
        total = item.start.startup_seconds
        if total is not None and breakdown:
            phase = max(breakdown, key=lambda p: breakdown[p])
            laggards.append(Laggard(item.node, item.start.id, total, phase, breakdown[phase]))
    laggards.sort(key=lambda lag: lag.seconds, reverse=True)
    totals = [lag.seconds for lag in laggards]
    return JobSummary(job, len(restart), Spread.of(totals) if totals else None,
                      {p: Spread.of(by_phase[p]) for p in PHASES if p in by_phase},
                      laggards[:slowest])


def _rank(ordered: list[float], q: float) -> float:
    """The nearest-rank quantile: a value some node actually had."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

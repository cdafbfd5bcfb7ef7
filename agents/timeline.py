"""Startup timelines: when each container start reached each phase, kept in SQLite.

An operator's question is "where does startup time go on *my* cluster?". Every start
Bootseer runs is recorded as the wall-clock times (Unix seconds) at which it reached the
phases below, in order; ``bootseer report`` turns them into a per-phase breakdown.

* ``created``: the runtime was asked to start the container;
* ``image_ready``: its root file system was mounted (the lazy image, prefetch started);
* ``env_ready``: the job's environment was in place (``bootseer env run`` restored or
  installed it);
* ``checkpoint_first_byte``: the first checkpoint byte reached the job;
* ``ready``: the job said it was up (``bootseer ready`` / ``bootseer.mark_ready()``);
* ``exited``: the container's process ended.

A phase a start never reached (a job without a checkpoint) is simply absent. The first
time recorded for a phase wins, so a component that reports twice changes nothing.

One database file per node, written by the node agent and read by anyone (SQLite's WAL
mode lets a reader run beside the writer); where no agent runs, ``bootseer image run``
writes it itself through this same class.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tenacity import retry, retry_if_exception, stop_after_delay, wait_random_exponential

from bootseer.agents import fields
from bootseer.config import Config
from bootseer.ready import read_phases

log = logging.getLogger(__name__)

PHASES = ("created", "image_ready", "env_ready", "checkpoint_first_byte", "ready", "exited")
#: A start's detail (mount statistics, exit code) as JSON: it is stored per start.
MAX_DETAIL_BYTES = 64 << 10

_SCHEMA = """
CREATE TABLE IF NOT EXISTS starts (
    id TEXT PRIMARY KEY,
    job TEXT,
    image TEXT,
    workload TEXT,
    runtime TEXT,
    first_seen REAL NOT NULL,
    detail TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS phases (
    start_id TEXT NOT NULL REFERENCES starts(id),
    phase TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (start_id, phase)
);
CREATE INDEX IF NOT EXISTS starts_by_time ON starts(first_seen);
"""


@dataclass
class StartRecord:
    """One container start: who it was and when it reached each phase."""

    id: str
    job: str | None = None
    image: str | None = None
    workload: str | None = None
    runtime: str | None = None  # "runc" (bootseer image run), "docker", "podman", ...
    phases: dict[str, float] = field(default_factory=dict)  # phase -> Unix time
    detail: dict[str, Any] = field(default_factory=dict)  # e.g. bytes fetched, prefetch

    def breakdown(self) -> dict[str, float]:
        """Seconds spent reaching each phase from the one reached before it."""
        out: dict[str, float] = {}
        previous = None
        for phase in PHASES:
            at = self.phases.get(phase)
            if at is None:
                continue
            if previous is not None:
                out[phase] = round(max(0.0, at - previous), 3)
            previous = at
        return out

    @property
    def pod(self) -> str | None:
        """The Kubernetes pod (``NAMESPACE/NAME``) of the start, as its engine named it in
        the mount request (containerd's CRI annotations, which no pod can set)."""
        pod = self.detail.get("pod")
        return pod if isinstance(pod, str) else None

    @property
    def startup_seconds(self) -> float | None:
        """From ``created`` to ``ready`` (or, for a job that never said so, its exit)."""
        begin = self.phases.get("created")
        end = self.phases.get("ready", self.phases.get("exited"))
        return None if begin is None or end is None else round(end - begin, 3)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "job": self.job, "image": self.image,
                "workload": self.workload, "runtime": self.runtime,
                "phases": dict(self.phases), "breakdown": self.breakdown(),
                "startup_seconds": self.startup_seconds, "detail": dict(self.detail)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StartRecord:
        """A record as this node's timeline or agent gave it back."""
        return cls(id=data["id"], job=data.get("job"), image=data.get("image"),
                   workload=data.get("workload"), runtime=data.get("runtime"),
                   phases={k: float(v) for k, v in (data.get("phases") or {}).items()},
                   detail=dict(data.get("detail") or {}))

    @classmethod
    def from_request(cls, data: Any) -> StartRecord:
        """A record from an API body, every field checked (:mod:`bootseer.agents.fields`); the
        derived fields of :meth:`to_json` (``breakdown``, ``startup_seconds``) are
        accepted and ignored."""
        data = fields.only(data, {"id", "job", "image", "workload", "runtime", "phases",
                                  "detail", "breakdown", "startup_seconds"}, "start record")
        phases = data.get("phases") or {}
        if not isinstance(phases, dict):
            raise ValueError("'phases' maps phase names to Unix times")
        unknown = set(phases) - set(PHASES)
        if unknown:
            raise ValueError(f"unknown phase(s) {', '.join(sorted(map(str, unknown)))}; "
                             f"phases are {', '.join(PHASES)}")
        detail = data.get("detail") or {}
        if not isinstance(detail, dict) or len(json.dumps(detail)) > MAX_DETAIL_BYTES:
            raise ValueError(f"'detail' is a JSON object of at most {MAX_DETAIL_BYTES} bytes")
        return cls(id=fields.name(data.get("id"), "id", fields.CONTAINER_ID),
                   job=fields.optional_name(data.get("job"), "job", fields.JOB),
                   image=fields.optional_name(data.get("image"), "image", fields.IMAGE),
                   workload=fields.optional_name(data.get("workload"), "workload",
                                                 fields.COMPONENT),
                   runtime=fields.optional_name(data.get("runtime"), "runtime",
                                                fields.RUNTIME),
                   phases={k: fields.time_value(v, f"phases.{k}") for k, v in phases.items()},
                   detail=dict(detail))


def timeline_path(config: Config) -> Path:
    return config.cache_dir / "timeline.sqlite"


class Timeline:
    """The node's start records in one SQLite file (thread-safe; several processes may
    write, SQLite serialises them)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=30.0, check_same_thread=False,
                                   isolation_level=None)
        self._prepare()

    @retry(retry=retry_if_exception(lambda exc: isinstance(exc, sqlite3.OperationalError)
                                    and "locked" in str(exc)),
           stop=stop_after_delay(30.0), wait=wait_random_exponential(multiplier=0.01, max=0.5),
           reraise=True)
    def _prepare(self) -> None:
        """WAL mode and the tables. Processes opening a new file at once race to switch its
        journal, and SQLite answers the losers "database is locked" at once rather than
        after the connection's busy timeout (CI: one of three writers failed so): they try
        again, as long as that timeout."""
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def record(self, start: StartRecord) -> None:
        """Add ``start`` or merge it into what is known: first values and times win."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT INTO starts (id, job, image, workload, runtime, first_seen, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
                "job = coalesce(job, excluded.job), image = coalesce(image, excluded.image), "
                "workload = coalesce(workload, excluded.workload), "
                "runtime = coalesce(runtime, excluded.runtime), "
                "detail = json_patch(detail, excluded.detail)",
                (start.id, start.job, start.image, start.workload, start.runtime,
                 min(start.phases.values(), default=time.time()), json.dumps(start.detail)))
            self._db.executemany(
                "INSERT OR IGNORE INTO phases (start_id, phase, at) VALUES (?, ?, ?)",
                [(start.id, phase, at) for phase, at in start.phases.items()])

    def get(self, start_id: str) -> StartRecord | None:
        found = self._load("WHERE id = ?", (start_id,))
        return found[0] if found else None

    def mark(self, start_id: str, phase: str, at: float | None = None) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")
        self.record(StartRecord(start_id, phases={phase: time.time() if at is None else at}))

    def starts(self, since: float = 0.0, limit: int = 1000) -> list[StartRecord]:
        """Starts first seen at or after ``since``, oldest first (at most the last ``limit``)."""
        found = self._load("WHERE first_seen >= ? ORDER BY first_seen DESC LIMIT ?",
                           (since, limit))
        return sorted(found, key=lambda r: min(r.phases.values(), default=0))

    def _load(self, where: str, args: tuple[Any, ...]) -> list[StartRecord]:
        with self._lock:
            rows = self._db.execute("SELECT id, job, image, workload, runtime, detail FROM "
                                    f"starts {where}", args).fetchall()
            records = {r[0]: StartRecord(r[0], r[1], r[2], r[3], r[4],
                                         detail=json.loads(r[5])) for r in rows}
            for start_id, phase, at in self._phases(records):
                records[start_id].phases[phase] = at
        for record in records.values():
            record.phases = {p: record.phases[p] for p in PHASES if p in record.phases}
        return list(records.values())

    def _phases(self, records: dict[str, StartRecord]) -> Iterable[tuple[str, str, float]]:
        ids = list(records)
        for i in range(0, len(ids), 500):  # SQLite's bound-parameter limit
            batch = ids[i:i + 500]
            yield from self._db.execute(
                f"SELECT start_id, phase, at FROM phases WHERE start_id IN "
                f"({','.join('?' * len(batch))})", batch)


#: Phases only the host knows; a workload's marks of them are ignored.
HOST_PHASES = ("created", "image_ready", "exited")


def container_phases(signal: Path, created: float, now: float) -> dict[str, float]:
    """The phases a container's workload marked in ``signal`` (``bootseer env run``, the
    checkpoint API, ``bootseer ready``), for a start created at ``created`` and ended by
    ``now``: marks of host phases, unknown phases and impossible times are ignored."""
    marked = read_phases(signal)
    kept = {p: at for p, at in marked.items()
            if p in PHASES and p not in HOST_PHASES and created <= at <= now}
    if len(kept) != len(marked):
        log.warning("ignoring phase marks %s: unknown phases or times outside the start",
                    ", ".join(sorted(set(marked) - set(kept))))
    return kept

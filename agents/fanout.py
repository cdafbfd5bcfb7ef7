"""HDFS-native fan-out: what every node of a job reads gets more replicas for the restart.

When N nodes restart at once, each reads the same hot pack, the same snapshot shards and,
per data-parallel group, the same checkpoint shards. With HDFS's usual three replicas,
those bytes come from three DataNodes however many nodes read them. Before a restart,
:func:`fan_out` raises the replication of exactly those objects (HDFS's own
``setReplication``; the NameNode copies the blocks in the background) to
:func:`replicas_for` the job's readers, bounded by the DataNodes there are; once the job is
up, :func:`restore` puts every object back to the replication it had.

What was changed is recorded (:class:`Record`) where only the user who ran the fan-out
(the scheduler) can write: their own state, ``<state>/fanout/`` (:mod:`bootseer.userstate`:
a 0600 file of theirs in a 0700 directory of theirs, opened ``O_NOFOLLOW``), one file per
job and store. Not in the store: :func:`restore` acts with the scheduler's HDFS identity,
which may set the replication of every tenant's files, and the store is written by every
node agent and by whoever else can write it, so a record there would let anyone have
any file of the cluster replicated 512-fold, or brought down to one replica. So
``job restore`` runs where ``job fanout`` ran, as the same user. And what a record may
touch is bounded besides: only objects under the roots the fan-out was asked for (the
store's URL, path included, and each ``--checkpoint`` URL; whole path components, URLs
normalised as :func:`bootseer.agents.policy.normalise` does) are restored; any other is
refused with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bootseer import boundedjson, userstate
from bootseer.agents import fields
from bootseer.agents.policy import Location, normalise
from bootseer.errors import BootseerError
from bootseer.prefetch import hotlist
from bootseer.prefetch.lazyimage import resolve_image
from bootseer.snapshot.restore import load_manifest
from bootseer.store import BlobStore, Store
from bootseer.store.hadoop import MAX_REPLICAS
from bootseer.stripedfs.files import CheckpointSource
from bootseer.stripedfs.stage import checkpoint_files

log = logging.getLogger(__name__)

#: A fan-out record lists one entry per object: a few hundred bytes each.
MAX_RECORD_BYTES = 16 << 20
FORMAT = "bootseer-fanout/1"


def replicas_for(readers: int, readers_per_replica: int, max_replicas: int) -> int:
    """Replicas for ``readers`` reading at once: one per ``readers_per_replica`` of them,
    at most ``max_replicas`` (the DataNodes that can hold one), at least 1."""
    if readers < 1 or readers_per_replica < 1 or max_replicas < 1:
        raise ValueError("readers, readers per replica and the maximum are at least 1")
    return max(1, min(max_replicas, math.ceil(readers / readers_per_replica)))


@dataclass(frozen=True)
class Change:
    """One object whose replication was raised: where, and from what to what."""

    store: str  # the store's URL
    key: str
    before: int
    after: int


@dataclass(frozen=True)
class Wanted:
    """The objects every node reads: keys of one store."""

    store: Store
    keys: tuple[str, ...]


def image_objects(blobs: BlobStore, image: str, workload: str) -> Wanted:
    """An image's manifest and, if it has one, the hot pack of ``workload``."""
    image_id = resolve_image(blobs, image)
    keys = [blobs.blob_key(image_id), blobs.table_key(image_id)]
    hot = hotlist.load(blobs, image_id, workload)
    if hot is not None and hot.layout is not None:
        keys.append(hot.layout.pack)
    return Wanted(blobs.store, tuple(keys))


def snapshot_objects(blobs: BlobStore, key: str) -> Wanted:
    """A snapshot's shards (and their chunk tables, read with them)."""
    manifest = load_manifest(blobs, key)
    keys = [k for shard in manifest.shards
            for k in (blobs.blob_key(shard.digest), blobs.table_key(shard.digest))]
    return Wanted(blobs.store, tuple(keys))


def checkpoint_objects(source: CheckpointSource, url: str) -> Wanted:
    """A checkpoint file, or every file of a checkpoint directory."""
    store, files = checkpoint_files(source, url)
    return Wanted(store, tuple(info.key for info in files))


def fan_out(wanted: list[Wanted], replicas: int) -> list[Change]:
    """Raise every wanted object to ``replicas`` (never lower one); what changed. A store
    without replication (a local directory) has nothing to spread and is left alone."""
    changes = []
    for part in wanted:
        for key in part.keys:
            try:
                before = part.store.replication(key)
            except FileNotFoundError:
                continue  # a chunk table not written yet, a file gone: nothing to spread
            if before is None or before >= replicas:
                continue
            part.store.set_replication(key, replicas)
            changes.append(Change(part.store.url, key, before, replicas))
    return changes


@dataclass(frozen=True)
class Record:
    """What the fan-outs of one job over one store changed and have not restored, and
    the roots they were asked for: the store's URL and each checkpoint's."""

    job: str
    store: str
    roots: tuple[str, ...]
    changes: tuple[Change, ...]

    def to_json(self) -> dict:
        return {"format": FORMAT, "job": self.job, "store": self.store,
                "roots": list(self.roots), "changes": [asdict(c) for c in self.changes]}

    @classmethod
    def from_json(cls, body: object) -> Record:
        """A record as :meth:`to_json` wrote it; ``ValueError``/``TypeError``/``KeyError``
        if it is not one."""
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} object")
        roots, changes = body["roots"], body["changes"]
        if not isinstance(roots, list) or not isinstance(changes, list):
            raise TypeError("'roots' and 'changes' are lists")
        return cls(_text(body["job"]), _text(body["store"]), tuple(map(_text, roots)),
                   tuple(Change(_text(c["store"]), _text(c["key"]), _count(c["before"]),
                                _count(c["after"])) for c in changes))


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or \
            not 1 <= value <= MAX_REPLICAS:
        raise ValueError(f"{value!r} is not a replication (1-{MAX_REPLICAS})")
    return value


def restore(record: Record, open_store: Callable[[str], Store]) -> int:
    """Put each object of ``record`` back to its replication before the fan-out
    (``open_store(url)`` gives its store); objects gone since are skipped, and so is,
    with a warning, any that does not lie under one of the record's roots or that no
    store holds (a key or URL no store takes). How many were restored."""
    roots = [root for root in map(_location, record.roots) if root is not None]
    restored = 0
    for change in record.changes:
        where = _location(f"{change.store.rstrip('/')}/{change.key}")
        if where is None or not any(where.within(root) for root in roots):
            log.warning("not restoring %s of %s: not under %s, what the fan-out of job %s "
                        "was asked for", change.key, change.store, " or ".join(record.roots),
                        record.job)
            continue
        try:
            open_store(change.store).set_replication(change.key, change.before)
        except FileNotFoundError:
            log.info("%s of %s is gone: nothing to restore", change.key, change.store)
            continue
        except ValueError as exc:  # no store's URL, no key: it never will be restored
            log.warning("not restoring %s of %s: %s", change.key, change.store, exc)
            continue
        restored += 1
    return restored


def _location(url: str) -> Location | None:
    """``url`` normalised, or None if it is ambiguous (``..``, percent-encoding...)."""
    try:
        return normalise(url)
    except ValueError:
        return None


def record_dir() -> Path:
    """Where this user's fan-out records are."""
    return userstate.state_dir("fanout")


def _record_name(store: str, job: str) -> str:
    """The record's file: one per store and job (a job name may be too long, and hold
    too many characters, for a file name of its own)."""
    fields.name(job, "job", fields.JOB)
    return hashlib.sha256(f"{store}\0{job}".encode()).hexdigest()[:32] + ".json"


def save(store: str, job: str, roots: tuple[str, ...], changes: list[Change]) -> None:
    """Record ``changes`` of ``job``'s objects under ``roots``, fanned out with the store
    ``store``, added to what an earlier fan-out recorded (its ``before`` stays the
    truth)."""
    earlier = load(store, job)
    known = {(c.store, c.key): c for c in earlier.changes} if earlier else {}
    for change in changes:
        known.setdefault((change.store, change.key), change)
    all_roots = tuple(dict.fromkeys((*(earlier.roots if earlier else ()), *roots)))
    record = Record(job, store, all_roots, tuple(known.values()))
    userstate.write(record_dir(), _record_name(store, job), json.dumps(record.to_json()).encode())


def load(store: str, job: str) -> Record | None:
    """What fan-outs of ``job`` with the store ``store`` changed and have not restored
    (None if none)."""
    name = _record_name(store, job)
    data = userstate.read(record_dir(), name, MAX_RECORD_BYTES)
    if data is None:
        return None
    where = record_dir() / name
    try:
        record = Record.from_json(boundedjson.loads(data, limit=MAX_RECORD_BYTES,
                                                    what=str(where)))
    except (ValueError, TypeError, KeyError) as exc:
        raise BootseerError(f"{where} is not a fan-out record: {exc}") from exc
    if (record.store, record.job) != (store, job):
        raise BootseerError(f"{where} is the record of job {record.job} with the store "
                            f"{record.store}, not of {job} with {store}")
    return record


def forget(store: str, job: str) -> None:
    userstate.remove(record_dir(), _record_name(store, job))

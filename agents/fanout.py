"""HDFS-native fan-out: what every node of a job reads gets more replicas for the restart.

When N nodes restart at once, each reads the same hot pack, the same snapshot shards and,
per data-parallel group, the same checkpoint shards. With HDFS's usual three replicas,
those bytes come from three DataNodes however many nodes read them. Before a restart,
:func:`fan_out` raises the replication of exactly those objects (HDFS's own
``setReplication``; the NameNode copies the blocks in the background) to
:func:`replicas_for` the job's readers, bounded by the DataNodes there are; once the job is
up, :func:`restore` puts every object back to the replication it had. What was changed is
recorded in the store (``jobs/<job>/fanout.json``), so any node or the scheduler can
restore it.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from bootseer.agents.jobreport import job_dir
from bootseer.errors import BootseerError
from bootseer.prefetch import hotlist
from bootseer.prefetch.lazyimage import resolve_image
from bootseer.snapshot.restore import load_manifest
from bootseer.store import BlobStore, Store
from bootseer.stripedfs.files import CheckpointSource
from bootseer.stripedfs.stage import checkpoint_files

log = logging.getLogger(__name__)

#: A fan-out record lists one entry per object: a few hundred bytes each.
MAX_RECORD_BYTES = 16 << 20


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


def restore(changes: list[Change], open_store, *, cluster: str) -> int:
    """Put each object back to its replication before the fan-out (``open_store(url)``
    gives its store); objects gone since are skipped. The record is the store's, so any
    writer's: only objects of ``cluster`` (the record's own store's scheme and host) are
    touched, never another cluster a forged record names. How many were restored."""
    restored = 0
    for change in changes:
        if _cluster(change.store) != _cluster(cluster):
            log.warning("not restoring %s of %s: not on %s, where the record is",
                        change.key, change.store, _cluster(cluster))
            continue
        try:
            open_store(change.store).set_replication(change.key, change.before)
            restored += 1
        except FileNotFoundError:
            log.info("%s of %s is gone: nothing to restore", change.key, change.store)
    return restored


def _cluster(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def record_key(job: str) -> str:
    return f"{job_dir(job)}/fanout.json"


def save(store: Store, job: str, changes: list[Change]) -> None:
    """Record ``changes`` for ``job``, added to what an earlier fan-out recorded (its
    ``before`` stays the truth)."""
    known = {(c.store, c.key): c for c in load(store, job)}
    for change in changes:
        known.setdefault((change.store, change.key), change)
    store.put(record_key(job), json.dumps([asdict(c) for c in known.values()]).encode())


def load(store: Store, job: str) -> list[Change]:
    """What fan-outs of ``job`` changed and have not restored ([] if none)."""
    try:
        info = store.stat(record_key(job))
    except FileNotFoundError:
        return []
    if info.size > MAX_RECORD_BYTES:
        raise BootseerError(f"{record_key(job)}: {info.size} bytes, more than a fan-out "
                            f"record holds ({MAX_RECORD_BYTES})")
    try:
        return [Change(str(c["store"]), str(c["key"]), int(c["before"]), int(c["after"]))
                for c in json.loads(store.get(record_key(job)))]
    except (ValueError, TypeError, KeyError) as exc:
        raise BootseerError(f"{record_key(job)} is not a fan-out record: {exc}") from exc


def forget(store: Store, job: str) -> None:
    store.delete(record_key(job))

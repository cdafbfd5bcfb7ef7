"""Pre-stage a snapshot on a node (``bootseer warm --env KEY``): its shards, locally.

The shards go into the node's snapshot cache (``<cache_dir>/snapshots``), the same kind of
verified, content-addressed, crash-safe cache that holds image blocks: a shard is stored
under its sha256 only after the bytes matched it, and is checked again when read back.
The manifest is kept there too, with ``keys/<key>`` naming it. A later restore of the
snapshot takes the manifest and every shard it finds there instead of fetching them, so a
job's restart on a warmed node does not wait for the network, nor even connect to the
store. Restores themselves do
not fill the cache: the restored environment is the copy a node keeps.

Staged as one of a job's nodes with peer-to-peer on (a :class:`~bootseer.p2p.Fanout`),
each shard comes through the job's swarm (this node's share of it from the store, the
rest from peers) into a temporary of the cache, verified against its digest before it
becomes an entry, and the entry is seeded at once for the nodes still fetching it; the
manifest comes the same way (:meth:`~bootseer.p2p.Fanout.cache_blob`).

:class:`SnapshotWarmer` is this stage as a :class:`~bootseer.warming.Warmer`, the way
``bootseer warm`` and the agent run it.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bootseer.errors import BootseerError
from bootseer.nodecache import NodeCache
from bootseer.p2p import Fanout
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.manifest import Manifest
from bootseer.snapshot.shardcache import stage_manifest
from bootseer.snapshot.tree import EnvTree
from bootseer.store import BlobStore
from bootseer.warming import NO_HOOKS, Hooks, PartKind, PartResult

log = logging.getLogger(__name__)


#: What a snapshot's warm is called: its shards, named by its key.
SNAPSHOT = PartKind("envs", "environment", "key", "shards", "snapshot.cache_size")


class SnapshotWarmer:
    """Stages snapshots in the node's snapshot cache (:func:`stage_snapshot`)."""

    kind = SNAPSHOT

    def __init__(self, blobs: BlobStore, cache: NodeCache, options: SnapshotOptions, *,
                 fanout: Fanout | None = None) -> None:
        self.blobs, self.cache, self.options, self.fanout = blobs, cache, options, fanout

    def warm(self, name: str, hooks: Hooks) -> PartResult:
        return stage_snapshot(self.blobs, self.cache, name, options=self.options,
                              fanout=self.fanout, hooks=hooks)


def stage_snapshot(blobs: BlobStore, cache: NodeCache, key: str, *,
                   options: SnapshotOptions | None = None, fanout: Fanout | None = None,
                   hooks: Hooks = NO_HOOKS) -> PartResult:
    """Fetch every shard of snapshot ``key`` that the cache lacks, ``options.concurrency``
    at once; wait until done.

    ``fanout``: the job's swarm to fetch shards through (see the module docstring).
    ``hooks.before_fetch`` is called before each shard is fetched and may block (the
    agent's priorities).
    """
    started = time.monotonic()
    concurrency = (options or SnapshotOptions()).concurrency
    on_progress = hooks.on_progress
    manifest = stage_manifest(blobs, cache, key, fanout)
    total = sum(s.size for s in manifest.shards)
    if hooks.on_plan:
        hooks.on_plan(total)
    wanted = [s for s in manifest.shards if s.digest.removeprefix("sha256:") not in cache]
    fetched: list[int] = []
    store_bytes: list[int] = []
    peer_bytes: list[int] = []

    def fetch(digest: str, size: int) -> None:
        hooks.turn()
        if fanout is None:
            # Streamed, never whole in memory; iter_chunks checks the whole digest at the
            # end, before the cache file is renamed into place.
            cache.put_stream(digest.removeprefix("sha256:"), blobs.iter_chunks(digest),
                             verified=True)
            store_bytes.append(size)
        else:  # None: a concurrent warm of the snapshot staged it meanwhile
            result = fanout.cache_blob(blobs, digest, cache)
            store_bytes.append(result.store_bytes if result else 0)
            peer_bytes.append(result.peer_bytes if result else 0)
        fetched.append(size)
        if on_progress:
            on_progress(size)

    if on_progress:
        on_progress(total - sum(s.size for s in wanted))
    if fanout is not None:  # what this node has already, for the nodes still fetching it
        for shard in manifest.shards:
            if shard not in wanted:
                fanout.cache_blob(blobs, shard.digest, cache)
    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        for shard, future in [(s, pool.submit(fetch, s.digest, s.size)) for s in wanted]:
            try:
                future.result()
            except (OSError, BootseerError) as exc:  # counted as missing below
                log.warning("snapshot %s: shard %s could not be staged: %s", key,
                            shard.digest, exc)
    missing = sum(1 for s in manifest.shards if s.digest.removeprefix("sha256:") not in cache)
    detail: dict[str, Any] = {}
    if options is not None and options.mount and os.geteuid() == 0 and not missing:
        detail = _unpack(blobs, cache, manifest, options)
    return PartResult(SNAPSHOT, key, items=len(manifest.shards), bytes=total,
                      already_local=len(manifest.shards) - len(wanted),
                      fetched=len(fetched), store_bytes=sum(store_bytes), missing=missing,
                      seconds=round(time.monotonic() - started, 3),
                      peer_bytes=sum(peer_bytes), detail=detail)


def _unpack(blobs: BlobStore, cache: NodeCache, manifest: Manifest,
            options: SnapshotOptions) -> dict[str, Any]:
    """Unpack the staged snapshot into the node's tree (:mod:`bootseer.snapshot.tree`), so
    that a restore here is a mount; what it took (``tree``: whether the node has it now)."""
    started = time.monotonic()
    try:
        EnvTree(cache, manifest.key).build(blobs, manifest, options=options)
    except (OSError, BootseerError) as exc:  # the shards are staged: a restore extracts
        log.warning("snapshot %s: not unpacked on the node: %s", manifest.key, exc)
        return {"tree": False}
    return {"tree": True, "tree_s": round(time.monotonic() - started, 3)}

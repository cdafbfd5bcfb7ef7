"""Pre-stage a checkpoint on a node (``bootseer warm --checkpoint URL``): local copies.

``URL`` names a checkpoint file or a directory (a DCP checkpoint: every file under it).
Each file is copied into the node's checkpoint cache (:mod:`bootseer.stripedfs.checkpoint_cache`)
with ranged reads cut like the striped reader's stripes (never across an HDFS block, so
each comes from one DataNode), ``concurrency`` in flight, written and hashed in order.
Every checkpoint read (:func:`bootseer.stripedfs.files.open_reader`) then reads the copies
instead of the network, for as long as the store's objects are the ones copied. The stores
and the cache are the :class:`~bootseer.stripedfs.files.CheckpointSource`'s: as configured.
For a job with peer-to-peer on, files come through the job's swarm instead
(:mod:`bootseer.p2p.sharedfile`): each byte leaves the store about once for all its nodes.

:class:`CheckpointWarmer` is this stage as a :class:`~bootseer.warming.Warmer`, the way
``bootseer warm`` and the agent run it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from bootseer.errors import BootseerError
from bootseer.p2p import Fanout, FetchResult
from bootseer.p2p.sharedfile import SharedFile
from bootseer.store import Store
from bootseer.store.base import ObjectInfo
from bootseer.stripedfs.checkpoint_cache import (
    CheckpointCache,
    CopyRecord,
    StagingError,
    object_url,
)
from bootseer.stripedfs.files import CheckpointSource
from bootseer.stripedfs.layout import Stripe, StripeLayout
from bootseer.warming import NO_HOOKS, Hooks, PartKind, PartResult

log = logging.getLogger(__name__)

#: Files of one checkpoint fetched through the job's swarm at once.
SHARED_FILES = 4


#: What a checkpoint's warm is called: its files, named by its URL.
CHECKPOINT = PartKind("checkpoints", "checkpoint", "url", "files", "checkpoint.cache_size",
                      failure="the store failed them, they changed while being copied")


class CheckpointWarmer:
    """Stages checkpoints in the node's checkpoint cache (:func:`stage_checkpoint`). The
    checkpoints of one warmer keep each other: staging one never evicts another."""

    kind = CHECKPOINT

    def __init__(self, source: CheckpointSource, *, concurrency: int,
                 fanout_for: Callable[[str], Fanout | None] = lambda url: None,
                 records: Store | None = None) -> None:
        """``fanout_for``: the job's swarm to fetch a checkpoint URL through, or None
        (p2p off, or the operator does not let peers share that checkpoint)."""
        self.source, self.concurrency = source, concurrency
        self.fanout_for, self.records = fanout_for, records
        self.keep: set[str] = set()

    def warm(self, name: str, hooks: Hooks) -> PartResult:
        return stage_checkpoint(self.source, name, concurrency=self.concurrency,
                                keep=self.keep, fanout=self.fanout_for(name),
                                records=self.records, hooks=hooks)


def checkpoint_files(source: CheckpointSource, url: str) -> tuple[Store, list[ObjectInfo]]:
    """The store holding the checkpoint at ``url`` and its files (one, or a directory's)."""
    try:
        parent, name = source.locate(url)
    except ValueError:  # a root: only a directory
        pass
    else:
        try:
            return parent, [parent.stat(name)]
        except FileNotFoundError:
            pass  # not a file: a directory?
    store = source.store(url.rstrip("/"))
    files = list(store.list())
    if not files:
        raise FileNotFoundError(f"no checkpoint file or directory at {url}")
    return store, files


def stage_checkpoint(source: CheckpointSource, url: str, *, concurrency: int,
                     keep: set[str] | None = None, fanout: Fanout | None = None,
                     records: Store | None = None,
                     hooks: Hooks = NO_HOOKS) -> PartResult:
    """Copy every file of the checkpoint at ``url`` that has no current, intact copy into
    ``source``'s cache.

    ``concurrency`` ranged reads of one stripe (``source.stripes``) are in flight at once.
    ``keep`` collects the digests of the copies this warm needs, so staging one checkpoint
    never evicts another of the same request. ``hooks.before_fetch`` is called before each
    ranged read and may block (the agent's priorities). With ``fanout`` (a job's, p2p on)
    and ``records`` (Bootseer's store, where the files' torrents are kept) each file
    comes through the job's swarm (:meth:`Fanout.fetch_file`), and from the store as
    before when it cannot; a file not every user may read at its source never does (its
    copy would be seeded to the job's other nodes, whoever runs there).
    """
    started = time.monotonic()
    on_progress, before_fetch = hooks.on_progress, hooks.before_fetch
    cache = source.copies
    keep = set() if keep is None else keep
    store, files = checkpoint_files(source, url)
    total = sum(f.size for f in files)
    if hooks.on_plan:
        hooks.on_plan(total)
    wanted = []
    for info in files:
        record = cache.verify(object_url(store, info.key), info)
        if record is not None:
            keep.add(record.sha256)
            if on_progress:
                on_progress(info.size)
        else:
            wanted.append(info)
    sharing = fanout is not None and records is not None

    def stage(info: ObjectInfo) -> tuple[int, int] | None:
        """One file: (bytes from the store, bytes from peers), or None if it could not be
        staged. Peers' bytes include failed and redundant ones: they may exceed the
        file's size, so the store's are counted, not inferred from them."""
        file_url = object_url(store, info.key)
        try:
            cache.discard(file_url)  # stale or damaged: never read again
            if info.size > cache.max_bytes:
                raise StagingError(f"{info.size} bytes do not fit in the checkpoint cache "
                                   f"({cache.max_bytes} bytes, checkpoint.cache_size)")
            if fanout is not None and records is not None:
                file = SharedFile(store, records, info.key, file_url, info.size, info.mtime)
                shared = _share(cache, file, info, keep, fanout, on_progress=on_progress,
                                before_fetch=before_fetch) if file.readable_by_all else None
                if shared is not None:
                    return shared.store_bytes, shared.peer_bytes
            record = _copy(cache, store, info, set(keep), concurrency=concurrency,
                           request_size=source.stripes.stripe_size, on_progress=on_progress,
                           before_fetch=before_fetch)
            keep.add(record.sha256)
            return info.size, 0
        except (OSError, BootseerError) as exc:  # counted as missing below
            log.warning("checkpoint %s could not be staged: %s", file_url, exc)
            return None

    # Through peers, files overlap: each spends most of its time waiting (for the other
    # members' hashes, for connections), not reading. From the store, one at a time,
    # each with ``concurrency`` reads in flight.
    with ThreadPoolExecutor(SHARED_FILES if sharing else 1,
                            thread_name_prefix="ckpt-stage") as pool:
        staged = [r for r in pool.map(stage, wanted) if r is not None]
    peer_bytes = sum(from_peers for _, from_peers in staged)
    return PartResult(CHECKPOINT, url, items=len(files), bytes=total,
                      already_local=len(files) - len(wanted), fetched=len(staged),
                      store_bytes=sum(from_store for from_store, _ in staged),
                      missing=len(wanted) - len(staged),
                      seconds=round(time.monotonic() - started, 3), peer_bytes=peer_bytes)


def _share(cache: CheckpointCache, shared: SharedFile, info: ObjectInfo, keep: set[str],
           fanout: Fanout, *, on_progress: Callable[[int], None] | None,
           before_fetch: Callable[[], None] | None) -> FetchResult | None:
    """Fetch one object through the job's swarm into a temporary, hash it, commit it (its
    digest into ``keep``) and seed the copy: where its bytes came from; None (nothing
    kept) if the swarm cannot have it."""
    store, url = shared.store, shared.url
    if before_fetch:
        before_fetch()
    tmp, spool = cache.begin(), cache.begin()
    try:
        # 0600 until commit: libtorrent would create it readable by all.
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600))
        result = fanout.fetch_file(shared, tmp, spool)
        if result is None:
            return None
        digest = hashlib.sha256()
        with open(tmp, "rb") as f:
            while chunk := f.read(4 << 20):
                digest.update(chunk)
            os.fsync(f.fileno())
        if store.stat(info.key) != info:
            raise StagingError(f"{url} changed while it was being staged")
        # A copy of ``keep`` (atomic): other files' threads add to it meanwhile.
        record = cache.commit(tmp, url, info, digest.hexdigest(), store.access(info.key),
                              keep=set(keep))
        if on_progress:
            on_progress(info.size)
        keep.add(record.sha256)
        fanout.seed_file(shared, cache.copies.path(record.sha256))
        return result
    finally:
        tmp.unlink(missing_ok=True)
        spool.unlink(missing_ok=True)


def _copy(cache: CheckpointCache, store: Store, info: ObjectInfo, keep: set[str], *,
          concurrency: int, request_size: int, on_progress: Callable[[int], None] | None,
          before_fetch: Callable[[], None] | None) -> CopyRecord:
    """Copy one object into a temporary, in order, then commit it (evicting none of
    ``keep``); nothing on failure."""
    url = object_url(store, info.key)
    layout = StripeLayout(info.size, request_size, store.block_size(info.key))
    stripes = iter(layout.stripes(0, info.size))
    digest = hashlib.sha256()

    def fetch(stripe: Stripe) -> bytearray:
        if before_fetch:
            before_fetch()
        buffer = bytearray(stripe.length)
        store.read_range_into(info.key, stripe.start, memoryview(buffer))
        return buffer

    tmp = cache.begin()
    try:
        # 0600 until commit gives it the source's readers: a partial copy is nobody's.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        with open(fd, "wb") as out, ThreadPoolExecutor(max(1, concurrency)) as pool:
            in_flight: deque[Future[bytearray]] = deque()
            try:
                while True:
                    while len(in_flight) < max(1, concurrency) and \
                            (stripe := next(stripes, None)) is not None:
                        in_flight.append(pool.submit(fetch, stripe))
                    if not in_flight:
                        break
                    data = in_flight.popleft().result()
                    digest.update(data)
                    out.write(data)
                    if on_progress:
                        on_progress(len(data))
            finally:
                for future in in_flight:
                    future.cancel()
            out.flush()
            os.fsync(out.fileno())
        if store.stat(info.key) != info:
            raise StagingError(f"{url} changed while it was being staged")
        return cache.commit(tmp, url, info, digest.hexdigest(), store.access(info.key),
                            keep=keep)
    finally:
        tmp.unlink(missing_ok=True)  # after a commit, already gone

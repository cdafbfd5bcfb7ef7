"""Pre-stage a checkpoint on a node (``bootseer warm --checkpoint URL``): local copies.

``URL`` names a checkpoint file or a directory (a DCP checkpoint: every file under it).
Each file is copied into the node's checkpoint cache (:mod:`bootseer.stripedfs.checkpoint_cache`)
with ranged reads cut like the striped reader's stripes (never across an HDFS block, so
each comes from one DataNode), ``concurrency`` in flight, written and hashed in order.
The checkpoint-load API then reads the copies instead of the network, for as long as the
store's objects are the ones copied.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from bootseer.errors import BootseerError
from bootseer.store import Store
from bootseer.store.base import ObjectInfo
from bootseer.stripedfs.checkpoint_cache import CheckpointCache, StagingError, object_url
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.files import split_url, store_for
from bootseer.stripedfs.layout import Stripe, StripeLayout

log = logging.getLogger(__name__)


@dataclass
class CheckpointResult:
    url: str
    files: int
    bytes: int  # of all files
    already_local: int  # files whose copy was current and intact
    fetched_files: int
    fetched_bytes: int
    missing: int  # files still not local at the end (failed, or the cache is too small)
    seconds: float

    @property
    def complete(self) -> bool:
        return self.missing == 0


def checkpoint_files(url: str) -> tuple[Store, list[ObjectInfo]]:
    """The store holding the checkpoint at ``url`` and its files (one, or a directory's)."""
    try:
        directory, name = split_url(url)
    except ValueError:  # a root: only a directory
        pass
    else:
        parent = store_for(directory)
        try:
            return parent, [parent.stat(name)]
        except FileNotFoundError:
            pass  # not a file: a directory?
    store = store_for(url.rstrip("/"))
    files = list(store.list())
    if not files:
        raise FileNotFoundError(f"no checkpoint file or directory at {url}")
    return store, files


def stage_checkpoint(cache: CheckpointCache, url: str, *, concurrency: int = 8,
                     request_size: int = StripeConfig.stripe_size,
                     keep: set[str] | None = None,
                     on_plan: Callable[[int], None] | None = None,
                     on_progress: Callable[[int], None] | None = None,
                     before_fetch: Callable[[], None] | None = None) -> CheckpointResult:
    """Copy every file of the checkpoint at ``url`` that has no current, intact copy.

    ``keep`` collects the URLs of the copies this warm needs, so staging one checkpoint
    never evicts another of the same request. ``before_fetch`` is called before each
    ranged read and may block (the agent's priorities).
    """
    started = time.monotonic()
    keep = set() if keep is None else keep
    store, files = checkpoint_files(url)
    total = sum(f.size for f in files)
    if on_plan:
        on_plan(total)
    cache.sweep()
    wanted = []
    for info in files:
        keep.add(object_url(store, info.key))
        if cache.verify(object_url(store, info.key), info):
            if on_progress:
                on_progress(info.size)
        else:
            wanted.append(info)
    fetched: list[int] = []
    for info in wanted:
        file_url = object_url(store, info.key)
        try:
            cache.discard(file_url)  # stale or damaged: never read again
            if not cache.make_room(info.size, keep):
                raise StagingError(f"{info.size} bytes do not fit in the checkpoint cache "
                                   f"({cache.max_bytes} bytes, checkpoint.cache_size)")
            _copy(cache, store, info, concurrency=concurrency, request_size=request_size,
                  on_progress=on_progress, before_fetch=before_fetch)
            fetched.append(info.size)
        except (OSError, BootseerError) as exc:  # counted as missing below
            log.warning("checkpoint %s could not be staged: %s", file_url, exc)
    return CheckpointResult(url=url, files=len(files), bytes=total,
                            already_local=len(files) - len(wanted),
                            fetched_files=len(fetched), fetched_bytes=sum(fetched),
                            missing=len(wanted) - len(fetched),
                            seconds=round(time.monotonic() - started, 3))


def _copy(cache: CheckpointCache, store: Store, info: ObjectInfo, *, concurrency: int,
          request_size: int, on_progress: Callable[[int], None] | None,
          before_fetch: Callable[[], None] | None) -> None:
    """Copy one object into a temporary, in order, then commit it; nothing on failure."""
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

    tmp = cache.begin(url)
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
        cache.commit(tmp, url, info, digest.hexdigest(), store.access(info.key))
    finally:
        tmp.unlink(missing_ok=True)  # after a commit, already gone

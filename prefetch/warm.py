"""``bootseer warm``: stage an image's hot blocks on this node before a job lands on it.

A scheduler (or an operator) runs it on every node of a job ahead of a restart; the
start then finds its hot blocks, and the image manifest, in the local cache. Without a hot
list there is nothing known to stage but the manifest (``all_blocks`` stages the whole
image instead). The result says whether everything needed is now local: a block can fail
to arrive (the store is unreachable) or not fit (the cache is smaller than the hot set).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from bootseer.nodecache import NodeCache
from bootseer.prefetch import hotlist
from bootseer.prefetch.hotlist import HotBlock, HotList
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.prefetcher import Prefetcher
from bootseer.store import BlobStore


@dataclass
class WarmResult:
    image: str
    image_id: str
    workload: str
    hot_list: bool  # the image has a hot list for the workload
    recordings: int  # how many starts it was merged from
    blocks: int  # blocks to stage
    bytes: int  # their compressed size
    already_local: int
    fetched_blocks: int
    fetched_bytes: int
    fetch_requests: int
    missing: int  # blocks still not local at the end
    seconds: float

    @property
    def complete(self) -> bool:
        return self.missing == 0


def warm_image(blobs: BlobStore, cache: NodeCache, image: str, workload: str, *,
               all_blocks: bool = False, concurrency: int = 4, request_size: int = 8 << 20,
               lazy: LazyImage | None = None, on_plan: Callable[[int], None] | None = None,
               on_progress: Callable[[int], None] | None = None,
               before_fetch: Callable[[], None] | None = None) -> WarmResult:
    """Fetch the hot blocks of (``image``, ``workload``) into ``cache``; wait until done.

    ``on_plan`` gets the bytes to stage before the fetching starts, ``on_progress`` the
    bytes of each request as it completes. ``lazy`` is the image if the caller has it open
    (its in-flight table is then shared with the caller's reads). ``before_fetch`` is
    called before each ranged read of blocks and may block (the agent's priorities).
    """
    started = time.monotonic()
    lazy = lazy or LazyImage(blobs, image, cache)  # also caches the manifest
    hot = hotlist.load(blobs, lazy.image_id, workload, lazy.manifest)
    wanted = hot
    if all_blocks:  # in pack order: the cheapest order to read them in
        order = sorted(range(len(lazy.manifest.blocks)),
                       key=lambda i: (lazy.manifest.blocks[i].pack,
                                      lazy.manifest.blocks[i].offset))
        wanted = HotList(lazy.image_id, workload,
                         tuple(HotBlock(lazy.manifest.blocks[i].digest, "", 0.0)
                               for i in order))
    if wanted is None:
        wanted = HotList(lazy.image_id, workload, ())
    prefetcher = Prefetcher(lazy, wanted, concurrency=concurrency, request_size=request_size,
                            on_progress=on_progress, before_fetch=before_fetch)
    if on_plan:
        on_plan(prefetcher.stats.hot_bytes)
    if prefetcher.requests:
        prefetcher.start().wait()
    lazy.wait_for(prefetcher.digests)  # blocks a concurrent warm of the image was fetching
    stats = prefetcher.stats
    return WarmResult(
        image=image, image_id=lazy.image_id, workload=workload, hot_list=hot is not None,
        recordings=hot.recordings if hot else 0, blocks=stats.hot_blocks,
        bytes=stats.hot_bytes, already_local=stats.already_local,
        fetched_blocks=stats.blocks_fetched, fetched_bytes=stats.bytes_fetched,
        fetch_requests=stats.fetch_requests,
        missing=sum(1 for d in prefetcher.digests if d not in cache),
        seconds=round(time.monotonic() - started, 3))

"""``bootseer warm``: stage an image's hot blocks on this node before a job lands on it.

A scheduler (or an operator) runs it on every node of a job ahead of a restart; the
start then finds its hot blocks, and the image manifest, in the local cache. Without a hot
list there is nothing known to stage but the manifest (``all_blocks`` stages the whole
image instead). The result says whether everything needed is now local: a block can fail
to arrive (the store is unreachable) or not fit (the cache is smaller than the hot set).

Hot blocks come by ranged reads of the hot pack (:mod:`bootseer.prefetch.prefetcher`).
When the warm is one of a job's with peer-to-peer on (a :class:`~bootseer.p2p.Fanout`),
the hot pack is one object every node needs whole, so it is fetched whole through the
job's swarm (each node reading its share from the store, the rest from peers) into the
block cache, seeded from there, and the same ranged reads are served from that copy.
Blocks the hot pack does not hold (a list without one, ``all_blocks``, blocks of a newer
recording) keep the ranged reads from the store; so does everything if the pack cannot be
fetched or kept (a full cache).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from bootseer.errors import BootseerError
from bootseer.nodecache import NodeCache
from bootseer.p2p import Fanout, FetchResult
from bootseer.prefetch import hotlist
from bootseer.prefetch.blockformat import PACK_PREFIX
from bootseer.prefetch.hotlist import HotBlock, HotLayout, HotList
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.prefetcher import Prefetcher
from bootseer.store import BlobStore

log = logging.getLogger(__name__)


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
    fetched_bytes: int  # read from the store
    fetch_requests: int
    missing: int  # blocks still not local at the end
    seconds: float
    peer_bytes: int = 0  # of the hot pack, received from the job's peers

    @property
    def complete(self) -> bool:
        return self.missing == 0


def warm_image(blobs: BlobStore, cache: NodeCache, image: str, workload: str, *,
               all_blocks: bool = False, concurrency: int = 4, request_size: int = 8 << 20,
               lazy: LazyImage | None = None, fanout: Fanout | None = None,
               on_plan: Callable[[int], None] | None = None,
               on_progress: Callable[[int], None] | None = None,
               before_fetch: Callable[[], None] | None = None) -> WarmResult:
    """Fetch the hot blocks of (``image``, ``workload``) into ``cache``; wait until done.

    ``on_plan`` gets the bytes to stage before the fetching starts, ``on_progress`` the
    bytes of each request as it completes. ``lazy`` is the image if the caller has it open
    (its in-flight table is then shared with the caller's reads). ``fanout``: the job's
    swarm, for the hot pack (see the module docstring). ``before_fetch`` is called before
    each fetch and may block (the agent's priorities).
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
    pack = None
    if fanout is not None and wanted.layout is not None:
        if before_fetch:
            before_fetch()
        pack = _hot_pack_from_peers(blobs, cache, lazy, wanted.layout, prefetcher, fanout)
    if prefetcher.requests:
        prefetcher.start().wait()
    lazy.wait_for(prefetcher.digests)  # blocks a concurrent warm of the image was fetching
    stats = prefetcher.stats
    return WarmResult(
        image=image, image_id=lazy.image_id, workload=workload, hot_list=hot is not None,
        recordings=hot.recordings if hot else 0, blocks=stats.hot_blocks,
        bytes=stats.hot_bytes, already_local=stats.already_local,
        fetched_blocks=stats.blocks_fetched,
        fetched_bytes=stats.bytes_fetched + (pack.store_bytes if pack else 0),
        fetch_requests=stats.fetch_requests,
        missing=sum(1 for d in prefetcher.digests if d not in cache),
        seconds=round(time.monotonic() - started, 3),
        peer_bytes=pack.peer_bytes if pack else 0)


def _hot_pack_from_peers(blobs: BlobStore, cache: NodeCache, lazy: LazyImage,
                         layout: HotLayout, prefetcher: Prefetcher,
                         fanout: Fanout) -> FetchResult | None:
    """The hot pack whole into ``cache`` through the job's swarm, if a block the prefetch
    reads from it is missing (a node that lacks a few fetches it all: its store share is
    1/N of the pack) and the pack has a torrent (one recorded before torrents were
    published has none: its blocks keep their ranged reads), then seeded and read by the
    prefetch from there. Returns what the fetch cost; None if nothing was fetched."""
    hexd = layout.pack.removeprefix(PACK_PREFIX)
    digest = "sha256:" + hexd
    table = lazy.manifest.blocks
    needed = any(table[piece.index].digest not in cache for request in prefetcher.requests
                 if request.pack == layout.pack for piece in request.pieces)
    result = None
    if needed and hexd not in cache and fanout.shares(blobs.store, digest, layout.size):
        tmp = cache.new_temporary(hexd)
        try:
            result = fanout.fetch_object(blobs.store, layout.pack, digest, tmp)  # verified
            os.chmod(tmp, cache.mode)
            cache.add_file(tmp, hexd)
        except (OSError, BootseerError) as exc:
            log.warning("hot pack %s of %s: %s; reading its blocks from the store instead",
                        digest, lazy.image_id, exc)
        finally:
            tmp.unlink(missing_ok=True)
    if hexd in cache:
        lazy.source.use_local(layout.pack, cache.path(hexd))
        fanout.seed(blobs.store, digest, cache.path(hexd))
    return result

"""``bootseer warm``: stage an image's hot blocks on this node before a job lands on it.

A scheduler (or an operator) runs it on every node of a job ahead of a restart; the
start then finds its hot blocks, and the image manifest, in the local cache. Without a hot
list there is nothing known to stage but the manifest (``all_blocks`` stages the whole
image instead). With ``whole_files`` (``image.passthrough``), every file the hot list
touches is then completed and kept whole (:mod:`bootseer.prefetch.wholefiles`), so that
the start's reads of it are the kernel's: that stages more than the hot blocks (the rest
of each file touched), ahead of the start rather than during it. A start mounted before
its files were whole reads them through its server all the same, so that work is left
for after the request's other parts (the result's ``later``): a warm issued beside a
start stages the environment and checkpoints it waits for first. A job's warm through its
peers completes nothing (the rest of the files would come from the store on every node):
it keeps whole the files whose blocks it staged, all of them. The result says whether
everything needed is now local: a block can fail to arrive (the store is unreachable) or
not fit (the cache is smaller than the hot set).

Hot blocks come by ranged reads of the hot pack (:mod:`bootseer.prefetch.prefetcher`).
When the warm is one of a job's with peer-to-peer on (a :class:`~bootseer.p2p.Fanout`),
the hot pack is one object every node needs whole, so it is fetched whole through the
job's swarm (each node reading its share from the store, the rest from peers) into the
block cache, seeded from there, and the same ranged reads are served from that copy;
with ``all_blocks``, so is every pack of the image (each has a torrent from its
conversion). Blocks no such pack holds (a list without a hot pack, blocks of a newer
recording) keep the ranged reads from the store; so does everything if a pack cannot be
fetched or kept (a full cache).

:class:`ImageWarmer` is this warm as a :class:`~bootseer.warming.Warmer`, the way
``bootseer warm`` and the agent run it.
"""

from __future__ import annotations

import functools
import logging
import os
import time

from bootseer.errors import BootseerError
from bootseer.nodecache import NodeCache
from bootseer.p2p import Fanout, FetchResult
from bootseer.prefetch import hotlist
from bootseer.prefetch.blockformat import MAX_MANIFEST_BYTES, PACK_PREFIX, FileEntry
from bootseer.prefetch.config import PrefetchConfig
from bootseer.prefetch.hotlist import HotBlock, HotList
from bootseer.prefetch.lazyimage import LazyImage, resolve_image
from bootseer.prefetch.metaimage import MetaImage, unsupported
from bootseer.prefetch.prefetcher import Prefetcher
from bootseer.prefetch.rootfs import Kind
from bootseer.prefetch.wholefiles import WholeFiles
from bootseer.store import BlobStore
from bootseer.warming import NO_HOOKS, Hooks, PartKind, PartResult

log = logging.getLogger(__name__)


#: What an image's warm is called: its blocks, named by the image.
IMAGE = PartKind("image", "image", "image", "blocks", "image.cache_size")


class ImageWarmer:
    """Stages images' hot blocks (or every block) in the node's block cache
    (:func:`warm_image`), with the configured prefetch reads."""

    kind = IMAGE

    def __init__(self, blobs: BlobStore, cache: NodeCache, *, workload: str,
                 all_blocks: bool = False, prefetch: PrefetchConfig,
                 whole_files: bool = False, metadata_image: bool = False,
                 lazy: LazyImage | None = None, fanout: Fanout | None = None) -> None:
        self.blobs, self.cache, self.lazy, self.fanout = blobs, cache, lazy, fanout
        self.workload, self.all_blocks, self.prefetch = workload, all_blocks, prefetch
        self.whole_files, self.metadata_image = whole_files, metadata_image

    def warm(self, name: str, hooks: Hooks) -> PartResult:
        return warm_image(self.blobs, self.cache, name, self.workload,
                          all_blocks=self.all_blocks, prefetch=self.prefetch, lazy=self.lazy,
                          fanout=self.fanout, whole_files=self.whole_files,
                          metadata_image=self.metadata_image, hooks=hooks)


def warm_image(blobs: BlobStore, cache: NodeCache, image: str, workload: str, *,
               all_blocks: bool = False, prefetch: PrefetchConfig | None = None,
               lazy: LazyImage | None = None, fanout: Fanout | None = None,
               whole_files: bool = False, metadata_image: bool = False,
               hooks: Hooks = NO_HOOKS) -> PartResult:
    """Fetch the hot blocks of (``image``, ``workload``) into ``cache``; wait until done.

    ``hooks.on_plan`` gets the bytes to stage before the fetching starts,
    ``hooks.on_progress`` the bytes of each request as it completes. ``lazy`` is the image
    if the caller has it open (its in-flight table is then shared with the caller's
    reads). ``fanout``: the job's swarm, for the hot pack (see the module docstring).
    ``hooks.before_fetch`` is called before each fetch and may block (the agent's
    priorities). The result's ``detail``: the ``image_id``, the ``workload``, whether the
    image has a ``hot_list`` for it, from how many ``recordings``, and the
    ``fetch_requests`` sent. With ``whole_files``, the result's ``later`` keeps the files
    whole (run by :meth:`~bootseer.warming.PartResult.finish`), adding the ``whole_files``
    kept whole; with ``metadata_image`` too, whether the image now has its
    ``metadata_image`` on the node (:mod:`bootseer.prefetch.metaimage`; built once, if the
    node can mount one) and the seconds that took (``metadata_image_s``).
    """
    started = time.monotonic()
    if lazy is None:
        image_id = resolve_image(blobs, image)
        if fanout is not None:  # the manifest through the job's swarm, into the cache
            fanout.cache_blob(blobs, image_id, cache, max_size=MAX_MANIFEST_BYTES)
        lazy = LazyImage(blobs, image_id, cache)  # also caches the manifest
    hot = hotlist.load(blobs, lazy.image_id, workload, lazy.manifest, cache=cache,
                       fanout=fanout)
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
    prefetcher = Prefetcher(lazy, wanted, config=prefetch,
                            on_progress=hooks.on_progress, before_fetch=hooks.before_fetch)
    if hooks.on_plan:
        hooks.on_plan(prefetcher.stats.hot_bytes)
    packs: list[FetchResult] = []
    if fanout is not None:
        for key in _packs_to_share(lazy, wanted, all_blocks):
            hooks.turn()
            result = _pack_from_peers(blobs, cache, lazy, key, prefetcher, fanout)
            if result is not None:
                packs.append(result)
    if prefetcher.requests:
        prefetcher.start().wait()
    lazy.wait_for(prefetcher.digests)  # blocks a concurrent warm of the image was fetching
    stats = prefetcher.stats
    _flush(lazy)
    result = PartResult(
        IMAGE, image, items=stats.hot_blocks, bytes=stats.hot_bytes,
        already_local=stats.already_local, fetched=stats.blocks_fetched,
        store_bytes=stats.bytes_fetched + sum(p.store_bytes for p in packs),
        missing=sum(1 for d in prefetcher.digests if d not in cache),
        seconds=round(time.monotonic() - started, 3),
        peer_bytes=sum(p.peer_bytes for p in packs),
        detail={"image_id": lazy.image_id, "workload": workload,
                "hot_list": hot is not None, "recordings": hot.recordings if hot else 0,
                "fetch_requests": stats.fetch_requests})
    if whole_files:  # for later starts: after the request's other parts
        result.later = functools.partial(_keep_whole, lazy, _files_of(lazy, wanted, all_blocks),
                                         fetch=fanout is None, metadata_image=metadata_image)
    return result


def _keep_whole(lazy: LazyImage, files: list[FileEntry], result: PartResult, hooks: Hooks, *,
                fetch: bool, metadata_image: bool) -> None:
    """The image part's work for later starts (:attr:`PartResult.later`): the files the
    hot list touches completed (``fetch``: their other blocks fetched, each fetch after
    ``hooks``' turn) and kept whole, then, with ``metadata_image``, the image's metadata
    image; counted in ``result``'s detail (``whole_files``, ``metadata_image``,
    ``metadata_image_s``; ``whole_files_s``: all of it), store bytes and seconds."""
    began, before = time.monotonic(), lazy.stats.bytes_fetched
    result.detail["whole_files"] = WholeFiles(lazy).make_whole(
        files, fetch=fetch, before_fetch=hooks.before_fetch)
    if metadata_image:
        built = time.monotonic()
        result.detail["metadata_image"] = _metadata_image(lazy)
        result.detail["metadata_image_s"] = round(time.monotonic() - built, 3)
    _flush(lazy)
    result.store_bytes += lazy.stats.bytes_fetched - before
    seconds = time.monotonic() - began
    result.detail["whole_files_s"] = round(seconds, 3)
    result.seconds = round(result.seconds + seconds, 3)


def _flush(lazy: LazyImage) -> None:
    """Wait for the disk cache's writes of what the warm fetched (up to 256 MiB of new
    cache files): a warm is done when they are on disk, not while the start it prepared
    runs beside their writes."""
    if not lazy.flush():
        log.warning("image %s: the disk cache is still writing what the warm fetched",
                    lazy.image_id)


def _metadata_image(lazy: LazyImage) -> bool:
    """Build the image's metadata image if the node can mount one; a failure costs the
    start its kernel-served names (it is served through FUSE), never the warm."""
    reason = unsupported()
    if reason is not None:
        log.info("no metadata image for %s: %s", lazy.image_id, reason)
        return False
    try:
        return MetaImage.of(lazy).build(WholeFiles(lazy))
    except (OSError, BootseerError) as exc:
        log.warning("could not build the metadata image of %s: %s", lazy.image_id, exc)
        return False


def _files_of(lazy: LazyImage, wanted: HotList, all_blocks: bool) -> list[FileEntry]:
    """The files to keep whole: every regular file with ``all_blocks``, else those the
    hot list's blocks were read from."""
    by_path = lazy.manifest.by_path
    if all_blocks:
        return [e for e in lazy.manifest.entries if e.kind is Kind.FILE]
    return [e for path in wanted.paths() if (e := by_path.get(path)) is not None]


def _packs_to_share(lazy: LazyImage, wanted: HotList, all_blocks: bool) -> list[str]:
    """The packs a warm through peers fetches whole: the hot pack; with ``all_blocks``,
    every pack of the image (each needed whole by every node of the job)."""
    if all_blocks:
        return list(lazy.manifest.packs)
    return [wanted.layout.pack] if wanted.layout is not None else []


def _pack_from_peers(blobs: BlobStore, cache: NodeCache, lazy: LazyImage, pack: str,
                     prefetcher: Prefetcher, fanout: Fanout) -> FetchResult | None:
    """``pack`` whole into ``cache`` through the job's swarm, if a block the prefetch reads
    from it is missing (a node that lacks a few fetches it all: its store share is 1/N of
    the pack), the prefetch reads at least half of it, and the pack has a torrent (a hot
    pack recorded before torrents were published has none: its blocks keep their ranged
    reads), then seeded and read by the prefetch from there (the copy is a cache entry
    like any: evicted, its seeding ends).
    Returns what the fetch cost; None if nothing was fetched."""
    hexd = pack.removeprefix(PACK_PREFIX)
    digest = "sha256:" + hexd
    table = lazy.manifest.blocks
    pieces = [piece for request in prefetcher.requests if request.pack == pack
              for piece in request.pieces]
    needed = any(table[piece.index].digest not in cache for piece in pieces)
    size = blobs.store.stat(pack).size if needed and hexd not in cache else 0
    result = None
    # A pack mostly of other images' blocks (deduplicated into it) is not worth its whole.
    if size and 2 * sum(piece.length for piece in pieces) >= size and \
            fanout.shares(blobs.store, digest, size):
        tmp = cache.new_temporary(hexd)
        try:
            result = fanout.fetch_object(blobs.store, pack, digest, tmp)  # verified
            os.chmod(tmp, cache.mode)
            cache.add_file(tmp, hexd)
        except (OSError, BootseerError) as exc:
            log.warning("pack %s of %s: %s; reading its blocks from the store instead",
                        digest, lazy.image_id, exc)
        finally:
            tmp.unlink(missing_ok=True)
    if hexd in cache:
        lazy.source.use_local(pack, cache.path(hexd))
        fanout.seed(blobs.store, digest, cache.path(hexd))
    return result

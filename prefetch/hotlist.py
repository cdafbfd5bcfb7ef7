"""Hot lists: which blocks of an image a start reads, and in which order.

A :class:`Recorder` notes the first access of each block while a container starts from a
lazy mount (block digest, the file it was read for, seconds since the start). The result
is a :class:`HotList`, kept in the store per image and per workload (the same image
started with another entry point reads other blocks) under the ref
``hot/<image hex>/<workload>``. Several recordings merge into one: the union of their
blocks, ordered by the median of their first-access times, so the list converges to what
starts have in common and stays small. A hot list is only advice: one that does not
decode, or that names blocks the image does not have (the image changed), is ignored
with a warning, never an error.

Saving a recording also lays the hot blocks out again (:mod:`bootseer.prefetch.hotpack`): their
compressed bytes, copied in hot-list order into one *hot pack*, so that a prefetch is a
few large sequential reads rather than one small read per block scattered over the
image's packs. The list records where each block sits in the hot pack.
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
from dataclasses import dataclass, field

from bootseer import boundedjson
from bootseer.nodecache import NodeCache
from bootseer.p2p import Fanout, publish_torrent
from bootseer.prefetch.blockformat import Manifest
from bootseer.store import BlobStore

log = logging.getLogger(__name__)

FORMAT = "bootseer-hotlist/1"
DEFAULT_WORKLOAD = "default"
#: The largest hot list this format allows (checked before it is read): a block's record
#: is its digest, a path and its samples, about 100 bytes, so this is millions of blocks.
MAX_HOTLIST_BYTES = 256 << 20


@dataclass(frozen=True)
class HotBlock:
    digest: str
    path: str  # the file it was first read for (for people reading the list)
    seconds: float  # median time of first access since the start, over the recordings


@dataclass(frozen=True)
class HotLayout:
    """Where the hot blocks sit in a hot pack: digest -> (offset, compressed length)."""

    pack: str  # store key, packs/<sha256>
    pieces: dict[str, tuple[int, int]]

    @property
    def size(self) -> int:
        return sum(length for _, length in self.pieces.values())


@dataclass(frozen=True)
class HotList:
    image_id: str
    workload: str
    blocks: tuple[HotBlock, ...]
    recordings: int = 1
    #: Per block, the first-access times of every recording, so merges stay exact.
    samples: dict[str, list[float]] = field(default_factory=dict, compare=False)
    layout: HotLayout | None = field(default=None, compare=False)

    def with_blocks(self, blocks: tuple[HotBlock, ...]) -> HotList:
        return HotList(self.image_id, self.workload, blocks, self.recordings, self.samples,
                       self.layout)

    def paths(self) -> list[str]:
        """The files the blocks were read from, each once, in the list's order: the
        files a warm keeps whole."""
        return list(dict.fromkeys(block.path for block in self.blocks if block.path))

    def within(self, manifest: Manifest) -> HotList:
        """The list without the blocks ``manifest``'s image does not have: a stale list
        (the image was rebuilt under the same name) still helps with what did not change."""
        known = manifest.block_index
        kept = tuple(b for b in self.blocks if b.digest in known)
        if len(kept) < len(self.blocks):
            log.warning("hot list of image %s (%s): %d of %d blocks are not in the image; "
                        "ignoring them", self.image_id, self.workload,
                        len(self.blocks) - len(kept), len(self.blocks))
        return self.with_blocks(kept)

    def encode(self) -> bytes:
        body = {"format": FORMAT, "image_id": self.image_id, "workload": self.workload,
                "recordings": self.recordings,
                "blocks": [[b.digest, b.path, self.samples.get(b.digest, [b.seconds])]
                           for b in self.blocks]}
        if self.layout is not None:
            body["layout"] = {"pack": self.layout.pack,
                              "pieces": {d: list(p) for d, p in self.layout.pieces.items()}}
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> HotList:
        body = boundedjson.loads(data, limit=MAX_HOTLIST_BYTES, what="a hot list")
        if body.get("format") != FORMAT:
            raise ValueError(f"unknown hot list format {body.get('format')!r}")
        samples = {digest: [float(t) for t in times] for digest, _, times in body["blocks"]}
        blocks = tuple(HotBlock(digest, path, statistics.median(samples[digest]))
                       for digest, path, _ in body["blocks"])
        layout = None
        if body.get("layout"):
            layout = HotLayout(str(body["layout"]["pack"]),
                               {d: (int(o), int(n))
                                for d, (o, n) in body["layout"]["pieces"].items()})
        return cls(body["image_id"], body["workload"], blocks, int(body["recordings"]),
                   samples, layout)


def merge(lists: list[HotList]) -> HotList:
    """One list from several recordings of the same image and workload."""
    if not lists:
        raise ValueError("nothing to merge")
    first = lists[0]
    samples: dict[str, list[float]] = {}
    paths: dict[str, str] = {}
    for hot in lists:
        if (hot.image_id, hot.workload) != (first.image_id, first.workload):
            raise ValueError("hot lists of different images or workloads do not merge")
        for block in hot.blocks:
            samples.setdefault(block.digest, []).extend(hot.samples.get(block.digest,
                                                                        [block.seconds]))
            paths.setdefault(block.digest, block.path)
    order = sorted(samples, key=lambda d: (statistics.median(samples[d]), d))
    blocks = tuple(HotBlock(d, paths[d], statistics.median(samples[d])) for d in order)
    return HotList(first.image_id, first.workload, blocks,
                   sum(h.recordings for h in lists), samples)


class Recorder:
    """Notes first accesses of blocks; thread-safe, cheap enough for every read."""

    def __init__(self, image_id: str, workload: str = DEFAULT_WORKLOAD) -> None:
        self.image_id, self.workload = image_id, workload
        self._start = time.monotonic()
        self._first: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self.stopped = False

    def saw(self, digest: str, path: str) -> None:
        if self.stopped or digest in self._first:
            return
        with self._lock:
            self._first.setdefault(digest, (path, time.monotonic() - self._start))

    def stop(self) -> HotList:
        """End the recording ("the start is over") and return what it saw."""
        with self._lock:
            self.stopped = True
            order = sorted(self._first.items(), key=lambda item: (item[1][1], item[0]))
        return HotList(self.image_id, self.workload,
                       tuple(HotBlock(d, p, t) for d, (p, t) in order), 1,
                       {d: [t] for d, (_, t) in order})


def ref_name(image_id: str, workload: str) -> str:
    return f"hot/{image_id.removeprefix('sha256:')}/{workload}"


def save(blobs: BlobStore, recording: HotList, manifest: Manifest | None = None,
         local: NodeCache | None = None) -> HotList:
    """Merge ``recording`` into the stored list of its image and workload; store the result.

    With the image's ``manifest``, the hot blocks are also laid out in a hot pack — again
    only when the merge changed which blocks are hot (a new order of the same blocks keeps
    the pack: a prefetch reads it in list order anyway, only in more pieces) — and a copy
    of a new pack kept in ``local``, the node's block cache (for its torrent and seeding).
    """
    from bootseer.prefetch.hotpack import write_hot_pack

    stored = load(blobs, recording.image_id, recording.workload, manifest)
    merged = merge([stored, recording]) if stored is not None else recording
    if manifest is not None:
        layout = stored.layout if stored is not None else None
        if layout is None or set(layout.pieces) != {b.digest for b in merged.blocks}:
            layout = write_hot_pack(blobs, manifest, [b.digest for b in merged.blocks],
                                    local)
        merged = HotList(merged.image_id, merged.workload, merged.blocks, merged.recordings,
                         merged.samples, layout)
    data = merged.encode()
    info = blobs.put(data)
    publish_torrent(blobs.store, info.digest, data)  # a job's nodes share it too
    blobs.set_ref(ref_name(merged.image_id, merged.workload), info.digest,
                  {"recordings": merged.recordings, "blocks": len(merged.blocks)})
    return merged


def load(blobs: BlobStore, image_id: str, workload: str = DEFAULT_WORKLOAD,
         manifest: Manifest | None = None, *, cache: NodeCache | None = None,
         fanout: Fanout | None = None) -> HotList | None:
    """The stored hot list, or None if there is none or it cannot be used (with a warning).

    With ``manifest``, blocks the image does not have are dropped (:meth:`HotList.within`).
    The list's bytes are kept in ``cache``, the node's block cache, and found there again
    (a warm's copy serves the start after it); with ``fanout`` they come through the job's
    swarm.
    """
    try:
        ref = blobs.get_ref(ref_name(image_id, workload))
    except FileNotFoundError:
        return None
    except Exception as exc:  # the store failed: a start goes on without advice
        log.warning("could not read the hot list of image %s (%s): %s", image_id, workload,
                    exc)
        return None
    try:
        hot = HotList.decode(_list_bytes(blobs, ref.digest, cache, fanout))
    except Exception as exc:
        log.warning("ignoring the hot list of image %s (%s): %s", image_id, workload, exc)
        return None
    return hot if manifest is None else hot.within(manifest)


def _list_bytes(blobs: BlobStore, digest: str, cache: NodeCache | None,
                fanout: Fanout | None) -> bytes:
    """A hot list's bytes: from ``cache`` (through ``fanout`` into it first), else the
    store's, kept in ``cache`` if it can take them."""
    if cache is None:
        return blobs.get(digest, MAX_HOTLIST_BYTES)
    if fanout is not None:
        fanout.cache_blob(blobs, digest, cache, max_size=MAX_HOTLIST_BYTES)
    return cache.get_or_fetch(digest.removeprefix("sha256:"),
                              lambda: blobs.get(digest, MAX_HOTLIST_BYTES))

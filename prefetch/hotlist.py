"""Hot lists: which blocks of an image a start reads, and in which order.

A :class:`Recorder` notes the first access of each block while a container starts from a
lazy mount (block digest, the file it was read for, seconds since the start). The result
is a :class:`HotList`, kept in the store per image and per workload (the same image
started with another entry point reads other blocks). Several recordings merge into one:
the union of their blocks, ordered by the median of their first-access times, so the list
converges to what starts have in common and stays small.

Many nodes end their recordings at once (a job's restart), so a save is a merge into the
latest list that must not lose another node's merge. Each save writes a new *generation*,
the create-only ref ``hot/<image hex>/<workload>/<n>``: a writer that finds ``n`` taken
merges that list and tries ``n + 1``. Every generation then holds every recording of the
ones before it; readers take the highest. Old generations are pruned, keeping two.

A hot list is only advice: one that does not decode, or that names blocks the image does
not have (the image changed), is ignored with a warning, never an error.

Saving a recording also lays the hot blocks out again (:mod:`bootseer.prefetch.hotpack`): their
compressed bytes, copied in hot-list order into one *hot pack*, so that a prefetch is a
few large sequential reads rather than one small read per block scattered over the
image's packs. The list records where each block sits in the hot pack.
"""

from __future__ import annotations

import itertools
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
from bootseer.store import BlobStore, Ref

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


#: How many times a save merges a newer generation and tries again before it gives its
#: recording up (with a warning): a hot list is advice, and every try may write a pack.
SAVE_ATTEMPTS = 8
#: Generations kept: the newest, and the one before it for readers that listed just
#: before the newest appeared.
KEEP_GENERATIONS = 2
#: Most refs a list's generations may have in the store: saves leave KEEP_GENERATIONS (a
#: few more while saves race), so more is a store someone else wrote, and reading it
#: whole would let its writer size this process's memory.
MAX_GENERATIONS = 64


def ref_prefix(image_id: str, workload: str) -> str:
    """The refs of every generation of one image's and workload's list sit under this."""
    return f"hot/{image_id.removeprefix('sha256:')}/{workload}/"


def ref_name(image_id: str, workload: str, generation: int) -> str:
    return f"{ref_prefix(image_id, workload)}{generation}"


def generations(blobs: BlobStore, image_id: str, workload: str) -> list[int]:
    """The stored generations of a list, oldest first (ValueError: more refs than
    MAX_GENERATIONS)."""
    prefix = ref_prefix(image_id, workload)
    names = [name.removeprefix(prefix)
             for name in itertools.islice(blobs.list_refs(prefix), MAX_GENERATIONS + 1)]
    if len(names) > MAX_GENERATIONS:
        raise ValueError(f"the store has more than {MAX_GENERATIONS} refs under {prefix!r}; "
                         f"Bootseer's saves keep {KEEP_GENERATIONS}: remove them")
    return sorted(int(name) for name in names if name.isdigit())


def latest_ref(blobs: BlobStore, image_id: str, workload: str) -> tuple[int, Ref] | None:
    """The newest generation and its ref, or None if there is none. A generation pruned
    between the listing and the read is listed again."""
    for _ in range(KEEP_GENERATIONS + 1):
        found = generations(blobs, image_id, workload)
        if not found:
            return None
        try:
            return found[-1], blobs.get_ref(ref_name(image_id, workload, found[-1]))
        except FileNotFoundError:
            continue
    raise RuntimeError(f"the hot list of image {image_id} ({workload}) changed faster than it "
                       f"could be read")


def save(blobs: BlobStore, recording: HotList, manifest: Manifest | None = None,
         local: NodeCache | None = None) -> HotList:
    """Merge ``recording`` into the newest stored list of its image and workload and store
    the result as the next generation. Returns the merge, or the recording alone, not
    stored, if other saves kept winning (:data:`SAVE_ATTEMPTS`).

    With the image's ``manifest``, the hot blocks are also laid out in a hot pack — again
    only when the merge changed which blocks are hot (a new order of the same blocks keeps
    the pack: a prefetch reads it in list order anyway, only in more pieces) — and a copy
    of a new pack kept in ``local``, the node's block cache (for its torrent and seeding).
    """
    image_id, workload = recording.image_id, recording.workload
    for _ in range(SAVE_ATTEMPTS):
        latest = latest_ref(blobs, image_id, workload)
        stored = _decoded(blobs, latest[1].digest, image_id, workload, manifest) \
            if latest is not None else None
        merged = _merged_and_laid_out(blobs, stored, recording, manifest, local)
        data = merged.encode()
        info = blobs.put(data)
        publish_torrent(blobs.store, info.digest, data)  # a job's nodes share it too
        generation = latest[0] + 1 if latest is not None else 1
        try:
            blobs.set_ref(ref_name(image_id, workload, generation), info.digest,
                          {"recordings": merged.recordings, "blocks": len(merged.blocks)},
                          overwrite=False)
        except FileExistsError:
            continue  # another node saved first: merge into its list
        _prune(blobs, image_id, workload, generation)
        return merged
    log.warning("the hot list of image %s (%s) was saved by others %d times while this "
                "node merged its recording; the recording is dropped", image_id, workload,
                SAVE_ATTEMPTS)
    return recording


def _merged_and_laid_out(blobs: BlobStore, stored: HotList | None, recording: HotList,
                         manifest: Manifest | None, local: NodeCache | None) -> HotList:
    from bootseer.prefetch.hotpack import write_hot_pack

    merged = merge([stored, recording]) if stored is not None else recording
    if manifest is None:
        return merged
    layout = stored.layout if stored is not None else None
    if layout is None or set(layout.pieces) != {b.digest for b in merged.blocks}:
        layout = write_hot_pack(blobs, manifest, [b.digest for b in merged.blocks], local)
    return HotList(merged.image_id, merged.workload, merged.blocks, merged.recordings,
                   merged.samples, layout)


def _prune(blobs: BlobStore, image_id: str, workload: str, newest: int) -> None:
    """Remove the generations older than the :data:`KEEP_GENERATIONS` newest: each holds
    every recording of the ones before it."""
    for old in generations(blobs, image_id, workload):
        if old > newest - KEEP_GENERATIONS:
            break
        try:
            blobs.delete_ref(ref_name(image_id, workload, old))
        except FileNotFoundError:
            pass  # another saver pruned it


def load(blobs: BlobStore, image_id: str, workload: str = DEFAULT_WORKLOAD,
         manifest: Manifest | None = None, *, cache: NodeCache | None = None,
         fanout: Fanout | None = None) -> HotList | None:
    """The newest stored hot list, or None if there is none or it cannot be used (with a
    warning).

    With ``manifest``, blocks the image does not have are dropped (:meth:`HotList.within`).
    The list's bytes are kept in ``cache``, the node's block cache, and found there again
    (a warm's copy serves the start after it); with ``fanout`` they come through the job's
    swarm.
    """
    try:
        latest = latest_ref(blobs, image_id, workload)
    except Exception as exc:  # the store failed: a start goes on without advice
        log.warning("could not read the hot list of image %s (%s): %s", image_id, workload,
                    exc)
        return None
    if latest is None:
        return None
    return _decoded(blobs, latest[1].digest, image_id, workload, manifest, cache, fanout)


def _decoded(blobs: BlobStore, digest: str, image_id: str, workload: str,
             manifest: Manifest | None, cache: NodeCache | None = None,
             fanout: Fanout | None = None) -> HotList | None:
    """The list stored as ``digest``, or None (with a warning) if it cannot be used."""
    try:
        hot = HotList.decode(_list_bytes(blobs, digest, cache, fanout))
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

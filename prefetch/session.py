"""One lazy mount for one container start: prefetch its hot list, record it, serve it.

This is what a lazy image's FUSE server process runs, given its spec
(:class:`bootseer.prefetch.serverspec.ImageServerSpec`, :mod:`bootseer.serve`): load the
image, start prefetching the hot list of (image, workload) before the mount is even
there, start a recording if asked, serve until unmounted, then end the recording and
store it, and write a final report of what the start cost.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bootseer import boundedjson
from bootseer.errors import BootseerError
from bootseer.fuse.passthrough import PassthroughCounts
from bootseer.fuse.server import PushCounts, RequestCounts, serve_at
from bootseer.fuse.server import serve as serve_connection
from bootseer.jsonfile import write_json
from bootseer.nodecache import NodeCaches
from bootseer.prefetch import hotlist
from bootseer.prefetch.blocksource import PeerRead
from bootseer.prefetch.config import PrefetchConfig
from bootseer.prefetch.hotlist import HotList
from bootseer.prefetch.imagetree import ImageTree
from bootseer.prefetch.lazyimage import LazyImage, LazyStats, ManifestLoad, resolve_image
from bootseer.prefetch.metaimage import KeyTree, MetaImage
from bootseer.prefetch.pagewarm import ReadAheadCounts
from bootseer.prefetch.prefetcher import Prefetcher, PrefetchStats
from bootseer.prefetch.recording import Recording
from bootseer.prefetch.serverspec import ImageServerSpec
from bootseer.prefetch.wholefiles import WholeFiles
from bootseer.store import BlobStore, open_configured_store

log = logging.getLogger(__name__)
T = TypeVar("T")

#: How often a mount's statistics file is refreshed.
STATS_INTERVAL = 0.5
#: A mount's info file: the image's config (32 MiB at most, prefetch.image_source) and a
#: few fields.
MAX_INFO_BYTES = 33 << 20
#: A mount's statistics: some dozens of counters.
MAX_STATS_BYTES = 1 << 20

#: Starts are recorded by default until the hot list has merged this many: by then it has
#: converged, and further starts only pay for the recording.
RECORD_UNTIL = 3


def start_prefetch(image: LazyImage, hot: HotList | None, config: PrefetchConfig, *,
                   read_whole: WholeFiles | None = None) -> Prefetcher | None:
    """Prefetch the image's hot list in the background, if it has one; ``read_whole``:
    the root names the files through the image's metadata image, and the kernel reads
    those of them kept whole on the node itself (their blocks are not fetched)."""
    if hot is None or not hot.blocks:
        log.info("image %s has no hot list: nothing to prefetch", image.image_id)
        return None
    return Prefetcher(image, hot, config=config,
                      read_whole=read_whole.has if read_whole is not None else None).start()


@dataclass(frozen=True)
class MountInfo:
    """What a server tells whoever started it once the image is loaded (``--info``): what
    a container's config needs of the image, and whether this start records."""

    image_id: str
    config: dict[str, Any]  # the image's OCI config (its "config" holds Env, Cmd, ...)
    content_bytes: int
    recording: bool
    by_key: bool = False  # files served by key, under the image's metadata image

    def save(self, path: Path) -> None:
        write_json(path, dataclasses.asdict(self))

    @classmethod
    def load(cls, path: Path) -> MountInfo:
        body = boundedjson.load_file(path, limit=MAX_INFO_BYTES, what=f"mount info {path}")
        info = cls(str(body["image_id"]), body["config"], int(body["content_bytes"]),
                   bool(body["recording"]), bool(body.get("by_key", False)))
        if not isinstance(info.config, dict):
            raise BootseerError(f"image {info.image_id}: its config is not an object")
        return info


@dataclass(frozen=True)
class RecordingSummary:
    """A start's recording, as far as it went."""

    workload: str
    ended: str | None  # ready, marker, timeout, exit; None while it runs
    hot_blocks: int | None  # of the merged hot list, once stored
    recordings: int | None  # starts the merged list holds
    hot_bytes: int | None  # its hot pack's size


@dataclass(frozen=True)
class MountStats:
    """What a mount has cost and done: refreshed while it serves (``bootseer image stats``,
    the agent's priorities) and its report when it ends. As JSON, the image's read counts
    sit at the top level beside ``prefetch`` and ``recording``."""

    reads: LazyStats
    prefetch: PrefetchStats | None = None
    recording: RecordingSummary | None = None
    image_id: str | None = None  # in the final report
    image_content_bytes: int | None = None
    manifest: ManifestLoad | None = None  # what loading the manifest cost, before serving
    fuse_requests: dict[str, int] | None = None  # answered by this server, by kind
    pages_pushed: PushCounts | None = None  # hot blocks put in the page cache ahead of reads
    fuse_cpu_s: dict[str, float] | None = None  # CPU answering them, by kind
    server_cpu_s: float | None = None  # the server's CPU (user + system) since it took the spec
    passthrough: PassthroughCounts | None = None  # files the kernel was given to read itself
    read_ahead: ReadAheadCounts | None = None  # their hot blocks it was asked to read ahead

    @classmethod
    def of(cls, image: LazyImage, prefetcher: Prefetcher | None = None,
           recording: Recording | None = None, *, final: bool = False,
           requests: RequestCounts | None = None, pushes: PushCounts | None = None,
           cpu_since: float | None = None,
           passthrough: PassthroughCounts | None = None,
           read_ahead: ReadAheadCounts | None = None) -> MountStats:
        summary = None
        if recording is not None:
            result = recording.result
            summary = RecordingSummary(
                recording.workload, recording.reason,
                len(result.blocks) if result else None, result.recordings if result else None,
                result.layout.size if result and result.layout else None)
        return cls(dataclasses.replace(image.stats),
                   dataclasses.replace(prefetcher.stats) if prefetcher else None, summary,
                   image.image_id if final else None,
                   image.manifest.content_bytes if final else None, image.manifest_load,
                   requests.snapshot() if requests is not None else None,
                   dataclasses.replace(pushes) if pushes is not None else None,
                   requests.cpu_seconds() if requests is not None else None,
                   round(process_cpu() - cpu_since, 3) if cpu_since is not None else None,
                   dataclasses.replace(passthrough) if passthrough is not None else None,
                   dataclasses.replace(read_ahead) if read_ahead is not None else None)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = dataclasses.asdict(self.reads)
        body["prefetch"] = dataclasses.asdict(self.prefetch) if self.prefetch else None
        if self.recording is not None:
            body["recording"] = dataclasses.asdict(self.recording)
        if self.image_id is not None:
            body["image_id"] = self.image_id
            body["image_content_bytes"] = self.image_content_bytes
        if self.manifest is not None:
            body["manifest"] = dataclasses.asdict(self.manifest)
        if self.fuse_requests is not None:
            body["fuse_requests"] = self.fuse_requests
        if self.pages_pushed is not None:
            body["pages_pushed"] = dataclasses.asdict(self.pages_pushed)
        if self.fuse_cpu_s is not None:
            body["fuse_cpu_s"] = self.fuse_cpu_s
        if self.server_cpu_s is not None:
            body["server_cpu_s"] = self.server_cpu_s
        if self.passthrough is not None:
            body["passthrough"] = dataclasses.asdict(self.passthrough)
        if self.read_ahead is not None:
            body["read_ahead"] = dataclasses.asdict(self.read_ahead)
        return body

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> MountStats:
        prefetch, recording = body.get("prefetch"), body.get("recording")
        manifest, requests = body.get("manifest"), body.get("fuse_requests")
        pushed, cpu = body.get("pages_pushed"), body.get("fuse_cpu_s")
        passthrough, read_ahead = body.get("passthrough"), body.get("read_ahead")
        return cls(_fields(LazyStats, body),
                   _fields(PrefetchStats, prefetch) if prefetch else None,
                   _fields(RecordingSummary, recording) if recording else None,
                   body.get("image_id"), body.get("image_content_bytes"),
                   _fields(ManifestLoad, manifest) if manifest else None,
                   {str(k): int(v) for k, v in requests.items()} if requests else None,
                   _fields(PushCounts, pushed) if pushed else None,
                   {str(k): float(v) for k, v in cpu.items()} if cpu else None,
                   body.get("server_cpu_s"),
                   _fields(PassthroughCounts, passthrough) if passthrough else None,
                   _fields(ReadAheadCounts, read_ahead) if read_ahead else None)

    def save(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> MountStats:
        return cls.from_json(boundedjson.load_file(path, limit=MAX_STATS_BYTES,
                                                   what=f"mount statistics {path}"))


def _fields(kind: type[T], body: dict[str, Any]) -> T:
    """A dataclass from the JSON object of one (fields it does not know are ignored)."""
    names = {f.name for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    return kind(**{k: v for k, v in body.items() if k in names})


def process_cpu() -> float:
    """This process's CPU seconds, user and system."""
    return sum(os.times()[:2])


def _announce(spec: ImageServerSpec, image: LazyImage, record: bool) -> bool:
    """Decide whether the files are served by key (the image has a metadata image, the
    start does not record, and the agent, which holds the connection, mounts the overlay)
    and tell the caller (``spec.info``: its cue that the mount can be used); the
    decision."""
    by_key = spec.by_key
    if by_key is None:
        by_key = spec.fuse_fd is not None and not record and spec.config.image.passthrough \
            and spec.config.image.kernel_metadata and MetaImage.of(image).use()
    if spec.info is not None:
        MountInfo(image.image_id, image.manifest.config, image.manifest.content_bytes,
                  record, by_key).save(spec.info)
    return by_key


def serve(spec: ImageServerSpec, peer_read: PeerRead | None = None) -> None:
    """Serve ``spec`` until unmounted; ``peer_read`` (with ``spec.peer_job``) reads packs
    through the node's peers. Its statistics count CPU from here: a spare server's start
    (imports, warming up) came before the start it serves."""
    began = process_cpu()
    blobs = BlobStore(open_configured_store(spec.config))
    image_id = spec.image_id or resolve_image(blobs, spec.image)
    with ThreadPoolExecutor(1, thread_name_prefix="hot-list") as pool:
        # Two store reads that need not wait for each other: the hot list, the manifest.
        blocks = NodeCaches.for_config(spec.config).blocks()
        stored_hot = pool.submit(hotlist.load, blobs, image_id, spec.workload, cache=blocks) \
            if spec.prefetch or spec.record_auto else None
        image = LazyImage(blobs, image_id, blocks)
        if spec.record is None:  # nothing left to decide: the caller goes on meanwhile
            by_key = _announce(spec, image, record=False)
        loaded = stored_hot.result() if stored_hot is not None else None
    hot = loaded.within(image.manifest) if loaded is not None else None
    image.source.peer_read = peer_read
    recording = None
    record = spec.record is not None and (
        not spec.record_auto or hot is None or hot.recordings < RECORD_UNTIL)
    if record:
        recording = Recording(image, spec.workload, spec.record).start()
    if spec.record is not None:
        by_key = _announce(spec, image, record)
    whole = WholeFiles(image)
    prefetcher = None
    if spec.prefetch:
        prefetcher = start_prefetch(image, hot, spec.prefetch_config,
                                    read_whole=whole if by_key else None)
    stop_stats = threading.Event()
    requests, pushes, passthrough = RequestCounts(), PushCounts(), PassthroughCounts()
    read_ahead = ReadAheadCounts()
    if spec.stats is not None:
        stats_file = spec.stats

        def refresh() -> None:
            while not stop_stats.wait(STATS_INTERVAL):
                MountStats.of(image, prefetcher, recording, requests=requests,
                              pushes=pushes, cpu_since=began,
                              passthrough=passthrough, read_ahead=read_ahead).save(stats_file)

        stats_file.parent.mkdir(parents=True, exist_ok=True)
        MountStats.of(image, prefetcher, recording, requests=requests, pushes=pushes,
                      cpu_since=began, passthrough=passthrough,
                      read_ahead=read_ahead).save(stats_file)
        threading.Thread(target=refresh, name="stats", daemon=True).start()
    digests = prefetcher.digests if prefetcher is not None else ()
    options = {"passthrough": spec.config.image.passthrough, "read_ahead": read_ahead,
               "whole": whole}
    tree = KeyTree(image, digests, hot_files=hot.paths() if hot is not None else (),
                   **options) if by_key else ImageTree(image, digests, **options)
    try:
        if spec.fuse_fd is not None:
            serve_connection(tree, spec.fuse_fd, takeover_state=spec.takeover_state,
                             requests=requests, pushes=pushes, passthrough=passthrough)
        else:
            serve_at(tree, spec.mountpoint, spec.fsname, requests=requests, pushes=pushes,
                     passthrough=passthrough)
    finally:
        stop_stats.set()
        if spec.stats is not None:
            spec.stats.unlink(missing_ok=True)
        if prefetcher is not None:
            prefetcher.stop()
        if recording is not None:
            recording.finish("exit")
        image.flush()  # the report's CPU includes the disk cache's writes
        if spec.report is not None:
            MountStats.of(image, prefetcher, recording, final=True, requests=requests,
                          pushes=pushes, cpu_since=began,
                          passthrough=passthrough, read_ahead=read_ahead).save(spec.report)


"""One lazy mount for one container start: prefetch its hot list, record it, serve it.

This is what a FUSE server process runs (``bootseer image mount --foreground``): load the
image, start prefetching the hot list of (image, workload) before the mount is even
there, start a recording if asked, serve until unmounted, then end the recording and
store it, and write a final report of what the start cost.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from bootseer.fuse.server import serve as serve_connection
from bootseer.fuse.server import serve_at
from bootseer.jsonfile import write_json
from bootseer.nodecache import NodeCache
from bootseer.prefetch import hotlist
from bootseer.prefetch.hotlist import DEFAULT_WORKLOAD, HotList
from bootseer.prefetch.imagetree import ImageTree
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.prefetcher import Prefetcher
from bootseer.prefetch.recording import ReadyWhen, Recording
from bootseer.store import BlobStore

log = logging.getLogger(__name__)

#: How often a mount's statistics file is refreshed.
STATS_INTERVAL = 0.5

#: Starts are recorded by default until the hot list has merged this many: by then it has
#: converged, and further starts only pay for the recording.
RECORD_UNTIL = 3


@dataclass(frozen=True)
class SessionOptions:
    workload: str = DEFAULT_WORKLOAD
    prefetch: bool = True
    prefetch_concurrency: int = 4
    prefetch_request_size: int = 8 << 20
    record: ReadyWhen | None = None  # None: do not record this start
    #: Record only while the hot list has merged fewer than RECORD_UNTIL recordings.
    record_auto: bool = False
    info: Path | None = None  # what the caller needs of the image, written once it is loaded
    stats: Path | None = None  # statistics so far as JSON, refreshed while mounted
    report: Path | None = None  # final statistics as JSON, written when the mount ends
    #: Serve this already-mounted /dev/fuse connection (held by the agent, so it survives
    #: its server) instead of mounting one; ``takeover_state`` goes with it.
    fuse_fd: int | None = None
    takeover_state: Path | None = None

    def argv(self, store: str, image: str, mountpoint: Path) -> list[str]:
        """The command line of a server process (``bootseer image mount --foreground``)
        that serves ``image`` from ``store`` at ``mountpoint`` with these options: the one
        place it is built, for ``bootseer image mount`` and the node agent alike. Prefetch
        request sizes and the cache come from the server's own configuration."""
        args = [sys.executable, "-m", "bootseer", "--store", store, "image", "mount",
                "--foreground", "--workload", self.workload,
                "--prefetch" if self.prefetch else "--no-prefetch"]
        if self.record is not None:
            args += ["--record-auto" if self.record_auto else "--record",
                     "--record-timeout", str(self.record.timeout)]
            if self.record.ready_file is not None:
                args += ["--ready-file", str(self.record.ready_file)]
            if self.record.marker is not None:
                args += ["--ready-marker", str(self.record.marker)]
        for flag, value in (("--report", self.report), ("--info", self.info),
                            ("--fuse-fd", self.fuse_fd),
                            ("--takeover-state", self.takeover_state)):
            if value is not None:
                args += [flag, str(value)]
        return [*args, "--", image, str(mountpoint)]


def start_prefetch(image: LazyImage, hot: HotList | None, *, concurrency: int,
                   request_size: int) -> Prefetcher | None:
    """Prefetch the image's hot list in the background, if it has one."""
    if hot is None or not hot.blocks:
        log.info("image %s has no hot list: nothing to prefetch", image.image_id)
        return None
    return Prefetcher(image, hot, concurrency=concurrency, request_size=request_size).start()


def mount_stats(image: LazyImage, prefetcher: Prefetcher | None = None,
                recording: Recording | None = None) -> dict:
    """What a mount has cost and done so far (``bootseer image stats``, the report)."""
    stats: dict = dataclasses.asdict(image.stats)
    stats["prefetch"] = dataclasses.asdict(prefetcher.stats) if prefetcher else None
    if recording is not None:
        result = recording.result
        stats["recording"] = {"workload": recording.workload, "ended": recording.reason,
                              "hot_blocks": len(result.blocks) if result else None,
                              "recordings": result.recordings if result else None,
                              "hot_bytes": result.layout.size if result and result.layout
                              else None}
    return stats


def serve(blobs: BlobStore, image_name: str, cache: NodeCache, mountpoint: Path,
          options: SessionOptions) -> None:
    image = LazyImage(blobs, image_name, cache)
    hot = None
    if options.prefetch or options.record_auto:
        hot = hotlist.load(blobs, image.image_id, options.workload, image.manifest)
    prefetcher = None
    if options.prefetch:
        prefetcher = start_prefetch(image, hot, concurrency=options.prefetch_concurrency,
                                    request_size=options.prefetch_request_size)
    recording = None
    record = options.record is not None and (
        not options.record_auto or hot is None or hot.recordings < RECORD_UNTIL)
    if record:
        recording = Recording(image, options.workload, options.record).start()
    if options.info is not None:
        write_json(options.info, {"image_id": image.image_id, "config": image.manifest.config,
                                   "content_bytes": image.manifest.content_bytes,
                                   "recording": record})
    stop_stats = threading.Event()
    if options.stats is not None:
        stats_path = options.stats

        def refresh() -> None:
            while not stop_stats.wait(STATS_INTERVAL):
                write_json(stats_path, mount_stats(image, prefetcher, recording))

        stats_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(stats_path, mount_stats(image, prefetcher, recording))
        threading.Thread(target=refresh, name="stats", daemon=True).start()
    tree = ImageTree(image)
    try:
        if options.fuse_fd is not None:
            serve_connection(tree, options.fuse_fd, takeover_state=options.takeover_state)
        else:
            serve_at(tree, mountpoint, "bootseer-image")
    finally:
        stop_stats.set()
        if options.stats is not None:
            options.stats.unlink(missing_ok=True)
        if prefetcher is not None:
            prefetcher.stop()
        if recording is not None:
            recording.finish("exit")
        if options.report is not None:
            report = mount_stats(image, prefetcher, recording)
            report["image_id"] = image.image_id
            write_json(options.report, report)


def stats_path(cache_dir: Path, mountpoint: Path) -> Path:
    """Where the server of the mount at ``mountpoint`` keeps its statistics."""
    key = hashlib.sha256(str(Path(mountpoint).absolute()).encode()).hexdigest()[:16]
    return cache_dir / "mounts" / f"{key}.json"

"""What a lazy image's FUSE server is told: its whole contract with whoever starts it.

:class:`ImageServerSpec` holds everything the server needs (the node's configuration, for
the store and the block cache, included): the server reads no config file and no command
line. ``bootseer image mount`` and the node agent build one; :mod:`bootseer.serve` carries
it to the server process as JSON; :func:`bootseer.prefetch.session.serve` serves it. Kept
apart from the session so that building a spec imports no FUSE or store code.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from bootseer.config import Config
from bootseer.prefetch.config import PrefetchConfig
from bootseer.prefetch.hotlist import DEFAULT_WORKLOAD
from bootseer.prefetch.recording import ReadyWhen


@dataclass(frozen=True)
class ImageServerSpec:
    """Serve lazy image ``image`` at ``mountpoint`` (or on the connection ``fuse_fd``)."""

    KIND: ClassVar[str] = "image"

    config: Config  # the node's: its store, its block cache
    image: str  # a name or an image id
    mountpoint: Path
    #: The id ``image`` names, when the spec's maker has resolved it already (the agent,
    #: checking the image exists): the server does not ask the store again, and fetches
    #: the hot list while it loads the manifest.
    image_id: str | None = None
    workload: str = DEFAULT_WORKLOAD  # which hot list is prefetched and recorded
    prefetch: bool = True  # prefetch the hot list (if the image has one)
    prefetch_config: PrefetchConfig = PrefetchConfig()
    record: ReadyWhen | None = None  # None: do not record this start
    #: Record only while the hot list has merged fewer than
    #: :data:`bootseer.prefetch.session.RECORD_UNTIL` recordings.
    record_auto: bool = False
    info: Path | None = None  # what the caller needs of the image, written once it is loaded
    stats: Path | None = None  # statistics so far as JSON, refreshed while mounted
    report: Path | None = None  # final statistics as JSON, written when the mount ends
    #: Serve this already-mounted /dev/fuse connection (held by the agent, so it survives
    #: its server) instead of mounting one; ``takeover_state`` goes with it.
    fuse_fd: int | None = None
    takeover_state: Path | None = None
    #: Read the image's packs through the node agent's swarm for this job, the store when
    #: it cannot; the agent answers on ``agent_socket`` (default: the config's).
    peer_job: str | None = None
    agent_socket: Path | None = None
    #: Serve the image's files by whole-file key, for an overlay over its metadata image
    #: (:class:`bootseer.prefetch.metaimage.KeyTree`), or by path; None: the first server
    #: chooses (keys if the image has a metadata image and the start does not record) and
    #: says which in ``info``, and every server after it is told.
    by_key: bool | None = None

    @classmethod
    def of(cls, config: Config, image: str, mountpoint: Path, **options: Any) -> ImageServerSpec:
        """A spec for the node ``config`` describes: prefetch on as it says, with its
        knobs, and the statistics file where ``bootseer image stats`` and the agent look;
        ``options`` set the other fields."""
        options.setdefault("prefetch", config.image.prefetch)
        return cls(config=config, image=image, mountpoint=mountpoint,
                   prefetch_config=PrefetchConfig.from_config(config),
                   stats=stats_path(config.cache_dir, mountpoint), **options)

    @property
    def what(self) -> str:
        return f"image {self.image}"

    @property
    def source(self) -> str:
        return self.image

    @property
    def fsname(self) -> str:
        return "bootseer-image"

    @property
    def ready_file(self) -> Path | None:
        """Created once the server has loaded the image and serves the connection."""
        return self.info

    def takeover(self) -> ImageServerSpec:
        """The spec of a server that takes this one's connection over: it never records
        (the start's first reads went unseen)."""
        return dataclasses.replace(self, record=None, record_auto=False)


def stats_path(cache_dir: Path, mountpoint: Path) -> Path:
    """Where the server of the mount at ``mountpoint`` keeps its statistics."""
    key = hashlib.sha256(str(Path(mountpoint).absolute()).encode()).hexdigest()[:16]
    return cache_dir / "mounts" / f"{key}.json"

"""What ``bootseer warm`` stages on a node, done the same way by the agent and standalone.

A request names an image (its hot blocks, or every block) and any number of environment
snapshots; the summary says, per part, what was already local, what was fetched, and
whether everything needed is now local.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from bootseer.config import Config
from bootseer.store import BlobStore
from prefetch.blockcache import BlockCache
from prefetch.lazyimage import LazyImage
from prefetch.warm import WarmResult, warm_image
from snapshot.stage import StageResult, shard_cache, stage_snapshot


@dataclass(frozen=True)
class WarmRequest:
    image: str | None = None
    workload: str = "default"
    all_blocks: bool = False
    envs: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "workload": self.workload, "all": self.all_blocks,
                "envs": list(self.envs)}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> WarmRequest:
        envs = body.get("envs") or []
        if not isinstance(envs, list) or not all(isinstance(e, str) for e in envs):
            raise ValueError("'envs' must be a list of snapshot keys")
        image = body.get("image")
        if image is not None and not isinstance(image, str):
            raise ValueError("'image' must be a string")
        return cls(image, str(body.get("workload") or "default"), bool(body.get("all")),
                   tuple(envs))


@dataclass
class WarmSummary:
    image: WarmResult | None
    envs: list[StageResult] = field(default_factory=list)
    via: str = "standalone"  # or "agent"

    @property
    def complete(self) -> bool:
        return (self.image is None or self.image.complete) and \
            all(e.complete for e in self.envs)

    def to_json(self) -> dict[str, Any]:
        return {"complete": self.complete, "via": self.via,
                "image": asdict(self.image) | {"complete": self.image.complete}
                if self.image else None,
                "envs": [asdict(e) | {"complete": e.complete} for e in self.envs]}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> WarmSummary:
        def strip(part: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in part.items() if k != "complete"}

        return cls(WarmResult(**strip(body["image"])) if body.get("image") else None,
                   [StageResult(**strip(e)) for e in body.get("envs") or []],
                   body.get("via", "agent"))


def warm(blobs: BlobStore, config: Config, request: WarmRequest, *,
         image_cache: BlockCache, lazy: LazyImage | None = None,
         on_plan: Callable[[int], None] | None = None,
         on_progress: Callable[[int], None] | None = None) -> WarmSummary:
    """Stage what ``request`` names; ``on_plan`` gets each part's bytes as it is planned."""
    image = None
    if request.image is not None:
        image = warm_image(blobs, image_cache, request.image, request.workload,
                           all_blocks=request.all_blocks,
                           concurrency=config.image.prefetch_concurrency,
                           request_size=config.image.prefetch_request_size, lazy=lazy,
                           on_plan=on_plan, on_progress=on_progress)
    snapshots = shard_cache(config.cache_dir, config.snapshot.cache_size)
    envs = [stage_snapshot(blobs, snapshots, key, concurrency=config.snapshot.concurrency,
                           on_plan=on_plan, on_progress=on_progress)
            for key in request.envs]
    return WarmSummary(image, envs)

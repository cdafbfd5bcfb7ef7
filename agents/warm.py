"""What ``bootseer warm`` stages on a node, done the same way by the agent and standalone.

A request names an image (its hot blocks, or every block), any number of environment
snapshots and any number of checkpoints (files or directories); the summary says, per
part, what was already local, what was fetched, and whether everything needed is now
local.

Warm work yields to anything more urgent: ``before_fetch`` is called before each fetch it
issues (and before each part's metadata reads), and the agent makes it wait while reads or
starting containers are fetching (:mod:`bootseer.agents.priority`). Standalone, nothing waits.

A request may name its ``job`` (and how many ``nodes`` it has) or give its ``peers``: with
``p2p.enabled``, the agent then fetches the hot pack and the snapshots' shards through its
swarm from the job's other nodes (:class:`~bootseer.p2p.Fanout`), and the checkpoints'
files too where the operator lets peers share them (``p2p.checkpoints``; their torrents
built by the nodes together: :mod:`bootseer.p2p.sharedfile`). Only root names a job or
peers (the agent refuses them to its socket's group).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from bootseer.agents import fields
from bootseer.agents.policy import CheckpointPolicy
from bootseer.config import Config
from bootseer.nodecache import NodeCache
from bootseer.p2p import Fanout, Peer
from bootseer.p2p.rendezvous import MAX_MEMBERS
from bootseer.prefetch.config import PrefetchConfig
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.warm import WarmResult, warm_image
from bootseer.snapshot.stage import StageResult, shard_cache, stage_snapshot
from bootseer.store import BlobStore
from bootseer.stripedfs.files import CheckpointSource
from bootseer.stripedfs.stage import CheckpointResult, stage_checkpoint


@dataclass(frozen=True)
class WarmRequest:
    image: str | None = None
    workload: str = "default"
    all_blocks: bool = False
    envs: tuple[str, ...] = ()
    checkpoints: tuple[str, ...] = ()  # store URLs of checkpoint files or directories
    job: str | None = None  # the job the warm is for: its nodes share what they fetch
    nodes: int | None = None  # how many nodes the job starts on (waited for, briefly)
    peers: tuple[Peer, ...] = ()  # the job's nodes as the scheduler knows them

    def to_json(self) -> dict[str, Any]:
        body = {"image": self.image, "workload": self.workload, "all": self.all_blocks,
                "envs": list(self.envs), "checkpoints": list(self.checkpoints)}
        # Only when set: an agent older than these fields refuses a body that has them.
        sharing = {"job": self.job, "nodes": self.nodes,
                   "peers": [str(p) for p in self.peers] or None}
        return body | {k: v for k, v in sharing.items() if v is not None}

    @classmethod
    def from_json(cls, body: Any) -> WarmRequest:
        body = fields.only(body, {"image", "workload", "all", "envs", "checkpoints", "job",
                                  "nodes", "peers"}, "warm request")
        workload = body.get("workload")
        return cls(fields.optional_name(body.get("image"), "image", fields.IMAGE),
                   "default" if workload is None else
                   fields.name(workload, "workload", fields.COMPONENT),
                   fields.boolean(body.get("all"), "all"),
                   fields.names(body.get("envs"), "envs", fields.SNAPSHOT_KEY),
                   fields.urls(body.get("checkpoints"), "checkpoints"),
                   fields.optional_name(body.get("job"), "job", fields.JOB),
                   fields.optional_count(body.get("nodes"), "nodes", MAX_MEMBERS),
                   fields.peers(body.get("peers"), "peers", MAX_MEMBERS))


@dataclass
class WarmSummary:
    image: WarmResult | None
    envs: list[StageResult] = field(default_factory=list)
    checkpoints: list[CheckpointResult] = field(default_factory=list)
    via: str = "standalone"  # or "agent"
    members: int = 0  # the job's nodes the warm shared fetches with (0: no peer-to-peer)

    @property
    def complete(self) -> bool:
        return (self.image is None or self.image.complete) and \
            all(e.complete for e in self.envs) and all(c.complete for c in self.checkpoints)

    def to_json(self) -> dict[str, Any]:
        return {"complete": self.complete, "via": self.via, "members": self.members,
                "image": asdict(self.image) | {"complete": self.image.complete}
                if self.image else None,
                "envs": [asdict(e) | {"complete": e.complete} for e in self.envs],
                "checkpoints": [asdict(c) | {"complete": c.complete}
                                for c in self.checkpoints]}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> WarmSummary:
        def strip(part: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in part.items() if k != "complete"}

        return cls(WarmResult(**strip(body["image"])) if body.get("image") else None,
                   [StageResult(**strip(e)) for e in body.get("envs") or []],
                   [CheckpointResult(**strip(c)) for c in body.get("checkpoints") or []],
                   body.get("via", "agent"), body.get("members", 0))


def warm(blobs: BlobStore, config: Config, request: WarmRequest, *,
         image_cache: NodeCache, lazy: LazyImage | None = None, fanout: Fanout | None = None,
         on_plan: Callable[[int], None] | None = None,
         on_progress: Callable[[int], None] | None = None,
         before_fetch: Callable[[], None] | None = None) -> WarmSummary:
    """Stage what ``request`` names; ``on_plan`` gets each part's bytes as it is planned,
    ``before_fetch`` is called (and may block) before every fetch. With ``fanout`` (the
    agent's, for a job with peer-to-peer on) the hot pack, the shards and the checkpoint
    files come through the job's swarm."""
    def turn() -> None:  # before a part's metadata reads
        if before_fetch:
            before_fetch()

    image = None
    if request.image is not None:
        turn()
        image = warm_image(blobs, image_cache, request.image, request.workload,
                           all_blocks=request.all_blocks,
                           prefetch=PrefetchConfig.from_config(config), lazy=lazy,
                           fanout=fanout, on_plan=on_plan, on_progress=on_progress,
                           before_fetch=before_fetch)
    snapshots = shard_cache(config.cache_dir, config.snapshot.cache_size)
    envs = []
    for key in request.envs:
        turn()
        envs.append(stage_snapshot(blobs, snapshots, key,
                                   concurrency=config.snapshot.concurrency, fanout=fanout,
                                   on_plan=on_plan,
                                   on_progress=on_progress, before_fetch=before_fetch))
    source = CheckpointSource(config)  # its stores and cache as configured
    sharing = CheckpointPolicy.sharing(config)
    checkpoints = []
    keep: set[str] = set()  # one checkpoint of the request never evicts another
    for url in request.checkpoints:
        turn()
        checkpoints.append(stage_checkpoint(
            source, url, concurrency=config.checkpoint.stage_concurrency, keep=keep,
            fanout=fanout.among(url) if fanout and sharing.allows(url) else None,
            records=blobs.store,
            on_plan=on_plan, on_progress=on_progress,
            before_fetch=before_fetch))
    return WarmSummary(image, envs, checkpoints,
                       members=len(fanout.peers) if fanout is not None else 0)

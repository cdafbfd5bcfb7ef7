"""What ``bootseer warm`` stages on a node, done the same way by the agent and standalone.

A request names an image (its hot blocks, or every block), any number of environment
snapshots and any number of checkpoints (files or directories); the summary says, per
part, what was already local, what was fetched, and whether everything needed is now
local: each kind of part is staged by its technique's :class:`~bootseer.warming.Warmer`
and described by one :class:`~bootseer.warming.PartResult`.

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
from dataclasses import dataclass, field
from typing import Any

from bootseer.agents import fields
from bootseer.agents.policy import CheckpointPolicy
from bootseer.config import Config
from bootseer.nodecache import NodeCache, NodeCaches
from bootseer.p2p import Fanout, Peer
from bootseer.p2p.rendezvous import MAX_MEMBERS
from bootseer.prefetch.config import PrefetchConfig
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.warm import IMAGE, ImageWarmer
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.stage import SNAPSHOT, SnapshotWarmer
from bootseer.store import BlobStore
from bootseer.stripedfs.files import CheckpointSource
from bootseer.stripedfs.stage import CHECKPOINT, CheckpointWarmer
from bootseer.warming import Hooks, PartResult, Warmer


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
    image: PartResult | None
    envs: list[PartResult] = field(default_factory=list)
    checkpoints: list[PartResult] = field(default_factory=list)
    via: str = "standalone"  # or "agent"
    members: int = 0  # the job's nodes the warm shared fetches with (0: no peer-to-peer)

    @property
    def parts(self) -> list[PartResult]:
        """Every part's result, in the order they were warmed."""
        return ([self.image] if self.image else []) + self.envs + self.checkpoints

    @property
    def complete(self) -> bool:
        return all(part.complete for part in self.parts)

    def add(self, part: PartResult) -> None:
        """Count ``part`` in the section its kind names (the image, envs, checkpoints)."""
        if part.kind.section == IMAGE.section:
            self.image = part
        else:
            getattr(self, part.kind.section).append(part)

    def to_json(self) -> dict[str, Any]:
        return {"complete": self.complete, "via": self.via, "members": self.members,
                "image": self.image.to_json() if self.image else None,
                "envs": [e.to_json() for e in self.envs],
                "checkpoints": [c.to_json() for c in self.checkpoints]}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> WarmSummary:
        return cls(PartResult.from_json(IMAGE, body["image"]) if body.get("image") else None,
                   [PartResult.from_json(SNAPSHOT, e) for e in body.get("envs") or []],
                   [PartResult.from_json(CHECKPOINT, c) for c in body.get("checkpoints") or []],
                   body.get("via", "agent"), body.get("members", 0))


def warmers(blobs: BlobStore, config: Config, request: WarmRequest, *,
            caches: NodeCaches, image_cache: NodeCache | None = None,
            lazy: LazyImage | None = None,
            fanout: Fanout | None = None) -> list[tuple[Warmer, tuple[str, ...]]]:
    """The warmer of each kind of part ``request`` names, with the names it warms, in the
    order they run: the image first (a start may be about to need it), then the snapshots,
    then the checkpoints. ``image_cache``: the block cache if the caller has it open."""
    plan: list[tuple[Warmer, tuple[str, ...]]] = []
    if request.image is not None:
        plan.append((ImageWarmer(blobs, image_cache or caches.blocks(),
                                 workload=request.workload, all_blocks=request.all_blocks,
                                 prefetch=PrefetchConfig.from_config(config),
                                 whole_files=config.image.passthrough,
                                 metadata_image=config.image.passthrough and
                                 config.image.kernel_metadata,
                                 lazy=lazy, fanout=fanout), (request.image,)))
    if request.envs:
        plan.append((SnapshotWarmer(blobs, caches.snapshots(),
                                    SnapshotOptions.from_config(config.snapshot),
                                    fanout=fanout), request.envs))
    if request.checkpoints:
        sharing = CheckpointPolicy.sharing(config)

        def fanout_for(url: str) -> Fanout | None:
            return fanout.among(url) if fanout and sharing.allows(url) else None

        plan.append((CheckpointWarmer(CheckpointSource(config),  # stores, cache as configured
                                      concurrency=config.checkpoint.stage_concurrency,
                                      fanout_for=fanout_for, records=blobs.store),
                     request.checkpoints))
    return plan


def warm(blobs: BlobStore, config: Config, request: WarmRequest, *,
         image_cache: NodeCache | None = None, lazy: LazyImage | None = None,
         fanout: Fanout | None = None,
         on_plan: Callable[[int], None] | None = None,
         on_progress: Callable[[int], None] | None = None,
         before_fetch: Callable[[], None] | None = None) -> WarmSummary:
    """Stage what ``request`` names; ``on_plan`` gets each part's bytes as it is planned,
    ``before_fetch`` is called (and may block) before every fetch and before each part's
    metadata reads. With ``fanout`` (the agent's, for a job with peer-to-peer on) the hot
    pack, the shards and the checkpoint files come through the job's swarm. What only later
    starts need (:attr:`~bootseer.warming.PartResult.later`) comes after every part."""
    hooks = Hooks(on_plan, on_progress, before_fetch)
    summary = WarmSummary(None, members=len(fanout.peers) if fanout is not None else 0)
    for warmer, names in warmers(blobs, config, request, caches=NodeCaches.for_config(config),
                                 image_cache=image_cache, lazy=lazy, fanout=fanout):
        for name in names:
            hooks.turn()  # before the part's metadata reads
            summary.add(warmer.warm(name, hooks))
    for part in summary.parts:
        if part.later is not None:
            hooks.turn()
            part.finish(hooks)
    return summary

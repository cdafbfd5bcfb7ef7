"""Warming: one protocol for staging what a job will read on a node before it lands there.

Three techniques warm a node (``bootseer warm``): an image's hot blocks
(:mod:`bootseer.prefetch.warm`), a snapshot's shards (:mod:`bootseer.snapshot.stage`) and a
checkpoint's files (:mod:`bootseer.stripedfs.stage`). Each is a :class:`Warmer`: given a
name (an image, a snapshot key, a checkpoint URL) and the caller's :class:`Hooks`, it makes
that part local and says what it found and did in one :class:`PartResult`, the same type
for every part. So the CLI, the agent and a job's warm through its peers run any part the
same way, and print or count it the same way.

What a part is called (blocks, shards, files; the field naming it on the wire) is its
:class:`PartKind`, which each technique declares. The wire form of a result
(:meth:`PartResult.to_json`) keeps the names agents and CLIs of earlier versions exchange
(``fetched_blocks``, ``key``, ``url``, ...), so either side may be the older one.

This module sits at the node-cache layer: every technique may import it, and it imports
none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class PartKind:
    """What one kind of part is called, in output and on the wire."""

    section: str  # the summary's key for these parts: "image", "envs", "checkpoints"
    label: str  # how output names one: "image", "environment", "checkpoint"
    name_field: str  # the wire field naming it: "image", "key", "url"
    unit: str  # what it is made of: "blocks", "shards", "files"
    cache_setting: str  # the config key bounding its cache, e.g. "image.cache_size"
    #: Why an item may fail to arrive, besides a cache too small for it.
    failure: str = "the store failed them"


@dataclass
class PartResult:
    """What warming one part found and did: the same fields for every kind of part."""

    kind: PartKind
    name: str  # the image, snapshot key or checkpoint URL as requested
    items: int  # blocks, shards or files needed locally
    bytes: int  # their size (as stored: compressed blocks and shards)
    already_local: int  # items that were local before this warm
    fetched: int  # items this warm made local
    store_bytes: int  # bytes this warm read from the store
    missing: int  # items still not local at the end (failed, or the cache is too small)
    seconds: float
    peer_bytes: int = 0  # bytes received from the job's peers (p2p)
    #: What only this kind of part knows (an image: its id, the workload, whether it has
    #: a hot list, from how many recordings, the ranged reads sent); flat on the wire.
    detail: dict[str, Any] = field(default_factory=dict)
    #: Work the part's warm left for after every part of its request, since only later
    #: starts need it (an image's whole files): a start running beside the warm then
    #: finds its environment and checkpoints staged sooner. :meth:`finish` runs it.
    later: Callable[[PartResult, Hooks], None] | None = field(default=None, repr=False,
                                                              compare=False)

    @property
    def complete(self) -> bool:
        return self.missing == 0

    def finish(self, hooks: Hooks) -> None:
        """Run the work left for later (once), counting it in this result."""
        later, self.later = self.later, None
        if later is not None:
            later(self, hooks)

    def to_json(self) -> dict[str, Any]:
        kind = self.kind
        return {kind.name_field: self.name, **self.detail, kind.unit: self.items,
                "bytes": self.bytes, "already_local": self.already_local,
                f"fetched_{kind.unit}": self.fetched, "fetched_bytes": self.store_bytes,
                "missing": self.missing, "seconds": self.seconds,
                "peer_bytes": self.peer_bytes, "complete": self.complete}

    @classmethod
    def from_json(cls, kind: PartKind, body: dict[str, Any]) -> PartResult:
        """The result :meth:`to_json` wrote (``complete`` is derived, not read)."""
        known = {kind.name_field, kind.unit, "bytes", "already_local",
                 f"fetched_{kind.unit}", "fetched_bytes", "missing", "seconds",
                 "peer_bytes", "complete"}
        return cls(kind, body[kind.name_field], body[kind.unit], body["bytes"],
                   body["already_local"], body[f"fetched_{kind.unit}"],
                   body["fetched_bytes"], body["missing"], body["seconds"],
                   body.get("peer_bytes", 0),
                   {k: v for k, v in body.items() if k not in known})


@dataclass(frozen=True)
class Hooks:
    """What the caller of a warm hears and decides while it runs."""

    #: Called with each part's bytes once planned (a progress bar's total grows by it).
    on_plan: Callable[[int], None] | None = None
    #: Called with bytes as they become local (or are found local already).
    on_progress: Callable[[int], None] | None = None
    #: Called before each fetch and before each part's metadata reads; may block (the
    #: agent makes warms wait while starts and reads are fetching).
    before_fetch: Callable[[], None] | None = None

    def turn(self) -> None:
        """Wait for this warm's turn, if the caller makes it wait."""
        if self.before_fetch is not None:
            self.before_fetch()


#: A warm nobody watches or holds back (standalone, in tests).
NO_HOOKS = Hooks()


class Warmer(Protocol):
    """Makes named parts of one kind local on this node.

    A warmer is built with what it needs from the node (the store, its cache, the
    configured concurrency, a job's swarm); :meth:`warm` then stages one part and returns
    what it found and did. Failures to fetch single items are counted as ``missing``, not
    raised; a part that does not exist (no such image, key or file) raises.
    """

    kind: PartKind

    def warm(self, name: str, hooks: Hooks) -> PartResult:
        """Make part ``name`` local; wait until done."""
        ...

"""The agent's peer-to-peer side: one object for the node's swarm and what goes with it.

With ``p2p.enabled`` the agent holds one :class:`P2PNode` for its lifetime (None when
peer-to-peer is off or cannot listen: then no swarm exists, libtorrent is never loaded,
and everything is read from the store). It holds the node's swarm
(:class:`~bootseer.p2p.swarm.Swarm`), the mount servers' demand reads through it
(:class:`~bootseer.p2p.demand.DemandReads`, told prefetch's pack key layout), the jobs
this node announced itself in (withdrawn on :meth:`P2PNode.close`) and the warms still
fetching through the swarm (which it is not closed under).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from bootseer.config import Config
from bootseer.errors import BootseerError
from bootseer.p2p import Fanout, Peer, open_swarm, rendezvous
from bootseer.p2p.demand import DemandReads
from bootseer.prefetch.blockformat import pack_digest
from bootseer.store import Store

if TYPE_CHECKING:  # bootseer.p2p.swarm loads libtorrent: only when the swarm exists
    from bootseer.p2p.swarm import Swarm

log = logging.getLogger(__name__)


class P2PNode:
    """The node's swarm, its demand reads, the jobs it joined, the warms sharing it."""

    def __init__(self, config: Config, swarm: Swarm, store: Store, node: str,
                 shares: Callable[[str], bool]) -> None:
        """``store``: Bootseer's (the jobs' records, packs and torrents); ``node``: this
        node's name in the records; ``shares``: whether a checkpoint URL may be shared
        with peers (``p2p.checkpoints``)."""
        self.config = config
        self.swarm = swarm
        self.store = store
        self.node = node
        self.shares = shares
        #: Mount servers' reads of image packs and checkpoint files through the swarm.
        self.demand = DemandReads(swarm, store, config.cache_dir / "p2p" / "partial", node,
                                  config.p2p.demand_wait, shares, digest_of=pack_digest)
        self._lock = threading.Lock()
        self._jobs: set[str] = set()  # jobs this node announced itself in
        self._sharing = 0  # warms running with a Fanout (the swarm closes only after)

    @classmethod
    def open(cls, config: Config, store: Store, node: str,
             shares: Callable[[str], bool]) -> P2PNode | None:
        """The node's peer-to-peer side; None when it is off, or cannot listen as
        configured (logged: the node then warms from the store, as without it)."""
        try:
            swarm = open_swarm(config.p2p)
        except BootseerError as exc:
            log.error("peer-to-peer is enabled but cannot start (%s); warming from the "
                      "store", exc)
            return None
        return None if swarm is None else cls(config, swarm, store, node, shares)

    def container_started(self) -> None:
        """A container started here: the node's network is for training soon, so what it
        seeds is seeded for ``p2p.seed_after_start`` more at most."""
        self.swarm.wind_down(self.config.p2p.seed_after_start)

    def open_image(self, job: str, packs: Sequence[str]) -> None:
        """A container of ``job`` starts with an image of ``packs``: join the job's
        records and open the packs for its servers' demand reads."""
        self.demand.open_image(job, list(packs))
        with self._lock:
            self._jobs.add(job)

    def fanout(self, job: str | None, peers: Sequence[Peer], nodes: int,
               checkpoints: Sequence[str]) -> Fanout | None:
        """The job's swarm for a warm: None for a warm of no job, or if the job's members
        cannot be read (the warm then reads the store, as without peer-to-peer). With
        ``peers``, those are the members; else this node announces itself, and the
        checkpoints it warms, in the job's records and reads everyone's (waiting briefly
        for ``nodes`` of them): a checkpoint is shared among the members that warm it.
        Each fanout returned is given back with :meth:`warm_done`."""
        if job is None and not peers:
            return None
        members = list(peers)
        roster = [rendezvous.Member(peer) for peer in members]
        wanting: dict[str, tuple[Peer, ...]] = {}
        if not members:
            assert job is not None
            try:
                shared = [url for url in checkpoints if self.shares(url)]
                rendezvous.announce(self.store, self.swarm.trust, job, self.node,
                                    self.swarm.address, shared)
                with self._lock:
                    self._jobs.add(job)
                roster = rendezvous.gather(self.store, self.swarm.trust, job, nodes)
                members = [m.peer for m in roster]
                wanting = {url: tuple(rendezvous.wanting(roster, url)) for url in checkpoints}
            except (BootseerError, OSError) as exc:
                log.warning("job %s: cannot meet its peers (%s); warming from the store",
                            job, exc)
                return None
        with self._lock:
            self._sharing += 1
        if job is not None:
            self.demand.met(job, roster)  # the job's starts read with the same
        return Fanout(self.swarm, tuple(members), wanting)

    def warm_done(self) -> None:
        """A warm that had a :meth:`fanout` ended."""
        with self._lock:
            self._sharing -= 1

    def close(self) -> None:
        """Leave the jobs' swarms: withdraw this node's peer records and close the swarm
        (unless a warm is still fetching through it: the process's exit ends it then)."""
        for job in sorted(self._jobs):
            try:
                rendezvous.withdraw(self.store, job, self.node)
            except Exception as exc:  # the store is gone: the record goes stale, harmless
                log.warning("job %s: could not withdraw this node's peer record: %s", job,
                            exc)
        with self._lock:
            sharing = self._sharing
        if sharing:
            log.info("%d warms still fetch through the swarm; leaving it open", sharing)
        else:
            self.swarm.close()

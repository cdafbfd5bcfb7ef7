"""Demand reads through the job's peers: a container's lazy read served by a node that has
the bytes, for the node's mount servers.

A start reads image blocks that no warm staged (a cold start, a block the hot list
misses). When a job's nodes start together they read the same blocks at about the same
time; from the store, that is N reads of each. Here the agent, which owns the node's
swarm, reads a pack's range for its mount servers through the swarm
(:meth:`~bootseer.p2p.swarm.Swarm.read`): pieces a peer has come from that peer, pieces
nobody has yet are read from the store by their owner (``p % N``) and waited for by the
others. Packs have torrents from their conversion (:func:`~bootseer.p2p.publish.publish_layer`);
a pack without one is read from the store, as is everything when no peer can help.

The mount of a job's container (:meth:`DemandReads.open_image`) announces the node in the
job's records and opens every pack of the image in the swarm, so that the connections
are up before the container's first read. Every read's bytes are checked against the
torrent's piece hashes before they leave here, and each block once more against its
digest by the server (:mod:`bootseer.prefetch.blocksource`), like a store read.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.errors import BootseerError
from bootseer.store import Store

from . import rendezvous
from .peer import Peer

if TYPE_CHECKING:
    from .swarm import Swarm
    from .torrents import Torrent

log = logging.getLogger(__name__)

#: The objects demand reads serve: an image's packs, named by their sha256.
PACK_KEY = re.compile(r"packs/([0-9a-f]{64})")
#: Longest range one demand read may ask for (a run of blocks: the prefetcher's requests
#: are 8 MiB by default).
MAX_READ = 64 << 20
#: How long a job's member list is used before the records are read again (nodes of a job
#: announce themselves as their containers start).
MEMBERS_TTL = 1.0
#: Torrents kept loaded (a few KiB each).
MAX_TORRENTS = 4096
#: Jobs whose members are remembered.
MAX_JOBS = 64


class NotShared(BootseerError):
    """This read cannot go through peers (no torrent, not a pack, the swarm failed): the
    server reads the store."""


@dataclass
class DemandCounts:
    """What demand reads cost, for /metrics."""

    reads: int = 0
    bytes: int = 0
    fallbacks: int = 0  # reads refused (NotShared): the server read the store


@dataclass
class DemandReads:
    """The node's demand reads through its swarm (one per agent)."""

    swarm: Swarm
    store: Store  # Bootseer's: packs and their torrents
    directory: Path  # partial files of the packs being read (sparse; gone when expired)
    node: str  # this node's name in the jobs' records
    wait: float  # p2p.demand_wait
    counts: DemandCounts = field(default_factory=DemandCounts)
    _torrents: OrderedDict[str, Torrent | None] = field(default_factory=OrderedDict)
    _members: OrderedDict[str, tuple[float, tuple[Peer, ...]]] = field(
        default_factory=OrderedDict)
    _met: OrderedDict[str, tuple[Peer, ...]] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def open_image(self, job: str, packs: list[str]) -> None:
        """A container of ``job`` is starting here with an image made of ``packs``: join
        the job's records and open each pack that has a torrent in the swarm."""
        with self._lock:
            met = job in self._met
        if not met:  # (a warm's record says more: what the node warmed)
            rendezvous.announce(self.store, job, self.node, self.swarm.address)
        peers = self.members(job, fresh=True)
        for key in packs:
            try:
                torrent = self._torrent(key)
                if torrent is not None:
                    self.swarm.open(torrent, self._path(torrent), peers)
            except BootseerError as exc:
                log.warning("p2p: %s not opened for peer reads: %s", key, exc)

    def read(self, job: str, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of pack ``key`` through the job's swarm;
        :class:`NotShared` when it cannot be (then read the store)."""
        try:
            if not 0 < length <= MAX_READ or offset < 0:
                raise NotShared(f"{length} bytes at {offset}: not a read peers serve")
            torrent = self._torrent(key)
            if torrent is None:
                raise NotShared(f"{key} has no torrent")
            members = self.members(job)
            if not set(members) - {self.swarm.address}:
                raise NotShared(f"job {job} has no other member here to read from")
            data = self.swarm.read(torrent, self._path(torrent), offset, length, members,
                                   self._reader(key), self.wait)
        except (BootseerError, ValueError) as exc:
            with self._lock:
                self.counts.fallbacks += 1
            raise exc if isinstance(exc, NotShared) else NotShared(str(exc)) from exc
        with self._lock:
            self.counts.reads += 1
            self.counts.bytes += length
        return data

    def snapshot(self) -> DemandCounts:
        """The counts as of now (for /metrics)."""
        with self._lock:
            return dataclasses.replace(self.counts)

    def met(self, job: str, members: list[Peer]) -> None:
        """The members a warm of ``job`` gathered (every node's the same list): its
        starts' reads split the store reads by them, as the warm did."""
        with self._lock:
            self._met[job] = tuple(members)
            while len(self._met) > MAX_JOBS:
                self._met.popitem(last=False)

    def members(self, job: str, *, fresh: bool = False) -> tuple[Peer, ...]:
        """The job's members: those its warm gathered, else its records as they are now
        (read at most every MEMBERS_TTL: nodes announce themselves as their containers
        start, so early reads see fewer members and read more from the store)."""
        now = time.monotonic()
        with self._lock:
            if job in self._met:
                return self._met[job]
            known = self._members.get(job)
        if known is None or fresh or now - known[0] >= MEMBERS_TTL:
            known = (now, tuple(rendezvous.members(self.store, job)))
            with self._lock:
                self._members[job] = known
                self._members.move_to_end(job)
                while len(self._members) > MAX_JOBS:
                    self._members.popitem(last=False)
        return known[1]

    def _torrent(self, key: str) -> Torrent | None:
        """The pack's checked torrent, None if it has none; loaded once."""
        match = PACK_KEY.fullmatch(key)
        if match is None:
            raise NotShared(f"{key!r} is not an image pack")
        with self._lock:
            if key in self._torrents:
                self._torrents.move_to_end(key)
                return self._torrents[key]
        from . import torrents

        try:
            size = self.store.stat(key).size
            torrent: Torrent | None = torrents.load(self.store, "sha256:" + match[1], size)
        except FileNotFoundError:
            torrent = None
        with self._lock:
            self._torrents[key] = torrent
            while len(self._torrents) > MAX_TORRENTS:
                self._torrents.popitem(last=False)
        return torrent

    def _path(self, torrent: Torrent) -> Path:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.directory / torrent.hex

    def _reader(self, key: str):
        return lambda offset, length: self.store.read_range(key, offset, length)

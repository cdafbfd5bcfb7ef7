"""Demand reads through the job's peers: a container's lazy read served by a node that has
the bytes, for the node's mount servers (image packs and checkpoint files).

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

A checkpoint file (:meth:`DemandReads.read_file`) has no digest of its own: its torrent is
the one the job's warms built together (:mod:`bootseer.p2p.sharedfile`) for that URL,
size and mtime, tagged with the cluster's key. Without one (no node of the job staged
this version of the file), with one not so tagged, or for a file the operator does not
let peers share (``shares``: ``p2p.checkpoints``, and every user may read it at its
source), the server reads the store: a peer's bytes with no hash the job's nodes vouch
for would be trusted on their sender's word. Its pieces are dealt out among the members
that warmed the checkpoint (their records' ``wants``), who seed it from their copies: a
node starting late, or one whose warm did not stage it, reads it from them and takes no
share of the store reads (a piece none of them has is waited for as theirs, then read from
the store).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.errors import BootseerError
from bootseer.store import Store

from . import rendezvous, sharedfile
from .peer import Peer
from .rendezvous import Member
from .sharedfile import MIN_SHARED_SIZE, SharedFile

if TYPE_CHECKING:
    from .swarm import ReadRange, Swarm
    from .torrents import Torrent

log = logging.getLogger(__name__)

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
    #: Whether the checkpoint at a URL may be shared with peers (``p2p.checkpoints``).
    shares: Callable[[str], bool] = lambda url: False
    #: The key layout of the objects :meth:`read` serves, asked of the package that
    #: writes them (an image pack's key → its ``sha256:`` digest; None: not such an
    #: object): peer-to-peer sits below the techniques and knows none of their layouts.
    #: By default none (only checkpoint files are read).
    digest_of: Callable[[str], str | None] = lambda key: None
    counts: DemandCounts = field(default_factory=DemandCounts)
    _torrents: OrderedDict[str, Torrent | None] = field(default_factory=OrderedDict)
    _rosters: OrderedDict[str, tuple[float, tuple[Member, ...]]] = field(
        default_factory=OrderedDict)
    _met: OrderedDict[str, tuple[Member, ...]] = field(default_factory=OrderedDict)
    #: Files found without a torrent, and when (:meth:`_file_torrent`).
    _unshared: OrderedDict[str, float] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def open_image(self, job: str, packs: list[str]) -> None:
        """A container of ``job`` is starting here with an image made of ``packs``: join
        the job's records and open each pack that has a torrent in the swarm."""
        with self._lock:
            met = job in self._met
        if not met:  # (a warm's record says more: what the node warmed)
            rendezvous.announce(self.store, self.swarm.trust, job, self.node,
                                self.swarm.address)
        peers = self.members(job, fresh=True)
        for key in packs:
            try:
                torrent = self._torrent(key)
                if torrent is not None:
                    self.swarm.open(torrent, self._path(torrent), peers)
            except BootseerError as exc:
                log.warning("p2p: %s not opened for peer reads: %s", key, exc)

    def read(self, job: str, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of pack ``key`` (an object :attr:`digest_of`
        names) through the job's swarm;
        :class:`NotShared` when it cannot be (then read the store)."""
        def through_swarm() -> bytes:
            torrent = self._torrent(key)
            if torrent is None:
                raise NotShared(f"{key} has no torrent")
            return self._read(job, torrent, self.members(job), offset, length,
                              lambda at, n: self.store.read_range(key, at, n))

        return self._counted(through_swarm, offset, length)

    def read_file(self, job: str, file: SharedFile, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of checkpoint file ``file`` (this version of it:
        its URL, size and mtime) through the swarm of ``job``, from the members that
        staged it; :class:`NotShared` when it cannot be (then read the store)."""
        def through_swarm() -> bytes:
            if offset + length > file.size:
                raise NotShared(f"bytes {offset}+{length} are not in {file.url}")
            torrent = self._file_torrent(file)
            if torrent is None:
                raise NotShared(f"no node of job {job} has shared {file.url} as it is now")
            roster = self._roster(job)
            staging = rendezvous.wanting_within(list(roster), file.url)
            me = self.swarm.address.address
            if not staging or any(p.address == me for p in staging):  # one of its group
                peers, share = staging or [m.peer for m in roster], True
            else:  # not: those who staged it have it, this node takes no share
                peers, share = staging, False
            return self._read(job, torrent, tuple(peers), offset, length, file.read_range,
                              share=share)

        return self._counted(through_swarm, offset, length)

    def _counted(self, read: Callable[[], bytes], offset: int, length: int) -> bytes:
        """``read()`` of a range peers serve, counted; every failure as :class:`NotShared`."""
        try:
            if not 0 < length <= MAX_READ or offset < 0:
                raise NotShared(f"{length} bytes at {offset}: not a read peers serve")
            data = read()
        except (BootseerError, ValueError) as exc:
            with self._lock:
                self.counts.fallbacks += 1
            raise exc if isinstance(exc, NotShared) else NotShared(str(exc)) from exc
        with self._lock:
            self.counts.reads += 1
            self.counts.bytes += length
        return data

    def _read(self, job: str, torrent: Torrent, members: tuple[Peer, ...], offset: int,
              length: int, reader: ReadRange, *, share: bool = True) -> bytes:
        if not set(members) - {self.swarm.address}:
            raise NotShared(f"job {job} has no other member here to read from")
        return self.swarm.read(torrent, self._path(torrent), offset, length, members, reader,
                               self.wait, share=share)

    def snapshot(self) -> DemandCounts:
        """The counts as of now (for /metrics)."""
        with self._lock:
            return dataclasses.replace(self.counts)

    def met(self, job: str, roster: list[Member]) -> None:
        """The members a warm of ``job`` gathered (every node's the same list): its
        starts' reads split the store reads by them, as the warm did."""
        with self._lock:
            self._met[job] = tuple(roster)
            while len(self._met) > MAX_JOBS:
                self._met.popitem(last=False)

    def members(self, job: str, *, fresh: bool = False) -> tuple[Peer, ...]:
        """The job's members (:meth:`_roster`'s peers)."""
        return tuple(m.peer for m in self._roster(job, fresh=fresh))

    def _roster(self, job: str, *, fresh: bool = False) -> tuple[Member, ...]:
        """The job's members: those its warm gathered, else its records as they are now
        (read at most every MEMBERS_TTL: nodes announce themselves as their containers
        start, so early reads see fewer members and read more from the store)."""
        now = time.monotonic()
        with self._lock:
            if job in self._met:
                return self._met[job]
            known = self._rosters.get(job)
        if known is None or fresh or now - known[0] >= MEMBERS_TTL:
            known = (now, tuple(rendezvous.roster(self.store, self.swarm.trust, job)))
            with self._lock:
                self._rosters[job] = known
                self._rosters.move_to_end(job)
                while len(self._rosters) > MAX_JOBS:
                    self._rosters.popitem(last=False)
        return known[1]

    def _torrent(self, key: str) -> Torrent | None:
        """The pack's checked torrent, None if it has none; loaded once."""
        digest = self.digest_of(key)
        if digest is None:
            raise NotShared(f"{key!r} is not an image pack")

        def load() -> Torrent:
            from . import torrents

            return torrents.load(self.store, digest, self.store.stat(key).size)

        return self._loaded(digest, load)

    def _file_torrent(self, file: SharedFile) -> Torrent | None:
        """The torrent the job's warms published for this version of ``file``, None if
        there is none (yet: looked for again after MEMBERS_TTL, not on every stripe)."""
        if file.size < MIN_SHARED_SIZE:
            raise NotShared(f"{file.url} is too small to be shared")
        identity, now = file.identity, time.monotonic()
        with self._lock:
            if now - self._unshared.get(identity, float("-inf")) < MEMBERS_TTL:
                return None

        def load() -> Torrent:
            if not self.shares(file.url) or not file.readable_by_all:
                raise NotShared(f"{file.url} is not shared with peers (p2p.checkpoints, "
                                f"and every user may read it)")
            return sharedfile.load_torrent(file, self.swarm.trust)

        try:
            torrent = self._loaded(identity, load)
        except BootseerError as exc:  # not to be shared, or not the job's torrent
            log.info("p2p: %s is read from the store: %s", file.url, exc)
            torrent = None
        if torrent is None:
            with self._lock:
                self._torrents.pop(identity, None)
                self._unshared[identity] = now
                self._unshared.move_to_end(identity)
                while len(self._unshared) > MAX_TORRENTS:
                    self._unshared.popitem(last=False)
        return torrent

    def _loaded(self, digest: str, load: Callable[[], Torrent]) -> Torrent | None:
        """The checked torrent named ``digest`` (``load()`` it), loaded once; None if
        none is published."""
        with self._lock:
            if digest in self._torrents:
                self._torrents.move_to_end(digest)
                return self._torrents[digest]
        try:
            torrent: Torrent | None = load()
        except FileNotFoundError:
            torrent = None
        with self._lock:
            self._torrents[digest] = torrent
            while len(self._torrents) > MAX_TORRENTS:
                self._torrents.popitem(last=False)
        return torrent

    def _path(self, torrent: Torrent) -> Path:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.directory / torrent.hex

"""One node's peer session: fetch a blob from the job's other nodes and the store, seed it.

The engine is libtorrent-rasterbar (BitTorrent v2): connections, piece picking, choking,
rate limits and hash checks are its; this module decides what only Bootseer knows,
namely which pieces come from the store, and keeps the session closed to everyone but
the job:

* **No discovery but ours.** No DHT, no local peer discovery, no UPnP/NAT-PMP, no
  trackers, no peer exchange, no metadata exchange (every torrent is private, so
  libtorrent attaches no ``ut_pex`` or ``ut_metadata`` to it): it dials only the peers a
  caller names (the job's rendezvous records or the scheduler's list,
  :mod:`bootseer.p2p.rendezvous`) that are on ``p2p.networks``, and answers only those
  that know a torrent it holds as the cluster's key makes it (:mod:`bootseer.p2p.trust`:
  keyed info-hashes, encryption forced). It listens on one address:port: TCP for peers,
  and the UDP socket libtorrent always binds beside it (for uTP and UDP trackers, both
  off here: nothing is served on it). An IP filter refuses every address outside
  ``p2p.networks`` both ways.
* **Nothing unverified is kept.** Every piece, from a peer or from the store, is checked
  by libtorrent against the torrent's SHA-256 merkle tree, which came from the store
  (:mod:`bootseer.p2p.torrents`); a peer whose data fails is banned at once (v2 hashes
  name the failing 16 KiB blocks, hence their sender; libtorrent's ``smart_ban`` plugin
  covers the rest) and, here, blocked for every torrent of the session. A blob's
  finished file is hashed whole against its digest before :meth:`Swarm.fetch` returns it;
  on a mismatch it is deleted (:class:`~bootseer.errors.IntegrityError`).
* **Each byte leaves the store about once.** The members of a fetch, sorted, split the
  pieces: member ``k`` of ``N`` reads pieces ``p % N == k`` from the store (unless a
  peer already has them: a late node reads nothing) and gets the others from the peers
  that read them. The split is picked once the members are connected (or after
  CONNECT_WAIT). A piece no connected peer has goes to the store when its owner is gone
  (banned, missing for ``piece_grace`` seconds, or no new piece for as long; the
  absent owners' pieces are split again among the members still there, so a dead node
  costs its share once, not once per node), and everything still missing goes to the
  store when the fetch gained nothing for ``piece_grace`` seconds. A peer that leaves
  costs time, never correctness. These rules are :mod:`bootseer.p2p.policy`'s, pure and
  unit-tested; the session carries them out. Store pieces enter libtorrent by ``add_piece`` (and are
  hash-checked like any other); failing twice, the torrent does not describe the blob,
  and the fetch fails.
* **Seeding only reads.** A fetched object is seeded from where the caller keeps it (a
  node cache entry) with ``seed_mode`` (no rehash; each piece is checked when first
  uploaded) and ``upload_mode`` (never downloads, so never writes the file), until
  :meth:`Swarm.stop_seeding`, ``seed_time`` seconds, ``seed_after_start`` seconds after
  a container started here (:meth:`Swarm.wind_down`), or the file is gone (the cache
  evicted the entry: any process of the node may, so the swarm looks every SEED_CHECK
  seconds rather than being told; libtorrent would otherwise serve an open file, and hold
  its disk space, after its entry left the cache's count).
* **The upload cap holds for every peer.** libtorrent exempts peers on private networks
  from its rate limits by default; here every peer is in the global peer class, the one
  ``upload_rate`` limits.

Modules, one job each: :mod:`.engine` (the session, its torrents and its alert loop),
:mod:`.wholefetch` (:meth:`Swarm.fetch`), :mod:`.rangeread` (:meth:`Swarm.read`),
:mod:`.seeding` (:meth:`Swarm.seed` and the seeds' lifetimes); :class:`Swarm` puts them
together for the rest of Bootseer.

Threads: one thread per swarm reads libtorrent's alerts (``pop_alerts``) and expires
seeds; nothing else pops alerts. :meth:`Swarm.fetch` blocks its caller (the agent runs
it with ``asyncio.to_thread``) and may run in several threads at once for different
blobs; its ``read_range`` is called from the swarm's store-reader threads, which are
all done before the torrent leaves the session (libtorrent 2.1 can crash on an
``add_piece`` to a torrent being removed; its default disk back end crashes too, so
the session keeps files through ``mmap_disk_io``: see ``engine._session_params``).
:meth:`Swarm.seed`, :meth:`Swarm.stop_seeding`,
:meth:`Swarm.stats` and :attr:`Swarm.address` may be called from any thread;
:meth:`Swarm.close` once, by the owner, after every fetch returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bootseer.config import P2PConfig

from . import rangeread, wholefetch
from .blobfetch import FetchResult
from .engine import Engine, ReadRange, SwarmError, SwarmStats, parse_listen
from .peer import Peer
from .policy import CONNECT_WAIT
from .seeding import Seeding
from .torrents import Torrent
from .trust import Trust

__all__ = ["CONNECT_WAIT", "ReadRange", "Swarm", "SwarmError", "SwarmStats", "parse_listen"]


class Swarm:
    """A libtorrent session for one node (see the module docstring)."""

    def __init__(self, config: P2PConfig, trust: Trust | None = None) -> None:
        self._engine = Engine(config, trust)
        self._seeding = Seeding(self._engine)
        self.config = config
        #: The cluster's key and networks (from the config unless given).
        self.trust = self._engine.trust

    @property
    def address(self) -> Peer:
        """Where peers reach this node (the listening port, once bound)."""
        return self._engine.address

    def members(self, peers: Sequence[Peer]) -> list[Peer]:
        """A fetch's members, in the order that deals out its store reads (member ``k``
        of ``N`` owns pieces ``p % N == k``): ``peers`` and this node once, at its
        current port (a record of an earlier start is stale)."""
        return self._engine.members(peers)

    def fetch(self, torrent: Torrent, dest: Path, peers: Sequence[Peer],
              read_range: ReadRange) -> FetchResult:
        """Download the blob of ``torrent`` into ``dest`` (a path that does not exist yet,
        e.g. :meth:`bootseer.nodecache.NodeCache.new_temporary`) from ``peers`` (the
        job's members; this node among them or not) and the store (``read_range``).

        Returns once ``dest`` holds the whole blob and matched its digest; the torrent is
        then out of the session (seed ``dest``'s final place with :meth:`seed`). On any
        error ``dest`` is removed.
        """
        return wholefetch.fetch(self._engine, torrent, dest, peers, read_range)

    def seed(self, torrent: Torrent, path: Path, peers: Sequence[Peer] = ()) -> bool:
        """Offer the blob in ``path`` (complete and verified: a node cache entry) to peers
        for ``seed_time`` seconds, dialing ``peers`` (peers that fetch dial us too).
        False if seeding is off (``seed_time`` 0) or the blob is seeded already."""
        return self._seeding.seed(torrent, path, peers)

    def read(self, torrent: Torrent, path: Path, offset: int, length: int,
             peers: Sequence[Peer], read_range: ReadRange, wait: float, *,
             share: bool = True) -> bytes:
        """``length`` bytes at ``offset`` of the object of ``torrent``, for a read that
        is waiting (a container's lazy read), from a peer that has them or the store.

        The object is in the session as a partial transfer with its file at ``path``
        (sparse; created on the first read, removed when it expires like a seed): a
        piece a connected peer has is requested at once (a piece deadline); one this
        node owns (``p % N``, as in :meth:`fetch`) is read from the store at once (the
        others wait for it); one whose owner is connected is waited for, ``wait``
        seconds at most, then read from the store; one whose owner is not connected,
        until the owner has been missing for ``piece_grace`` (it may be starting), then
        at once (:func:`bootseer.p2p.policy.demand_source`). The bytes returned are
        checked against the torrent's piece hashes here (whatever libtorrent checked
        already); :class:`SwarmError` or :class:`IntegrityError` mean: read the store.
        With ``share`` False this node owns no pieces: ``peers`` have the object (they
        staged it), and what none of them has is read from the store as their pieces.
        """
        return rangeread.read(self._engine, torrent, path, offset, length, peers,
                              read_range, wait, share=share)

    def open(self, torrent: Torrent, path: Path, peers: Sequence[Peer]) -> None:
        """Have the object ready for demand reads (:meth:`read`): in the session, its
        file at ``path``, dialing ``peers``, so that the first read finds them connected
        rather than paying for the handshakes."""
        rangeread.open_partial(self._engine, torrent, path, peers)

    def wind_down(self, seconds: float) -> None:
        """Seed what is seeded now for at most ``seconds`` more (a container of the job
        started on this node: ``p2p.seed_after_start``)."""
        self._seeding.wind_down(seconds)

    def stop_seeding(self, digest: str | None = None) -> None:
        """Stop seeding ``digest`` (every blob if None): when the job has started, or the
        cache entry is going away."""
        self._seeding.stop(digest)

    def stats(self) -> SwarmStats:
        """The counters as of now (waits up to a second for libtorrent's)."""
        return self._engine.stats()

    def close(self) -> None:
        """Stop seeding, close every connection and the listening socket."""
        self._engine.close()

    def __enter__(self) -> Swarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

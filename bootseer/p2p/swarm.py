"""One node's peer session: fetch a blob from the job's other nodes and the store, seed it.

The engine is libtorrent-rasterbar (BitTorrent v2): connections, piece picking, choking,
rate limits and hash checks are its; this module decides what only Bootseer knows,
namely which pieces come from the store, and keeps the session closed to everyone but
the job:

* **No discovery but ours.** No DHT, no local peer discovery, no UPnP/NAT-PMP, no
  trackers, no peer exchange, no metadata exchange (the session has no ``ut_metadata``
  or ``ut_pex`` plugin): it dials only the peers a caller names (the job's rendezvous
  records or the scheduler's list, :mod:`bootseer.p2p.rendezvous`) that are on
  ``p2p.networks``, and answers only those that know a torrent it holds as the
  cluster's key makes it (:mod:`bootseer.p2p.trust`: keyed info-hashes, encryption
  forced). It listens on one address:port: TCP for peers, and the UDP socket libtorrent
  always binds beside it (for uTP and UDP trackers, both off here: nothing is served
  on it). An IP filter refuses every address outside ``p2p.networks`` both ways.
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
  (banned, not connected for ``piece_grace`` seconds, or no new piece for as long; the
  absent owners' pieces are split again among the members still there, so a dead node
  costs its share once, not once per node), and everything still missing goes to the
  store when the fetch gained nothing for ``piece_grace`` seconds. A peer that leaves
  costs time, never correctness. Store pieces enter libtorrent by ``add_piece`` (and are
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

Threads: one thread per swarm reads libtorrent's alerts (``pop_alerts``) and expires
seeds; nothing else pops alerts. :meth:`Swarm.fetch` blocks its caller (the agent runs
it with ``asyncio.to_thread``) and may run in several threads at once for different
blobs; its ``read_range`` is called from the swarm's store-reader threads, which are
all done before the torrent leaves the session (libtorrent 2.1 can crash on an
``add_piece`` to a torrent being removed). :meth:`Swarm.seed`, :meth:`Swarm.stop_seeding`,
:meth:`Swarm.stats` and :attr:`Swarm.address` may be called from any thread;
:meth:`Swarm.close` once, by the owner, after every fetch returned.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libtorrent as lt

from bootseer.config import P2PConfig
from bootseer.errors import BootseerError, IntegrityError

from .blobfetch import FetchResult
from .peer import Peer
from .torrents import Torrent, piece_hash
from .trust import Trust

log = logging.getLogger(__name__)

#: How often a fetch looks at its torrent (peers, pieces) and decides on store reads.
TICK = 0.1
#: How long a fetch waits for its members to connect before it picks its store reads:
#: a late node must first learn that peers already have its share.
CONNECT_WAIT = 0.5
#: How often a fetch dials the members it is not connected to (late, restarted).
REDIAL = 1.0
#: Store reads in flight per swarm, across its fetches.
STORE_READS = 4
#: A piece read from the store that fails its torrent hash this often: the torrent lies.
STORE_FAILURES = 2
#: Most peer connections of the session (every node of a job may connect to every other).
CONNECTIONS = 2000
#: How long the session may take to open its listening socket, flush or drop a torrent.
ENGINE_TIMEOUT = 30.0
#: How often the swarm looks for seeds whose file is gone.
SEED_CHECK = 2.0
#: How often a demand read looks at its pieces (piece_finished wakes it sooner).
DEMAND_TICK = 0.01
#: How often a demand read dials the members it is not connected to.
DEMAND_REDIAL = 0.2
#: How long past its ``wait`` a demand read may take before it gives up on the swarm.
DEMAND_TIMEOUT = 10.0

ReadRange = Callable[[int, int], bytes]
"""``read_range(offset, length)``: exactly ``length`` verified bytes of the blob."""

_ALERTS = (lt.alert_category.error | lt.alert_category.status | lt.alert_category.peer
           | lt.alert_category.storage | lt.alert_category.piece_progress)
_HANDSHAKING = lt.peer_info.connecting | lt.peer_info.handshake
_FETCH_FLAGS = (lt.torrent_flags.apply_ip_filter | lt.torrent_flags.disable_dht
                | lt.torrent_flags.disable_lsd | lt.torrent_flags.disable_pex)
_SEED_FLAGS = _FETCH_FLAGS | lt.torrent_flags.seed_mode | lt.torrent_flags.upload_mode
_READY = (lt.torrent_status.states.downloading, lt.torrent_status.states.finished,
          lt.torrent_status.states.seeding)


class SwarmError(BootseerError):
    """The peer session failed (cannot listen, a torrent's file failed, a blob is being
    fetched already); the blob is read from the store instead."""


@dataclass(frozen=True)
class SwarmStats:
    """The session's counters, for /metrics."""

    peer_bytes: int  # payload received from peers
    store_bytes: int  # read from the store by fetches
    uploaded_bytes: int  # payload sent to peers
    peers: int  # connected now
    seeding: int  # objects seeded now
    banned: int  # addresses blocked for sending bad data


@dataclass(eq=False)
class _Transfer:
    """A torrent in the session: a fetch, or a seed until ``until`` (monotonic)."""

    torrent: Torrent
    handle: lt.torrent_handle
    seeding: bool
    path: Path  # the file: where a fetch writes, or what a seed serves
    #: A demand read's: pieces come only as reads ask for them (priority 0 otherwise),
    #: are served to peers as they come, and the file (sparse) goes when it expires.
    partial: bool = False
    absent: dict[str, float] = field(default_factory=dict)  # member → missing since
    until: float = float("inf")
    store_bytes: int = 0
    from_store: set[int] = field(default_factory=set)  # pieces added from the store
    store_failures: dict[int, int] = field(default_factory=dict)  # piece → hash failures
    banned: set[str] = field(default_factory=set)
    error: str | None = None
    reads: list[concurrent.futures.Future[int]] = field(default_factory=list)  # store reads
    demanded: dict[int, concurrent.futures.Future[int]] = field(default_factory=dict)
    wake: threading.Event = field(default_factory=threading.Event)  # something to look at
    flushed: threading.Event = field(default_factory=threading.Event)
    #: Demand reads' pieces being read back from libtorrent (read_piece: its write
    #: buffers hold new pieces until it flushes them to the file).
    piece_reads: dict[int, concurrent.futures.Future[bytes]] = field(default_factory=dict)
    removed: threading.Event = field(default_factory=threading.Event)


def parse_listen(text: str) -> tuple[str, int]:
    """``p2p.listen`` as (address, port): an IP literal that names this node (not
    0.0.0.0 or ::) and a port (0: any free one)."""
    host, sep, port = text.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        address, number = None, -1
    if not sep or address is None or address.is_unspecified or not 0 <= number < 65536:
        raise SwarmError(f"p2p.listen: {text!r} is not ADDRESS:PORT with this node's "
                         f"address (IPv6 in brackets)")
    return str(address), number


class Swarm:
    """A libtorrent session for one node (see the module docstring)."""

    def __init__(self, config: P2PConfig, trust: Trust | None = None) -> None:
        self.config = config
        #: The cluster's key and networks (from the config unless given).
        self.trust = trust or Trust.from_config(config)
        host, port = parse_listen(config.listen)
        if not self.trust.networks.allows(host):
            raise SwarmError(f"p2p.listen: {host} is not in p2p.networks, or is an "
                             f"address peers are never dialed on (loopback, link-local)")
        iface = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        # flags=0: none of the default plugins (ut_metadata, ut_pex); smart_ban only.
        self._ses = lt.session({
            "listen_interfaces": iface,
            "outgoing_interfaces": host,
            "enable_dht": False, "enable_lsd": False,
            "enable_upnp": False, "enable_natpmp": False,
            "enable_incoming_utp": False, "enable_outgoing_utp": False,
            "dht_bootstrap_nodes": "",
            # Only peers that know a torrent's keyed info-hash get through the encrypted
            # handshake (MSE proves it without sending it); the payload is RC4 too.
            "out_enc_policy": int(lt.enc_policy.pe_forced),
            "in_enc_policy": int(lt.enc_policy.pe_forced),
            "allowed_enc_level": int(lt.enc_level.pe_rc4),
            "prefer_rc4": True,
            "upload_rate_limit": int(config.upload_rate),
            # All of a job's peers cooperate: no tit-for-tat, every peer is served.
            "unchoke_slots_limit": -1,
            # A demand read's partial transfer wants nothing until a read asks: it must
            # stay connected to the job's peers meanwhile, "finished" as it looks.
            "close_redundant_connections": False,
            # A member dialed before it has added the torrent refuses; libtorrent would
            # then wait a minute (times its failures) before dialing it again.
            "min_reconnect_time": 1,
            # libtorrent leaves Nagle on: a HAVE sent to a peer that has the piece (a
            # seed) is a small unacknowledged segment that holds the next read's
            # requests back until the peer's delayed ACK, 40 ms (a 2 MiB demand read on
            # the loopback: 48 ms median with it, 10 ms without).
            "send_redundant_have": False,
            "connections_limit": CONNECTIONS,
            # libtorrent dials peers and hands out upload quota once per tick (default
            # 500 ms): at 100 ms a start waits less for its first connections, and a
            # capped node's handshakes are not held back for half a second each.
            "tick_interval": 100,
            "alert_mask": _ALERTS,
            "user_agent": "bootseer",
        }, 0)
        self._ses.add_extension("smart_ban")
        every = lt.ip_filter()
        every.add_rule("0.0.0.0", "255.255.255.255", 1 << lt.session.global_peer_class_id)
        every.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
                       1 << lt.session.global_peer_class_id)
        self._ses.set_peer_class_filter(every)
        self._host = host
        self._wait_listening(iface)
        self._lock = threading.Lock()
        self._transfers: dict[str, _Transfer] = {}  # by hex digest (= torrent name)
        self._removing: dict[str, _Transfer] = {}
        self._blocked = lt.ip_filter()  # p2p.networks only, less the banned
        for first, last, allowed in self.trust.networks.rules():
            self._blocked.add_rule(first, last, 0 if allowed else 1)  # 1: blocked
        self._ses.set_ip_filter(self._blocked)
        self._banned: set[str] = set()
        self._counters: dict[str, int] = {}
        self._stats_fresh = threading.Event()
        self._store_bytes = 0
        self._store_pool = concurrent.futures.ThreadPoolExecutor(
            STORE_READS, thread_name_prefix="p2p-store")
        self._closing = threading.Event()
        self._pump = threading.Thread(target=self._run_pump, name="p2p-alerts", daemon=True)
        self._pump.start()

    # -- the API ----------------------------------------------------------------------------

    @property
    def address(self) -> Peer:
        """Where peers reach this node (the listening port, once bound)."""
        return Peer(self._host, self._ses.listen_port())

    def fetch(self, torrent: Torrent, dest: Path, peers: Sequence[Peer],
              read_range: ReadRange) -> FetchResult:
        """Download the blob of ``torrent`` into ``dest`` (a path that does not exist yet,
        e.g. :meth:`bootseer.nodecache.NodeCache.new_temporary`) from ``peers`` (the
        job's members; this node among them or not) and the store (``read_range``).

        Returns once ``dest`` holds the whole blob and matched its digest; the torrent is
        then out of the session (seed ``dest``'s final place with :meth:`seed`). On any
        error ``dest`` is removed.
        """
        began = time.monotonic()
        members = self.members(peers)
        transfer = self._add(torrent, dest, seeding=False)
        try:
            result = self._download(transfer, members, read_range, began)
        except BaseException:
            # No store read may touch the torrent once it has left the session.
            for read in transfer.reads:
                read.cancel()
            concurrent.futures.wait(transfer.reads)
            self._drop(transfer, wait=True)
            dest.unlink(missing_ok=True)
            raise
        if torrent.addressed:
            _check_digest(dest, torrent.digest)
        return result

    def members(self, peers: Sequence[Peer]) -> list[Peer]:
        """A fetch's members, in the order that deals out its store reads (member ``k``
        of ``N`` owns pieces ``p % N == k``): ``peers`` and this node once, at its
        current port (a record of an earlier start is stale)."""
        me = self.address
        return sorted({p for p in peers if p.address != me.address and
                       self.trust.networks.allows(p.address)} | {me})

    def seed(self, torrent: Torrent, path: Path, peers: Sequence[Peer] = ()) -> bool:
        """Offer the blob in ``path`` (complete and verified: a node cache entry) to peers
        for ``seed_time`` seconds, dialing ``peers`` (peers that fetch dial us too).
        False if seeding is off (``seed_time`` 0) or the blob is seeded already."""
        if self.config.seed_time <= 0:
            return False
        with self._lock:
            if torrent.hex in self._transfers:
                return False
        transfer = self._add(torrent, path, seeding=True)
        transfer.until = time.monotonic() + self.config.seed_time
        self._dial(transfer, peers, {}, set())
        return True

    def read(self, torrent: Torrent, path: Path, offset: int, length: int,
             peers: Sequence[Peer], read_range: ReadRange, wait: float, *,
             share: bool = True) -> bytes:
        """``length`` bytes at ``offset`` of the object of ``torrent``, for a read that
        is waiting (a container's lazy read), from a peer that has them or the store.

        The object is in the session as a partial transfer with its file at ``path``
        (sparse; created on the first read, removed when it expires like a seed): a
        piece a connected peer has is requested at once (a piece deadline); one this
        node owns (``p % N``, as in :meth:`fetch`) is read from the store at once (the
        others wait for it); one
        whose owner is connected is waited for, ``wait`` seconds at most, then read from
        the store; one whose owner is not connected, until the owner has been missing for
        ``piece_grace`` (it may be starting), then at once. The bytes returned are
        checked against the torrent's piece hashes here (whatever libtorrent checked
        already); :class:`SwarmError` or :class:`IntegrityError` mean: read the store.
        With ``share`` False this node owns no pieces: ``peers`` have the object (they
        staged it), and what none of them has is read from the store as their pieces.
        """
        if torrent.num_pieces < 2:
            raise SwarmError(f"{torrent.digest} is one piece: read it from the store")
        if offset < 0 or length <= 0 or offset + length > torrent.size:
            raise ValueError(f"bytes {offset}+{length} are not in {torrent.digest}")
        transfer = self._partial(torrent, path, peers)
        if transfer.seeding:  # the whole object is here already
            return _pread(transfer.path, offset, length)
        handle, me = transfer.handle, self.address
        members = self.members(peers) if share else \
            sorted(p for p in set(peers) - {me} if self.trust.networks.allows(p.address))
        if not members:
            raise SwarmError(f"read of {torrent.digest}: no member to read it from")
        first = offset // torrent.piece_size
        needed = range(first, (offset + length - 1) // torrent.piece_size + 1)
        began = dialed_at = time.monotonic()
        grace = self.config.piece_grace
        asked: dict[int, float] = {}  # piece → when requested from peers
        while True:
            now = time.monotonic()
            if transfer.error:
                raise SwarmError(f"read of {torrent.digest}: {transfer.error}")
            if now - began > wait + DEMAND_TIMEOUT:
                raise SwarmError(f"read of {torrent.digest}: no piece after "
                                 f"{now - began:.1f} s")
            missing = [p for p in needed if not handle.have_piece(p)]
            if not missing:
                break
            connected, dialing = self._connected(handle)
            if now - dialed_at >= DEMAND_REDIAL:
                dialed_at = now
                self._dial(transfer, peers, connected, dialing)
            availability = _availability(handle, torrent.num_pieces)
            for piece in missing:
                with self._lock:
                    reading = transfer.demanded.get(piece)
                if reading is not None:
                    if reading.done():
                        reading.result()  # a failed store read fails this read
                    continue
                owner = members[piece % len(members)]
                # An owner not connected may be starting (a mount opens its image's packs
                # early, :meth:`open`, so that reads find their connections up): its
                # pieces are waited for until it has been missing for piece_grace.
                if owner.address in connected:
                    transfer.absent.pop(owner.address, None)
                elif owner != me:
                    transfer.absent.setdefault(owner.address, now)
                if piece in asked:  # from a peer: the store only if it is slow
                    from_store = now - asked[piece] >= wait
                elif availability[piece]:
                    handle.piece_priority(piece, 7)
                    handle.set_piece_deadline(piece, 0)
                    asked[piece] = now
                    from_store = False
                else:
                    from_store = owner == me or \
                        (owner.address in connected and now - began >= wait) or \
                        now - transfer.absent.get(owner.address, now) >= grace
                if from_store:
                    with self._lock:
                        if self._transfers.get(torrent.hex) is not transfer:
                            raise SwarmError(f"{torrent.digest} expired during a read")
                        if piece not in transfer.demanded:
                            transfer.demanded[piece] = self._store_pool.submit(
                                self._read_piece, transfer, piece, read_range)
            transfer.wake.wait(DEMAND_TICK)
            transfer.wake.clear()
        return self._checked(transfer, offset, length, needed)

    def open(self, torrent: Torrent, path: Path, peers: Sequence[Peer]) -> None:
        """Have the object ready for demand reads (:meth:`read`): in the session, its
        file at ``path``, dialing ``peers``, so that the first read finds them connected
        rather than paying for the handshakes."""
        self._partial(torrent, path, peers)

    def _partial(self, torrent: Torrent, path: Path, peers: Sequence[Peer]) -> _Transfer:
        """The object's transfer for demand reads: its seed if this node has it whole, the
        partial transfer if there is one, else a new one (every piece at priority 0)."""
        with self._lock:
            current = self._transfers.get(torrent.hex)
        if current is not None and (current.seeding or current.partial):
            transfer = current
        elif current is not None:
            raise SwarmError(f"{torrent.digest} is being fetched whole")
        else:
            transfer = self._add(torrent, path, seeding=False, partial=True)
            transfer.until = time.monotonic() + self.config.seed_time
        self._dial(transfer, peers, *self._connected(transfer.handle))
        return transfer

    def _dial(self, transfer: _Transfer, peers: Sequence[Peer], connected: dict[str, int],
              dialing: set[str]) -> None:
        """Connect ``transfer`` to the ``peers`` it is not connected to (nor banned, nor
        off ``p2p.networks``): the one place the swarm dials."""
        me = self.address
        for peer in peers:
            if peer != me and peer.address not in connected and peer.address not in dialing \
                    and peer.address not in self._banned \
                    and self.trust.networks.allows(peer.address):
                transfer.handle.connect_peer((peer.address, peer.port))

    def _checked(self, transfer: _Transfer, offset: int, length: int,
                 pieces: range) -> bytes:
        """The bytes of ``pieces`` (read back from libtorrent), each checked against the
        torrent, cut to the read."""
        torrent = transfer.torrent
        with self._lock:
            reads = []
            for piece in pieces:
                reading = transfer.piece_reads.get(piece)
                if reading is None:
                    reading = transfer.piece_reads[piece] = concurrent.futures.Future()
                    transfer.handle.read_piece(piece)
                reads.append(reading)
        data = []
        for piece, reading in zip(pieces, reads, strict=True):
            chunk = reading.result(ENGINE_TIMEOUT)
            if piece_hash(chunk, torrent.piece_size) != torrent.piece_digest(piece):
                raise IntegrityError(f"piece {piece} of {torrent.digest} does not match "
                                     f"the torrent")
            data.append(chunk)
        start, _ = torrent.piece_range(pieces[0])
        view = memoryview(b"".join(data))
        return bytes(view[offset - start:offset - start + length])

    def wind_down(self, seconds: float) -> None:
        """Seed what is seeded now for at most ``seconds`` more (a container of the job
        started on this node: ``p2p.seed_after_start``)."""
        until = time.monotonic() + max(0.0, seconds)
        with self._lock:
            for transfer in self._transfers.values():
                if transfer.seeding or transfer.partial:
                    transfer.until = min(transfer.until, until)

    def stop_seeding(self, digest: str | None = None) -> None:
        """Stop seeding ``digest`` (every blob if None): when the job has started, or the
        cache entry is going away."""
        with self._lock:
            seeds = [t for t in self._transfers.values()
                     if t.seeding and digest in (None, t.torrent.digest)]
        for transfer in seeds:
            self._drop(transfer, wait=False)

    def stats(self) -> SwarmStats:
        """The counters as of now (waits up to a second for libtorrent's)."""
        self._stats_fresh.clear()
        self._ses.post_session_stats()
        self._stats_fresh.wait(1.0)
        with self._lock:
            seeding = sum(t.seeding for t in self._transfers.values())
            counters, store_bytes, banned = self._counters, self._store_bytes, self._banned
            return SwarmStats(peer_bytes=counters.get("net.recv_payload_bytes", 0),
                              store_bytes=store_bytes,
                              uploaded_bytes=counters.get("net.sent_payload_bytes", 0),
                              peers=counters.get("peer.num_peers_connected", 0),
                              seeding=seeding, banned=len(banned))

    def close(self) -> None:
        """Stop seeding, close every connection and the listening socket."""
        self._closing.set()
        self._pump.join()
        self._store_pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for transfer in self._transfers.values():
                with contextlib.suppress(RuntimeError):
                    self._ses.remove_torrent(transfer.handle)
            self._transfers.clear()
        self._ses.pause()
        del self._ses  # the destructor waits for libtorrent to shut down

    def __enter__(self) -> Swarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- fetching ---------------------------------------------------------------------------

    def _download(self, transfer: _Transfer, members: list[Peer], read_range: ReadRange,
                  began: float) -> FetchResult:
        torrent, handle, me = transfer.torrent, transfer.handle, self.address
        grace = self.config.piece_grace
        others = [m for m in members if m != me]
        claimed: set[int] = set()
        retried: dict[int, int] = {}
        reads = transfer.reads
        # Per member: when last connected, its pieces and when they last grew. A member
        # is gone once either is piece_grace old: a moment's disconnection (a node that
        # finished re-adds the blob as a seed) moves nobody's share.
        seen_at = {m.address: began for m in others}
        progress = {m.address: (0, began) for m in others}
        seen: set[str] = set()
        before: dict[str, int] = {}  # connected at the previous tick
        mark, gained_at, dialed_at = (-1, -1), began, 0.0
        settled_at: float | None = None
        last_view: tuple[tuple[Peer, ...], bool] | None = None
        while True:
            now = time.monotonic()
            if transfer.error:
                raise SwarmError(f"fetch of {torrent.digest}: {transfer.error}")
            for piece in self._failed_store_pieces(transfer, retried):
                reads.append(self._store_pool.submit(
                    self._read_piece, transfer, piece, read_range))
            status = handle.status()
            if status.num_pieces == torrent.num_pieces:
                break
            if (status.num_pieces, status.total_payload_download) != mark:
                mark, gained_at = (status.num_pieces, status.total_payload_download), now
            connected, dialing = self._connected(handle)
            seen |= connected.keys()
            for address, count in connected.items():
                if address in seen_at:
                    seen_at[address] = now
                    if count > progress[address][0]:
                        progress[address] = (count, now)
            if now - dialed_at >= REDIAL:
                dialed_at = now
                self._dial(transfer, others, connected, dialing)
            # Settled: every member connected for a tick (so their piece lists arrived),
            # or CONNECT_WAIT passed with no handshake under way, or piece_grace passed.
            if settled_at is None and status.state in _READY and (
                    all(m.address in connected and m.address in before for m in others)
                    or (now - began >= CONNECT_WAIT and not dialing & seen_at.keys())
                    or now - began >= grace):
                settled_at = now
            before = connected
            if settled_at is not None:
                alive = tuple([me] + [
                    m for m in others if now - seen_at[m.address] < grace
                    and m.address not in self._banned
                    and (progress[m.address][0] == torrent.num_pieces
                         or now - progress[m.address][1] < grace)])
                stalled = now - max(gained_at, settled_at) >= grace
                if (alive, stalled) != last_view:  # who reads what changes only then
                    last_view = (alive, stalled)
                    share = self._store_share(handle, members, alive, me, claimed, stalled)
                    log.debug("p2p: %s after %.2f s: %d of %d members up, %sconnected to "
                              "%s; %d more pieces from the store", torrent.digest,
                              now - began, len(alive), len(members),
                              "stalled, " if stalled else "", sorted(connected), len(share))
                    for piece in share:
                        claimed.add(piece)
                        handle.piece_priority(piece, 0)  # peers need not send it
                        reads.append(self._store_pool.submit(
                            self._read_piece, transfer, piece, read_range))
            for read in reads:
                if read.done():
                    read.result()  # a failed store read fails the fetch
            transfer.wake.wait(TICK)
            transfer.wake.clear()
        for read in reads:
            read.result()
        peer_bytes = handle.status().total_payload_download
        self._drop(transfer, wait=True, flush=True)
        return FetchResult(torrent.digest, torrent.size, transfer.store_bytes, peer_bytes,
                           len(seen), tuple(sorted(transfer.banned)),
                           time.monotonic() - began)

    @staticmethod
    def _store_share(handle: lt.torrent_handle, members: list[Peer], alive: tuple[Peer, ...],
                     me: Peer, claimed: set[int], stalled: bool) -> list[int]:
        """The missing pieces this node now reads from the store: all of them after a
        stall; else those no peer has whose owner is this node (the owner of piece ``p``
        is ``members[p % N]``, or, if that member is gone, ``alive[p % len(alive)]``)."""
        have = handle.status(lt.status_flags_t.query_pieces).pieces
        missing = [p for p, had in enumerate(have) if not had and p not in claimed]
        if stalled:
            return missing
        availability = _availability(handle, len(have))
        live = set(alive)
        ranked = sorted(alive)
        mine = []
        for piece in missing:
            if availability[piece]:
                continue
            owner = members[piece % len(members)]
            if owner not in live:
                owner = ranked[piece % len(ranked)]
            if owner == me:
                mine.append(piece)
        return mine

    def _read_piece(self, transfer: _Transfer, piece: int, read_range: ReadRange) -> int:
        """Read one piece from the store and hand it to libtorrent (which checks it)."""
        handle = transfer.handle
        if handle.have_piece(piece):
            return 0
        offset, length = transfer.torrent.piece_range(piece)
        data = read_range(offset, length)
        if len(data) != length:
            raise IntegrityError(f"{transfer.torrent.digest}: the store returned "
                                 f"{len(data)} bytes for piece {piece}, not {length}")
        with self._lock:
            transfer.from_store.add(piece)
            transfer.store_bytes += length
            self._store_bytes += length
        handle.add_piece(piece, data, 0)
        return length

    def _failed_store_pieces(self, transfer: _Transfer, retried: dict[int, int]) -> list[int]:
        """Store pieces that failed their hash since last asked, to read again (a peer's
        block half written into the piece may have been the cause); a piece failing
        STORE_FAILURES times means the torrent does not describe the blob."""
        with self._lock:
            failures = dict(transfer.store_failures)
        again = []
        for piece, count in failures.items():
            if count >= STORE_FAILURES:
                raise IntegrityError(
                    f"piece {piece} of {transfer.torrent.digest}, read from the store, "
                    f"fails the hash of the torrent published for it: the torrent does "
                    f"not describe the blob")
            if count > retried.get(piece, 0):
                retried[piece] = count
                again.append(piece)
        return again

    def _connected(self, handle: lt.torrent_handle) -> tuple[dict[str, int], set[str]]:
        """Peers past their handshake, by address, with the pieces each has; and the
        addresses of those still connecting."""
        connected: dict[str, int] = {}
        dialing: set[str] = set()
        for info in handle.get_peer_info():
            address = str(ipaddress.ip_address(info.ip[0]))
            if info.flags & _HANDSHAKING:
                dialing.add(address)
            else:
                connected[address] = max(connected.get(address, 0), info.num_pieces)
        return connected, dialing

    # -- the session's torrents -------------------------------------------------------------

    def _add(self, torrent: Torrent, path: Path, *, seeding: bool,
             partial: bool = False) -> _Transfer:
        """Add ``torrent`` with its file at ``path``; a seed of the same blob is dropped
        first (a fetch means this node lost its copy), a fetch of it is an error."""
        deadline = time.monotonic() + ENGINE_TIMEOUT
        while True:
            with self._lock:
                current = self._transfers.get(torrent.hex)
                if current is not None and partial and current.partial:
                    return current  # two reads opened it at once
                if current is not None and not current.seeding:
                    raise SwarmError(f"{torrent.digest} is being fetched already")
                leaving = current or self._removing.get(torrent.hex)
                if leaving is None:
                    params = lt.add_torrent_params()
                    params.ti = torrent.keyed(self.trust)
                    params.save_path = str(path.parent)
                    params.renamed_files = {0: path.name}
                    params.flags = _SEED_FLAGS if seeding else _FETCH_FLAGS
                    if partial:  # nothing but what reads ask for
                        params.piece_priorities = [0] * torrent.num_pieces
                    try:
                        handle = self._ses.add_torrent(params)
                    except RuntimeError as exc:
                        raise SwarmError(f"cannot add {torrent.digest}: {exc}") from exc
                    transfer = _Transfer(torrent, handle, seeding, path, partial)
                    self._transfers[torrent.hex] = transfer
                    return transfer
            if current is not None:
                self._drop(current, wait=False)
            if not leaving.removed.wait(max(0.0, deadline - time.monotonic())):
                raise SwarmError(f"{torrent.digest} did not leave the session in time")

    def _drop(self, transfer: _Transfer, *, wait: bool, flush: bool = False,
              unless_busy: bool = False) -> bool:
        """Take ``transfer`` out of the session (after writing its file out, if
        ``flush``); with ``wait``, return only once libtorrent has let go of the file.
        With ``unless_busy``, a partial transfer a read is reading pieces for stays
        (False): no store read may add a piece to a torrent leaving the session."""
        if flush:
            transfer.flushed.clear()
            transfer.handle.flush_cache()
            transfer.flushed.wait(ENGINE_TIMEOUT)
        with self._lock:
            if unless_busy and any(not r.done() for r in transfer.demanded.values()):
                return False
            if self._transfers.get(transfer.torrent.hex) is transfer:
                del self._transfers[transfer.torrent.hex]
                self._removing[transfer.torrent.hex] = transfer
                with contextlib.suppress(RuntimeError):
                    self._ses.remove_torrent(transfer.handle)
        if wait and not transfer.removed.wait(ENGINE_TIMEOUT):
            raise SwarmError(f"{transfer.torrent.digest} did not leave the session in time")
        return True

    # -- alerts -----------------------------------------------------------------------------

    def _wait_listening(self, iface: str) -> None:
        deadline = time.monotonic() + ENGINE_TIMEOUT
        while time.monotonic() < deadline:
            self._ses.wait_for_alert(100)
            for alert in self._ses.pop_alerts():
                if isinstance(alert, lt.listen_failed_alert):
                    raise SwarmError(f"p2p: cannot listen on {iface}: {alert.message()}")
                if isinstance(alert, lt.listen_succeeded_alert):
                    log.info("p2p: listening on %s", iface)
                    return
        raise SwarmError(f"p2p: no listening socket on {iface} after {ENGINE_TIMEOUT} s")

    def _run_pump(self) -> None:
        checked_at = time.monotonic()
        while not self._closing.is_set():
            self._ses.wait_for_alert(200)
            for alert in self._ses.pop_alerts():
                try:
                    self._on_alert(alert)
                except Exception:  # one odd alert must not end the swarm's bookkeeping
                    log.exception("p2p: handling %s", type(alert).__name__)
            now = time.monotonic()
            check = now - checked_at >= SEED_CHECK
            if check:
                checked_at = now
            with self._lock:
                seeds = [t for t in self._transfers.values() if t.seeding or t.partial]
            for transfer in seeds:
                if now >= transfer.until:
                    if self._drop(transfer, wait=False, unless_busy=True):
                        log.info("p2p: seeded %s for its time; stopping",
                                 transfer.torrent.digest)
                elif transfer.partial:
                    continue
                elif check and not transfer.path.exists():
                    log.info("p2p: %s left the cache; no longer seeding it",
                             transfer.torrent.digest)
                    self._drop(transfer, wait=False)

    def _on_alert(self, alert: lt.alert) -> None:
        if isinstance(alert, lt.session_stats_alert):
            with self._lock:
                self._counters = dict(alert.values)
            self._stats_fresh.set()
            return
        if not isinstance(alert, lt.torrent_alert):
            return
        name = alert.torrent_name
        with self._lock:
            transfer = self._transfers.get(name) or self._removing.get(name)
            if transfer is None:
                return
            if isinstance(alert, lt.torrent_removed_alert):
                if self._removing.get(name) is transfer:
                    del self._removing[name]
                if transfer.partial:  # what reads brought is in the node's caches
                    transfer.path.unlink(missing_ok=True)
                transfer.removed.set()
            elif isinstance(alert, lt.cache_flushed_alert):
                transfer.flushed.set()
            elif isinstance(alert, lt.read_piece_alert):
                reading = transfer.piece_reads.pop(alert.piece, None)
                if reading is not None:
                    if alert.error.value():
                        reading.set_exception(SwarmError(
                            f"piece {alert.piece} of {name}: {alert.error.message()}"))
                    else:
                        reading.set_result(bytes(alert.buffer))
            elif isinstance(alert, lt.piece_finished_alert):
                transfer.wake.set()
            elif isinstance(alert, lt.hash_failed_alert):
                piece = alert.piece_index
                if piece in transfer.from_store:
                    transfer.from_store.discard(piece)
                    transfer.store_failures[piece] = transfer.store_failures.get(piece, 0) + 1
                    transfer.wake.set()
            elif isinstance(alert, lt.peer_ban_alert):
                self._ban(transfer, str(ipaddress.ip_address(alert.endpoint[0])))
            elif isinstance(alert, (lt.torrent_error_alert, lt.file_error_alert)):
                log.warning("p2p: %s: %s", transfer.torrent.digest, alert.message())
                if transfer.seeding:
                    self._removing[name] = self._transfers.pop(name)
                    with contextlib.suppress(RuntimeError):
                        self._ses.remove_torrent(transfer.handle)
                else:
                    transfer.error = alert.message()
                    transfer.wake.set()

    def _ban(self, transfer: _Transfer, address: str) -> None:
        """Block a peer that sent bad data, for every torrent of the session (lock held)."""
        transfer.banned.add(address)
        if address not in self._banned:
            log.warning("p2p: %s sent data failing the hashes of %s; banned", address,
                        transfer.torrent.digest)
            self._banned.add(address)
            self._blocked.add_rule(address, address, 1)  # 1: blocked
            self._ses.set_ip_filter(self._blocked)


def _check_digest(path: Path, digest: str) -> None:
    """The whole file against the blob's digest; deleted on a mismatch."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            sha.update(chunk)
    if "sha256:" + sha.hexdigest() != digest:
        path.unlink(missing_ok=True)
        raise IntegrityError(f"the file fetched for {digest} does not match it: deleted")


def _availability(handle: lt.torrent_handle, pieces: int) -> list[int]:
    """How many connected peers have each piece: libtorrent gives an empty list until its
    piece picker exists (no peer has offered anything yet), which means none."""
    counts = list(handle.piece_availability())
    return counts if len(counts) == pieces else [0] * pieces


def _pread(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        data = os.pread(f.fileno(), length, offset)
    if len(data) != length:
        raise SwarmError(f"{path}: {len(data)} bytes at {offset}, not {length}")
    return data

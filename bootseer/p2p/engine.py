"""The libtorrent session of one node: its settings, its torrents and its alert loop.

The jobs built on it (:mod:`.wholefetch`, :mod:`.rangeread`, :mod:`.seeding`, put together
by :class:`bootseer.p2p.swarm.Swarm`, whose docstring says what the session promises)
each add a :class:`Transfer` and drive it; this module is the one place that talks to
libtorrent's session: it opens it closed to all but the job (no discovery, encryption
forced, an IP filter of ``p2p.networks`` less the banned, every peer in the rate-limited
class), adds and removes torrents, dials, reads store pieces into torrents, reads pieces
back, and runs the one thread that pops alerts (``p2p-alerts``), which also calls the
jobs' housekeeping (:attr:`Engine.housekeeping`) after each batch.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
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

from .peer import Peer
from .policy import Absence
from .torrents import Torrent, file_digest, piece_hash
from .trust import Trust

log = logging.getLogger(__name__)

#: Store reads in flight per swarm, across its fetches.
STORE_READS = 4
#: A piece read from the store that fails its torrent hash this often: the torrent lies.
STORE_FAILURES = 2
#: Most peer connections of the session (every node of a job may connect to every other).
CONNECTIONS = 2000
#: How long the session may take to open its listening socket, flush or drop a torrent.
ENGINE_TIMEOUT = 30.0

ReadRange = Callable[[int, int], bytes]
"""``read_range(offset, length)``: exactly ``length`` verified bytes of the blob."""

_ALERTS = (lt.alert_category.error | lt.alert_category.status | lt.alert_category.peer
           | lt.alert_category.storage | lt.alert_category.piece_progress)
_HANDSHAKING = lt.peer_info.connecting | lt.peer_info.handshake
_FETCH_FLAGS = (lt.torrent_flags.apply_ip_filter | lt.torrent_flags.disable_dht
                | lt.torrent_flags.disable_lsd | lt.torrent_flags.disable_pex)
_SEED_FLAGS = _FETCH_FLAGS | lt.torrent_flags.seed_mode | lt.torrent_flags.upload_mode
#: Torrent states in which a torrent is checked and takes part (``Tick.ready``).
READY = (lt.torrent_status.states.downloading, lt.torrent_status.states.finished,
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
class Transfer:
    """A torrent in the session: a fetch, or a seed until ``until`` (monotonic)."""

    torrent: Torrent
    handle: lt.torrent_handle
    seeding: bool
    path: Path  # the file: where a fetch writes, or what a seed serves
    #: A demand read's: pieces come only as reads ask for them (priority 0 otherwise),
    #: are served to peers as they come, and the file (sparse) goes when it expires.
    partial: bool = False
    #: A demand read's: when each piece owner was first missed (counts across reads).
    absence: Absence = field(default_factory=Absence)
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


def _session_params(config: P2PConfig, host: str, iface: str) -> lt.session_params:
    """The session's settings and disk back end. The back end is ``mmap_disk_io`` (2.0's
    default), not 2.1's new default ``pread_disk_io``: libtorrent 2.1.1's pread back end
    crashes the process (SIGSEGV in ``disk_cache::hash_piece``, its piece iterator used
    after the piece left the cache) when pieces that failed their hash are added again
    and the torrent is removed, which is what a torrent that lies about its blob does
    (2 loops of ``test_a_torrent_that_lies_about_its_blob_costs_a_fetch_not_a_byte`` crashed
    after ~130 and ~160 runs; none in 400 with mmap).
    libtorrent's default plugins come with ``session_params``: ``smart_ban`` is the one
    wanted; ut_pex and ut_metadata never attach, every torrent being private
    (:meth:`bootseer.p2p.torrents.Torrent.keyed`)."""
    params = lt.session_params()
    params.settings = _session_settings(config, host, iface)
    params.disk_io_constructor = "mmap_disk_io_constructor"
    return params


def _session_settings(config: P2PConfig, host: str, iface: str) -> dict[str, object]:
    """The session's settings: closed to everyone but the job (see the module docstring
    of :mod:`bootseer.p2p.swarm`), every job's peer served."""
    return {
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
    }


class Engine:
    """One node's libtorrent session and its torrents (see the module docstring)."""

    def __init__(self, config: P2PConfig, trust: Trust | None = None) -> None:
        self.config = config
        #: The cluster's key and networks (from the config unless given).
        self.trust = trust or Trust.from_config(config)
        host, port = parse_listen(config.listen)
        if not self.trust.networks.allows(host):
            raise SwarmError(f"p2p.listen: {host} is not in p2p.networks, or is an "
                             f"address peers are never dialed on (loopback, link-local)")
        iface = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._ses = lt.session(_session_params(config, host, iface))
        every = lt.ip_filter()
        every.add_rule("0.0.0.0", "255.255.255.255", 1 << lt.session.global_peer_class_id)
        every.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
                       1 << lt.session.global_peer_class_id)
        self._ses.set_peer_class_filter(every)
        self._host = host
        self._wait_listening(iface)
        #: Guards the transfers, the banned and the counters (and each transfer's sets).
        self.lock = threading.Lock()
        self.transfers: dict[str, Transfer] = {}  # by hex digest (= torrent name)
        self._removing: dict[str, Transfer] = {}
        self._blocked = lt.ip_filter()  # p2p.networks only, less the banned
        for first, last, allowed in self.trust.networks.rules():
            self._blocked.add_rule(first, last, 0 if allowed else 1)  # 1: blocked
        self._ses.set_ip_filter(self._blocked)
        self.banned: set[str] = set()
        self._counters: dict[str, int] = {}
        self._stats_fresh = threading.Event()
        self._store_bytes = 0
        self._store_pool = concurrent.futures.ThreadPoolExecutor(
            STORE_READS, thread_name_prefix="p2p-store")
        #: Called by the alert thread after each batch of alerts, with the time.
        self.housekeeping: list[Callable[[float], None]] = []
        self._closing = threading.Event()
        self._pump = threading.Thread(target=self._run_pump, name="p2p-alerts", daemon=True)
        self._pump.start()

    @property
    def address(self) -> Peer:
        """Where peers reach this node (the listening port, once bound)."""
        return Peer(self._host, self._ses.listen_port())

    def members(self, peers: Sequence[Peer]) -> list[Peer]:
        """A transfer's members, in the order that deals out its store reads
        (:func:`bootseer.p2p.policy.owner`): ``peers`` and this node once, at its current
        port (a record of an earlier start is stale)."""
        me = self.address
        return sorted({p for p in peers if p.address != me.address and
                       self.trust.networks.allows(p.address)} | {me})

    def peers_but_me(self, peers: Sequence[Peer]) -> list[Peer]:
        """``peers`` on ``p2p.networks`` other than this node, sorted."""
        me = self.address
        return sorted(p for p in set(peers) - {me} if self.trust.networks.allows(p.address))

    # -- torrents ---------------------------------------------------------------------------

    def add(self, torrent: Torrent, path: Path, *, seeding: bool,
            partial: bool = False) -> Transfer:
        """Add ``torrent`` with its file at ``path``; a seed of the same blob is dropped
        first (a fetch means this node lost its copy), a fetch of it is an error."""
        deadline = time.monotonic() + ENGINE_TIMEOUT
        while True:
            with self.lock:
                current = self.transfers.get(torrent.hex)
                if current is not None and partial and current.partial:
                    return current  # two reads opened it at once
                if current is not None and not current.seeding:
                    raise SwarmError(f"{torrent.digest} is being fetched already")
                leaving = current or self._removing.get(torrent.hex)
                if leaving is None:
                    return self._add_new(torrent, path, seeding, partial)
            if current is not None:
                self.drop(current, wait=False)
            if not leaving.removed.wait(max(0.0, deadline - time.monotonic())):
                raise SwarmError(f"{torrent.digest} did not leave the session in time")

    def _add_new(self, torrent: Torrent, path: Path, seeding: bool,
                 partial: bool) -> Transfer:
        """Add a torrent the session does not have (lock held)."""
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
        transfer = Transfer(torrent, handle, seeding, path, partial)
        self.transfers[torrent.hex] = transfer
        return transfer

    def current(self, torrent: Torrent) -> Transfer | None:
        """The torrent's transfer in the session, if any."""
        with self.lock:
            return self.transfers.get(torrent.hex)

    def drop(self, transfer: Transfer, *, wait: bool, flush: bool = False,
             unless_busy: bool = False) -> bool:
        """Take ``transfer`` out of the session (after writing its file out, if
        ``flush``); with ``wait``, return only once libtorrent has let go of the file.
        With ``unless_busy``, a partial transfer a read is reading pieces for stays
        (False): no store read may add a piece to a torrent leaving the session."""
        if flush:
            transfer.flushed.clear()
            transfer.handle.flush_cache()
            transfer.flushed.wait(ENGINE_TIMEOUT)
        with self.lock:
            if unless_busy and any(not r.done() for r in transfer.demanded.values()):
                return False
            if self.transfers.get(transfer.torrent.hex) is transfer:
                del self.transfers[transfer.torrent.hex]
                self._removing[transfer.torrent.hex] = transfer
                with contextlib.suppress(RuntimeError):
                    self._ses.remove_torrent(transfer.handle)
        if wait and not transfer.removed.wait(ENGINE_TIMEOUT):
            raise SwarmError(f"{transfer.torrent.digest} did not leave the session in time")
        return True

    # -- peers ------------------------------------------------------------------------------

    @staticmethod
    def connected(handle: lt.torrent_handle) -> tuple[dict[str, int], set[str]]:
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

    def in_session(self) -> set[str]:
        """The addresses connected to this node for any of its transfers: a job's members
        that are up, whichever of its objects they are on (a fetch waits for such a
        member's share: :class:`bootseer.p2p.policy.FetchPolicy`)."""
        with self.lock:
            handles = [transfer.handle for transfer in self.transfers.values()]
        up: set[str] = set()
        for handle in handles:
            with contextlib.suppress(RuntimeError):  # left the session meanwhile
                up |= self.connected(handle)[0].keys()
        return up

    def dial(self, transfer: Transfer, peers: Sequence[Peer], connected: dict[str, int],
             dialing: set[str]) -> None:
        """Connect ``transfer`` to the ``peers`` it is not connected to (nor banned, nor
        off ``p2p.networks``): the one place the swarm dials."""
        me = self.address
        for peer in peers:
            if peer != me and peer.address not in connected and peer.address not in dialing \
                    and peer.address not in self.banned \
                    and self.trust.networks.allows(peer.address):
                transfer.handle.connect_peer((peer.address, peer.port))

    # -- pieces -----------------------------------------------------------------------------

    def read_from_store(self, transfer: Transfer, piece: int,
                        read_range: ReadRange) -> concurrent.futures.Future[int]:
        """Read ``piece`` from the store on the store-reader threads and hand it to
        libtorrent (which checks it); the future gives the bytes read."""
        return self._store_pool.submit(self._read_piece, transfer, piece, read_range)

    def _read_piece(self, transfer: Transfer, piece: int, read_range: ReadRange) -> int:
        handle = transfer.handle
        if handle.have_piece(piece):
            return 0
        offset, length = transfer.torrent.piece_range(piece)
        data = read_range(offset, length)
        if len(data) != length:
            raise IntegrityError(f"{transfer.torrent.digest}: the store returned "
                                 f"{len(data)} bytes for piece {piece}, not {length}")
        with self.lock:
            transfer.from_store.add(piece)
            transfer.store_bytes += length
            self._store_bytes += length
        handle.add_piece(piece, data, 0)
        return length

    def failed_store_pieces(self, transfer: Transfer, retried: dict[int, int]) -> list[int]:
        """Store pieces that failed their hash since last asked, to read again (a peer's
        block half written into the piece may have been the cause); a piece failing
        STORE_FAILURES times means the torrent does not describe the blob."""
        with self.lock:
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

    def read_back(self, transfer: Transfer, offset: int, length: int,
                  pieces: range) -> bytes:
        """The bytes of ``pieces`` (read back from libtorrent), each checked against the
        torrent, cut to the range ``offset``, ``length``."""
        torrent = transfer.torrent
        with self.lock:
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

    # -- counters and the end ---------------------------------------------------------------

    def stats(self) -> SwarmStats:
        """The counters as of now (waits up to a second for libtorrent's)."""
        self._stats_fresh.clear()
        self._ses.post_session_stats()
        self._stats_fresh.wait(1.0)
        with self.lock:
            seeding = sum(t.seeding for t in self.transfers.values())
            counters, store_bytes, banned = self._counters, self._store_bytes, self.banned
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
        with self.lock:
            for transfer in self.transfers.values():
                with contextlib.suppress(RuntimeError):
                    self._ses.remove_torrent(transfer.handle)
            self.transfers.clear()
        self._ses.pause()
        del self._ses  # the destructor waits for libtorrent to shut down

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
        while not self._closing.is_set():
            self._ses.wait_for_alert(200)
            for alert in self._ses.pop_alerts():
                try:
                    self._on_alert(alert)
                except Exception:  # one odd alert must not end the swarm's bookkeeping
                    log.exception("p2p: handling %s", type(alert).__name__)
            now = time.monotonic()
            for job in self.housekeeping:
                job(now)

    def _on_alert(self, alert: lt.alert) -> None:
        if isinstance(alert, lt.session_stats_alert):
            with self.lock:
                self._counters = dict(alert.values)
            self._stats_fresh.set()
            return
        if not isinstance(alert, lt.torrent_alert):
            return
        name = alert.torrent_name
        with self.lock:
            transfer = self.transfers.get(name) or self._removing.get(name)
            if transfer is not None:
                self._on_torrent_alert(alert, name, transfer)

    def _on_torrent_alert(self, alert: lt.torrent_alert, name: str,
                          transfer: Transfer) -> None:
        """One alert about ``transfer``'s torrent (lock held)."""
        if isinstance(alert, lt.torrent_removed_alert):
            if self._removing.get(name) is transfer:
                del self._removing[name]
            if transfer.partial:  # what reads brought is in the node's caches
                transfer.path.unlink(missing_ok=True)
            transfer.removed.set()
        elif isinstance(alert, lt.cache_flushed_alert):
            transfer.flushed.set()
        elif isinstance(alert, lt.read_piece_alert):
            self._on_piece_read(alert, name, transfer)
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
                self._removing[name] = self.transfers.pop(name)
                with contextlib.suppress(RuntimeError):
                    self._ses.remove_torrent(transfer.handle)
            else:
                transfer.error = alert.message()
                transfer.wake.set()

    @staticmethod
    def _on_piece_read(alert: lt.read_piece_alert, name: str, transfer: Transfer) -> None:
        reading = transfer.piece_reads.pop(alert.piece, None)
        if reading is None:
            return
        if alert.error.value():
            reading.set_exception(SwarmError(
                f"piece {alert.piece} of {name}: {alert.error.message()}"))
        else:
            reading.set_result(bytes(alert.buffer))

    def _ban(self, transfer: Transfer, address: str) -> None:
        """Block a peer that sent bad data, for every torrent of the session (lock held)."""
        transfer.banned.add(address)
        if address not in self.banned:
            log.warning("p2p: %s sent data failing the hashes of %s; banned", address,
                        transfer.torrent.digest)
            self.banned.add(address)
            self._blocked.add_rule(address, address, 1)  # 1: blocked
            self._ses.set_ip_filter(self._blocked)


def availability(handle: lt.torrent_handle, pieces: int) -> list[int]:
    """How many connected peers have each piece: libtorrent gives an empty list until its
    piece picker exists (no peer has offered anything yet), which means none."""
    counts = list(handle.piece_availability())
    return counts if len(counts) == pieces else [0] * pieces


def check_digest(path: Path, digest: str) -> None:
    """The whole file against the blob's digest; deleted on a mismatch."""
    if file_digest(path) != digest:
        path.unlink(missing_ok=True)
        raise IntegrityError(f"the file fetched for {digest} does not match it: deleted")


def pread(path: Path, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of the file at ``path``, exactly."""
    with open(path, "rb") as f:
        data = os.pread(f.fileno(), length, offset)
    if len(data) != length:
        raise SwarmError(f"{path}: {len(data)} bytes at {offset}, not {length}")
    return data

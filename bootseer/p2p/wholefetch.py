"""A whole blob fetched into a file, from the job's peers and this node's share of the store.

The engine (:mod:`.engine`) carries it out; who reads which piece from the store is
:class:`bootseer.p2p.policy.FetchPolicy`'s to say. This module looks at the torrent every
TICK (or sooner, when a piece finishes), turns what it sees into a
:class:`~bootseer.p2p.policy.Tick`, and starts the store reads the policy gives it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import libtorrent as lt

from .blobfetch import FetchResult
from .engine import (
    READY,
    STORE_READS,
    Engine,
    ReadRange,
    SwarmError,
    Transfer,
    availability,
    check_digest,
)
from .peer import Peer
from .policy import FetchPolicy, Tick, View
from .torrents import Torrent

log = logging.getLogger(__name__)

#: How often a fetch looks at its torrent (peers, pieces) and decides on store reads.
TICK = 0.1
#: How often a fetch dials the members it is not connected to (late, restarted).
REDIAL = 1.0


def fetch(engine: Engine, torrent: Torrent, dest: Path, peers: Sequence[Peer],
          read_range: ReadRange) -> FetchResult:
    """See :meth:`bootseer.p2p.swarm.Swarm.fetch`."""
    began = time.monotonic()
    members = engine.members(peers)
    transfer = engine.add(torrent, dest, seeding=False)
    try:
        result = _download(engine, transfer, members, read_range, began)
    except BaseException:
        # No store read may touch the torrent once it has left the session.
        for read in transfer.reads:
            read.cancel()
        concurrent.futures.wait(transfer.reads)
        engine.drop(transfer, wait=True)
        dest.unlink(missing_ok=True)
        raise
    if torrent.addressed:
        check_digest(dest, torrent.digest)
    return result


def _download(engine: Engine, transfer: Transfer, members: list[Peer],
              read_range: ReadRange, began: float) -> FetchResult:
    torrent, handle, me = transfer.torrent, transfer.handle, engine.address
    policy = FetchPolicy(members, me, began, engine.config.piece_grace, torrent.num_pieces,
                         engine.config.late_member_wait)
    claimed: set[int] = set()
    retried: dict[int, int] = {}
    reads = transfer.reads
    seen: set[str] = set()
    in_session: set[str] = set()
    dialed_at = 0.0
    while True:
        now = time.monotonic()
        if transfer.error:
            raise SwarmError(f"fetch of {torrent.digest}: {transfer.error}")
        for piece in engine.failed_store_pieces(transfer, retried):
            reads.append(engine.read_from_store(transfer, piece, read_range))
        status = handle.status()
        if status.num_pieces == torrent.num_pieces:
            break
        connected, dialing = engine.connected(handle)
        seen |= connected.keys()
        if now - dialed_at >= REDIAL:
            dialed_at = now
            engine.dial(transfer, policy.others, connected, dialing)
            if now - began < policy.late_wait and \
                    any(m.address not in connected for m in policy.others):
                in_session = engine.in_session()  # who is up, if not here yet
        with engine.lock:
            banned = frozenset(engine.banned)
        changed = policy.look(Tick(now, status.state in READY, connected, dialing, banned,
                                   (status.num_pieces, status.total_payload_download),
                                   in_session))
        view = policy.view
        room = STORE_READS - sum(not read.done() for read in reads)
        if view is not None and room > 0:  # claimed as reads free up (policy.py)
            for piece in _store_share(policy, view, handle, claimed, room):
                claimed.add(piece)
                handle.piece_priority(piece, 0)  # peers need not send it
                reads.append(engine.read_from_store(transfer, piece, read_range))
        if changed is not None:
            log.debug("p2p: %s after %.2f s: %d of %d members up, %sconnected to %s; "
                      "%d pieces claimed from the store", torrent.digest, now - began,
                      len(changed.alive), len(members), "stalled, " if changed.stalled
                      else "", sorted(connected), len(claimed))
        for read in reads:
            if read.done():
                read.result()  # a failed store read fails the fetch
        transfer.wake.wait(TICK)
        transfer.wake.clear()
    for read in reads:
        read.result()
    peer_bytes = handle.status().total_payload_download
    engine.drop(transfer, wait=True, flush=True)
    return FetchResult(torrent.digest, torrent.size, transfer.store_bytes, peer_bytes,
                       len(seen), tuple(sorted(transfer.banned)), time.monotonic() - began)


def _store_share(policy: FetchPolicy, view: View, handle: lt.torrent_handle,
                 claimed: set[int], room: int) -> list[int]:
    """The missing pieces this node reads from the store next, ``room`` at most
    (:meth:`FetchPolicy.store_share`)."""
    have = handle.status(lt.status_flags_t.query_pieces).pieces
    return policy.store_share(view, have, claimed, availability(handle, len(have)), room)

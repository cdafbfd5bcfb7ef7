"""A range of an object read for a reader that waits (a container's lazy read), through
the job's peers: the engine side of :mod:`bootseer.p2p.demand`.

The object is in the session as a *partial* transfer (every piece at priority 0: pieces
come only as reads ask), its file sparse, removed when it expires like a seed
(:mod:`.seeding`). Where each missing piece comes from is
:func:`bootseer.p2p.policy.demand_source`'s to say; this module looks every DEMAND_TICK
(or when a piece finishes), asks peers or starts store reads accordingly, and checks the
bytes it returns against the torrent.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from .engine import Engine, ReadRange, SwarmError, Transfer, availability, pread
from .peer import Peer
from .policy import DemandPiece, Source, demand_source
from .torrents import Torrent

#: How often a demand read looks at its pieces (piece_finished wakes it sooner).
DEMAND_TICK = 0.01
#: How often a demand read dials the members it is not connected to.
DEMAND_REDIAL = 0.2
#: How long past its ``wait`` a demand read may take before it gives up on the swarm.
DEMAND_TIMEOUT = 10.0


def open_partial(engine: Engine, torrent: Torrent, path: Path,
                 peers: Sequence[Peer]) -> Transfer:
    """The object's transfer for demand reads: its seed if this node has it whole, the
    partial transfer if there is one, else a new one (every piece at priority 0),
    dialing ``peers``."""
    current = engine.current(torrent)
    if current is not None and (current.seeding or current.partial):
        transfer = current
    elif current is not None:
        raise SwarmError(f"{torrent.digest} is being fetched whole")
    else:
        transfer = engine.add(torrent, path, seeding=False, partial=True)
        transfer.until = time.monotonic() + engine.config.seed_time
    engine.dial(transfer, peers, *engine.connected(transfer.handle))
    return transfer


def read(engine: Engine, torrent: Torrent, path: Path, offset: int, length: int,
         peers: Sequence[Peer], read_range: ReadRange, wait: float, *,
         share: bool = True) -> bytes:
    """See :meth:`bootseer.p2p.swarm.Swarm.read`."""
    if torrent.num_pieces < 2:
        raise SwarmError(f"{torrent.digest} is one piece: read it from the store")
    if offset < 0 or length <= 0 or offset + length > torrent.size:
        raise ValueError(f"bytes {offset}+{length} are not in {torrent.digest}")
    transfer = open_partial(engine, torrent, path, peers)
    if transfer.seeding:  # the whole object is here already
        return pread(transfer.path, offset, length)
    members = engine.members(peers) if share else engine.peers_but_me(peers)
    if not members:
        raise SwarmError(f"read of {torrent.digest}: no member to read it from")
    needed = range(offset // torrent.piece_size,
                   (offset + length - 1) // torrent.piece_size + 1)
    _wait_for(engine, transfer, needed, members, peers, read_range, wait)
    return engine.read_back(transfer, offset, length, needed)


def _wait_for(engine: Engine, transfer: Transfer, needed: range, members: list[Peer],
              peers: Sequence[Peer], read_range: ReadRange, wait: float) -> None:
    """Until this node has every piece of ``needed``: each missing one asked of peers,
    read from the store or waited for, as the policy says. An owner's absence is the
    transfer's (:attr:`Transfer.absence`): it counts across reads of the object."""
    torrent, handle = transfer.torrent, transfer.handle
    me, grace = engine.address, engine.config.piece_grace
    began = dialed_at = time.monotonic()
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
            return
        connected, dialing = engine.connected(handle)
        if now - dialed_at >= DEMAND_REDIAL:
            dialed_at = now
            engine.dial(transfer, peers, connected, dialing)
        available = availability(handle, torrent.num_pieces)
        for piece in missing:
            with engine.lock:
                reading = transfer.demanded.get(piece)
            if reading is not None:
                if reading.done():
                    reading.result()  # a failed store read fails this read
                continue
            source = demand_source(
                DemandPiece(piece, bool(available[piece]), asked.get(piece)), members, me,
                connected=connected, absence=transfer.absence, now=now, began=began,
                wait=wait, grace=grace)
            if source is Source.PEERS:
                handle.piece_priority(piece, 7)
                handle.set_piece_deadline(piece, 0)
                asked[piece] = now
            elif source is Source.STORE:
                _from_store(engine, transfer, piece, read_range)
        transfer.wake.wait(DEMAND_TICK)
        transfer.wake.clear()


def _from_store(engine: Engine, transfer: Transfer, piece: int, read_range: ReadRange) -> None:
    """Start the store read of ``piece`` for the demand reads waiting on it (once)."""
    with engine.lock:
        if engine.transfers.get(transfer.torrent.hex) is not transfer:
            raise SwarmError(f"{transfer.torrent.digest} expired during a read")
        if piece not in transfer.demanded:
            transfer.demanded[piece] = engine.read_from_store(transfer, piece, read_range)

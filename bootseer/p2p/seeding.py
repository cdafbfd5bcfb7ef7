"""What a node offers its job's peers, and for how long (see :mod:`bootseer.p2p.swarm`).

A seed reads only (``seed_mode`` and ``upload_mode``: see :mod:`.engine`) and lasts until
:meth:`Seeding.stop`, ``seed_time`` seconds, ``seed_after_start`` seconds after a
container started here (:meth:`Seeding.wind_down`), or until its file is gone: the node
cache evicted the entry, which any process of the node may, so :meth:`Seeding.expire`
(run by the engine's alert thread) looks every SEED_CHECK seconds rather than being told.
A demand read's partial transfer expires the same way, when no read is reading it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from .engine import Engine
from .peer import Peer
from .torrents import Torrent

log = logging.getLogger(__name__)

#: How often the swarm looks for seeds whose file is gone.
SEED_CHECK = 2.0


class Seeding:
    """The seeds (and the partial transfers' lifetimes) of one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._checked_at = time.monotonic()
        engine.housekeeping.append(self.expire)

    def seed(self, torrent: Torrent, path: Path, peers: Sequence[Peer] = ()) -> bool:
        """See :meth:`bootseer.p2p.swarm.Swarm.seed`."""
        engine = self.engine
        if engine.config.seed_time <= 0 or engine.current(torrent) is not None:
            return False
        transfer = engine.add(torrent, path, seeding=True)
        transfer.until = time.monotonic() + engine.config.seed_time
        engine.dial(transfer, peers, {}, set())
        return True

    def wind_down(self, seconds: float) -> None:
        """Seed what is seeded now (and keep partial transfers) for at most ``seconds``."""
        until = time.monotonic() + max(0.0, seconds)
        with self.engine.lock:
            for transfer in self.engine.transfers.values():
                if transfer.seeding or transfer.partial:
                    transfer.until = min(transfer.until, until)

    def stop(self, digest: str | None = None) -> None:
        """Stop seeding ``digest`` (every blob if None)."""
        with self.engine.lock:
            seeds = [t for t in self.engine.transfers.values()
                     if t.seeding and digest in (None, t.torrent.digest)]
        for transfer in seeds:
            self.engine.drop(transfer, wait=False)

    def expire(self, now: float) -> None:
        """Drop the seeds and partial transfers whose time is up, and (every SEED_CHECK)
        the seeds whose file is gone."""
        check = now - self._checked_at >= SEED_CHECK
        if check:
            self._checked_at = now
        engine = self.engine
        with engine.lock:
            seeds = [t for t in engine.transfers.values() if t.seeding or t.partial]
        for transfer in seeds:
            if now >= transfer.until:
                if engine.drop(transfer, wait=False, unless_busy=True):
                    log.info("p2p: seeded %s for its time; stopping", transfer.torrent.digest)
            elif transfer.partial:
                continue
            elif check and not transfer.path.exists():
                log.info("p2p: %s left the cache; no longer seeding it",
                         transfer.torrent.digest)
                engine.drop(transfer, wait=False)

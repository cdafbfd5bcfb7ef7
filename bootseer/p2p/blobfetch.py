"""The one call a node makes for a blob: through the job's swarm when it has one, else from
the store, with the same verified bytes either way.

``p2p.enabled = false`` (the default) gives no swarm (:func:`open_swarm` returns None, so
nothing listens and libtorrent is not even loaded) and :func:`fetch_blob` is then the
plain read every node did before: the blob's verified chunks streamed from the store into
the file. With a swarm, a blob that has a published torrent is fetched from peers and the
store (:meth:`bootseer.p2p.swarm.Swarm.fetch`); one without a torrent, with a torrent
that is refused, or whose swarm fetch fails for any reason, is read plainly instead, so
peers can cost time but never a start.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.config import P2PConfig
from bootseer.errors import BootseerError
from bootseer.store import BlobStore

from .peer import Peer

if TYPE_CHECKING:
    from .swarm import Swarm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FetchResult:
    """Where one fetch's bytes came from."""

    digest: str
    size: int
    store_bytes: int  # read from the store (a piece read twice counts twice)
    peer_bytes: int  # payload received from peers, failed and redundant bytes included
    peers: int  # distinct peers connected at some time during the fetch
    banned: tuple[str, ...]  # addresses banned for bad data during the fetch
    seconds: float


def open_swarm(config: P2PConfig) -> Swarm | None:
    """This node's swarm, or None when peer-to-peer is off."""
    if not config.enabled:
        return None
    from .swarm import Swarm

    return Swarm(config)


def fetch_blob(blobs: BlobStore, digest: str, dest: Path, *, swarm: Swarm | None,
               peers: Sequence[Peer] = ()) -> FetchResult:
    """Blob ``digest`` into ``dest`` (a new file; the caller adds it to its cache and,
    with a swarm, seeds it from there), verified against its digest."""
    if swarm is not None:
        from . import torrents

        size = blobs.stat(digest).size
        try:
            torrent = torrents.load(blobs.store, digest, size)
            return swarm.fetch(torrent, dest, peers,
                               lambda offset, length: blobs.read_range(digest, offset, length))
        except FileNotFoundError:
            log.debug("p2p: %s has no torrent; reading it from the store", digest)
        except BootseerError as exc:
            log.warning("p2p: %s: %s; reading it from the store", digest, exc)
    return read_plain(blobs, digest, dest)


def read_plain(blobs: BlobStore, digest: str, dest: Path) -> FetchResult:
    """The blob's verified chunks from the store into ``dest`` (removed on failure)."""
    began = time.monotonic()
    size = 0
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        with open(fd, "wb") as f:
            for chunk in blobs.iter_chunks(digest):  # verified, the whole digest at the end
                f.write(chunk)
                size += len(chunk)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return FetchResult(digest, size, size, 0, 0, (), time.monotonic() - began)

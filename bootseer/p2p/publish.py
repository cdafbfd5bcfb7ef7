"""Torrents published with their objects, by whoever publishes the object.

The node that writes a blob (a snapshot's shard, an image's hot pack) has its bytes in a
local file at that moment (or, streaming an image's pack to the store, their leaf
hashes: :class:`~bootseer.p2p.torrents.LeafHasher`); hashing them there costs a read of
a local file, where any later node would have to read the whole object from the store
first. So the publisher builds the torrent (:func:`bootseer.p2p.torrents.build`) and
puts it beside the object, whether or not peer-to-peer is enabled on this node: a
torrent is a few KiB of metadata per object, and nodes that do enable it can only use
torrents that exist.

A torrent is an optimisation: failing to build or publish one (libtorrent missing, the
store refusing the write) is logged and the object is published all the same; nodes then
read that object from the store.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.store import Store

if TYPE_CHECKING:
    from .torrents import LeafHasher

log = logging.getLogger(__name__)


def publish_torrent(store: Store, digest: str, source: Path | bytes) -> bool:
    """Build the torrent of object ``digest`` from its bytes (in the file ``source``, or
    ``source`` itself: a manifest, a hot list, which libtorrent's builder reads from a
    temporary file) and publish it (create-only); False, logged, if there was one already
    or it could not be done."""
    try:
        from . import torrents  # libtorrent: loaded by publishers, never by readers
    except ImportError as exc:
        log.warning("p2p: no torrent for %s (libtorrent is not available: %s)", digest, exc)
        return False
    try:
        if store.exists(torrents.key(digest)):
            return False
        if isinstance(source, Path):
            return torrents.publish(store, digest,
                                    torrents.build(digest, source.stat().st_size, source))
        with tempfile.NamedTemporaryFile(prefix="bootseer-torrent-") as spool:
            spool.write(source)
            spool.flush()
            return torrents.publish(store, digest,
                                    torrents.build(digest, len(source), Path(spool.name)))
    except Exception as exc:  # an optimisation: never the object's publish
        log.warning("p2p: could not publish the torrent of %s: %s", digest, exc)
        return False


def leaf_hasher() -> LeafHasher | None:
    """A hasher for an object about to be streamed to the store (None without
    libtorrent: then no torrent is published for it)."""
    try:
        from .torrents import LeafHasher
    except ImportError:
        return None
    return LeafHasher()


def publish_layer(store: Store, digest: str, hasher: LeafHasher) -> bool:
    """Publish the torrent of object ``digest``, whose bytes ``hasher`` took as they were
    written (create-only), with pieces for reads by ranges (DEMAND_PIECE: an image's
    packs); False if it is too small to share (one piece), was there already, or could
    not be published (logged)."""
    from . import torrents

    try:
        piece = torrents.piece_size_for(hasher.size, torrents.DEMAND_PIECE)
        if -(-hasher.size // piece) < 2:
            return False  # one piece: fetched whole from the store, never shared
        data = torrents.build_from_layer(digest, hasher.size, piece, hasher.layer(piece))
        return torrents.publish(store, digest, data)
    except Exception as exc:  # an optimisation: never the object's publish
        log.warning("p2p: could not publish the torrent of %s: %s", digest, exc)
        return False

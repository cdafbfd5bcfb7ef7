"""Peer-to-peer fan-out: when N nodes of a job need the same blob, each byte leaves the
store about once, not N times.

* :mod:`.torrents` — a blob's BitTorrent v2 metadata, built from its bytes, published in
  the store beside it, checked on load (never taken from a peer);
* :mod:`.swarm` — one node's libtorrent session: fetch from peers with the store as the
  fallback and each node's share of the store reads, seed what the node has; built of
  :mod:`.engine` (the session and its alert loop), :mod:`.wholefetch`, :mod:`.rangeread`
  (demand reads) and :mod:`.seeding`;
* :mod:`.policy` — who reads which piece from the store and when a member is gone: pure
  rules, no libtorrent, no I/O;
* :mod:`.rendezvous` — a job's members through records in the store (or a list the
  scheduler passes: :func:`.peer.parse_peers`);
* :mod:`.blobfetch` — the call a node makes: :func:`open_swarm` (None when ``p2p.enabled``
  is false), :func:`fetch_blob` and :func:`fetch_object` (through the swarm, else a plain
  store read), a :class:`Fanout` per warm of a job;
* :mod:`.publish` — :func:`publish_torrent`, called by whoever publishes an object.

libtorrent is imported only by :mod:`.torrents` and the swarm's modules, so a node with
peer-to-peer off never loads it (a process that publishes a torrent does).
"""

from bootseer.p2p.blobfetch import (
    Fanout,
    FetchResult,
    fetch_blob,
    fetch_object,
    open_swarm,
    read_object,
    read_plain,
)
from bootseer.p2p.peer import Peer, PeerAddressError, parse_peers
from bootseer.p2p.publish import publish_torrent

__all__ = ["Fanout", "FetchResult", "Peer", "PeerAddressError", "fetch_blob", "fetch_object",
           "open_swarm", "parse_peers", "publish_torrent", "read_object", "read_plain"]

"""Store objects without a content address (checkpoint files), shared among a job's nodes.

A blob's torrent is built by its publisher, who has its bytes at hand. A checkpoint file
was written by the training job, and nobody has hashed it: whoever builds its torrent
must first read all of it from the store, and a node that waited for that would wait a
whole read longer than a node reading it alone. So the nodes of a job hash it together,
each reading only its own share once:

1. The first ``H`` of the ``N`` members (the swarm's order, :meth:`Swarm.members`; ``H``
   at most MAX_HASHERS and the piece count, so a file has at most that many records and
   none is empty) hash: member ``k`` reads the pieces ``p % H == k`` (the swarm's owner
   rule, :mod:`bootseer.p2p.policy`) into a spool file,
   hashes each (:func:`~bootseer.p2p.torrents.piece_hash`) and publishes those hashes
   with the cluster key's tag, create-only, as ``p2p/files/ab/<id>.layers/<H>-<k>``.
2. Each member waits for the other shares' hashes. A share whose hashes have not come
   when ``2 x`` this node's own read plus ``piece_grace`` has passed (a member that does
   not hash: since the last share came) is taken for lost: its heir is this node, which
   reads and hashes it too (and publishes it, so others need not).
3. All hashes in order are the piece layer: the torrent (``p2p/files/ab/<id>``,
   :func:`~bootseer.p2p.torrents.build_from_layer`, tagged too) is the same bytes on
   every node and published create-only; a later restart of the same checkpoint loads it
   and skips steps 1 and 2.
4. The swarm fetches the file; this node's share comes from its spool, not the store.

``<id>`` is the sha256 of the object's URL, size and mtime: a rewritten checkpoint is a
new identity. The hashes are the store's, but believed only with the tag of the key the
operator gave the job's agents (:mod:`bootseer.p2p.trust`): a store writer or a peer
cannot choose them. A record or torrent without a good tag, or of the wrong size, fails
the fetch with :class:`ShareError` (the file's records are removed and it is read from
the store); the swarm checks every piece, the store's included, against the torrent, so
no unverified byte reaches a reader or a cache.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.errors import BootseerError, IntegrityError
from bootseer.store import Store

from . import policy
from .peer import Peer
from .policy import MAX_HASHERS as MAX_HASHERS  # the docstring's, the tests'
from .trust import TAG_BYTES, PeerKey, Trust

if TYPE_CHECKING:
    from .swarm import Swarm
    from .torrents import Torrent

log = logging.getLogger(__name__)

#: Smaller objects are read from the store: a torrent needs at least two pieces, and a
#: small read costs less than the rendezvous on its hashes.
MIN_SHARED_SIZE = 1 << 20
#: Store reads in flight while hashing a share.
SHARE_READS = 4
#: How often a node looks for the other members' hashes (one listing of the store).
POLL = 0.2


class ShareError(IntegrityError):
    """A file's hashes or torrent are unusable (wrong length, not tagged with the cluster
    key): they are removed, and the object is read from the store."""


@dataclass(frozen=True)
class SharedFile:
    """A store object fetched through the swarm without a digest known beforehand."""

    store: Store  # where the object is
    #: Where its torrent and hashes are kept: Bootseer's own store, never beside the
    #: object (a checkpoint directory is the training job's, read by its own loaders).
    records: Store
    key: str
    url: str  # where it is (the identity's first part)
    size: int
    mtime: float

    @property
    def identity(self) -> str:
        """``sha256:<hex>`` of URL, size and mtime: the name of its torrent."""
        text = f"{self.url}\n{self.size}\n{self.mtime!r}"
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def read_range(self, offset: int, length: int) -> bytes:
        return self.store.read_range(self.key, offset, length)

    @property
    def readable_by_all(self) -> bool:
        """Whether every user may read the object at its source (its store says so): the
        only files whose bytes may go to the job's other nodes, whoever runs there."""
        access = self.store.access(self.key)
        return access is not None and bool(access.mode & 0o004)


def shared_torrent(swarm: Swarm, file: SharedFile, peers: tuple[Peer, ...], spool: Path,
                   piece_grace: float) -> tuple[Torrent, set[int]] | None:
    """The file's torrent and the pieces this node holds in ``spool`` (read while hashing
    its share; none when the torrent was published already). None if the file is not
    shared (too small, or this node is the job's only member)."""
    from . import torrents

    if file.size < MIN_SHARED_SIZE:
        return None
    try:
        return load_torrent(file, swarm.trust), set()
    except FileNotFoundError:
        pass
    members = swarm.members(peers)
    if len(members) < 2:
        return None
    key = swarm.trust.key
    piece = torrents.piece_size_for(file.size)
    layer, held = _hash_together(file, key, members.index(swarm.address), len(members),
                                 piece, spool, piece_grace)
    publish_torrent(file, key, piece, layer)
    return load_torrent(file, swarm.trust), held


def publish_torrent(file: SharedFile, key: PeerKey, piece: int, layer: bytes) -> None:
    """The file's torrent from its piece hashes, tagged with the cluster key, published
    create-only (every honest node builds the same bytes)."""
    from . import torrents

    data = torrents.build_from_layer(file.identity, file.size, piece, layer)
    data = torrents.with_tag(data, _torrent_tag(key, file, piece, layer))
    torrents.publish(file.records, file.identity, data, addressed=False)


def load_torrent(file: SharedFile, trust: Trust) -> Torrent:
    """The file's published torrent, checked and tagged with the cluster key;
    ``FileNotFoundError`` if none, :class:`ShareError` if it is not the job's."""
    from . import torrents

    try:
        torrent = torrents.load(file.records, file.identity, file.size, addressed=False)
    except torrents.TorrentError as exc:
        raise ShareError(f"{file.url}: {exc}") from exc
    tag = torrents.tag_of(torrent.data)
    if tag is None or not hmac.compare_digest(
            tag, _torrent_tag(trust.key, file, torrent.piece_size, torrent.layer)):
        raise ShareError(f"{file.url}: its torrent is not tagged with the cluster's peer "
                         f"key: not this job's nodes'")
    return torrent


def _torrent_tag(key: PeerKey, file: SharedFile, piece: int, layer: bytes) -> bytes:
    """The tag of a file's torrent: its identity, size and piece layer (which the torrent's
    merkle root is checked against on load)."""
    return key.tag("file-torrent", file.identity, file.size, piece,
                   hashlib.sha256(layer).digest())


def forget(file: SharedFile) -> None:
    """Remove the file's torrent and hashes: the store's bytes failed them."""
    from . import torrents

    keys = [torrents.key(file.identity, addressed=False)]
    keys += [info.key for info in file.records.list(_layers_prefix(file))]
    for key in keys:
        with contextlib.suppress(FileNotFoundError):  # another node removed it first
            file.records.delete(key)


def spool_reader(file: SharedFile, spool: Path, held: set[int],
                 piece_size: int) -> Callable[[int, int], bytes]:
    """``read_range`` for the swarm: pieces in ``held`` from the spool, the rest from the
    store (the swarm checks both against the torrent)."""
    def read_range(offset: int, length: int) -> bytes:
        if offset // piece_size in held:
            with open(spool, "rb") as f:
                return os.pread(f.fileno(), length, offset)
        return file.read_range(offset, length)

    return read_range


def _layers_prefix(file: SharedFile) -> str:
    from . import torrents

    return torrents.key(file.identity, addressed=False) + ".layers/"


def _hash_together(file: SharedFile, key: PeerKey, me: int, members: int, piece: int,
                   spool: Path, piece_grace: float) -> tuple[bytes, set[int]]:
    """Steps 1 and 2 of the module docstring: the piece layer, and the pieces read."""
    pieces = -(-file.size // piece)
    count = policy.hashers(members, pieces)
    prefix = _layers_prefix(file)
    hashes: dict[int, bytes] = {}
    held: set[int] = set()
    fd = os.open(spool, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        began = time.monotonic()
        if me < count:
            _hash_share(file, key, fd, me, count, piece, pieces, prefix, hashes, held)
        deadline = policy.hash_deadline(began, time.monotonic(), piece_grace)
        waiting = set(range(count)) - {me}
        while waiting:
            # One listing per look, not a read per member: N nodes wait at once.
            present = {info.key for info in file.records.list(prefix)}
            for k in sorted(waiting):
                name = f"{prefix}{count}-{k}"
                if name in present and _load_share(file, key, name, k, count, pieces,
                                                   hashes):
                    waiting.discard(k)
                    if me >= count:  # a share came: the hashers are at work
                        deadline = max(deadline, policy.hash_deadline(began, time.monotonic(),
                                                               piece_grace))
            if waiting and time.monotonic() >= deadline:
                log.info("p2p: %s: no hashes for shares %s; reading them", file.url,
                         sorted(waiting))
                for k in sorted(waiting):  # the lost shares' heir is this node
                    _hash_share(file, key, fd, k, count, piece, pieces, prefix, hashes,
                                held)
                waiting.clear()
            elif waiting:
                time.sleep(POLL)
    finally:
        os.close(fd)
    return b"".join(hashes[p] for p in range(pieces)), held


def _share_tag(key: PeerKey, file: SharedFile, k: int, hashers: int, data: bytes) -> bytes:
    return key.tag("share", file.identity, hashers, k, data)


def _hash_share(file: SharedFile, key: PeerKey, fd: int, k: int, hashers: int, piece: int,
                pieces: int, prefix: str, hashes: dict[int, bytes], held: set[int]) -> None:
    """Read share ``k``'s pieces into the spool, hash them, publish the hashes tagged."""
    from . import torrents

    share = policy.owned(k, hashers, pieces)

    def one(p: int) -> bytes:
        offset = p * piece
        data = file.read_range(offset, min(piece, file.size - offset))
        os.pwrite(fd, data, offset)
        return torrents.piece_hash(data, piece)

    with concurrent.futures.ThreadPoolExecutor(SHARE_READS,
                                               thread_name_prefix="p2p-share") as pool:
        mine = list(pool.map(one, share))
    held.update(share)
    name = f"{prefix}{hashers}-{k}"
    data = b"".join(mine)
    try:
        file.records.put(name, data + _share_tag(key, file, k, hashers, data),
                         overwrite=False)
        hashes.update(zip(share, mine, strict=True))
    except FileExistsError:
        # Another node hashed this share first: the store's record is what every node
        # builds the torrent from (the same bytes: both are tagged with the one key).
        # Gone again by now (a node found it forged and removed the file's records):
        # this node's own hashes, of bytes it read from the store, stand.
        if not _load_share(file, key, name, k, hashers, pieces, hashes):
            hashes.update(zip(share, mine, strict=True))


def _load_share(file: SharedFile, key: PeerKey, name: str, k: int, hashers: int,
                pieces: int, hashes: dict[int, bytes]) -> bool:
    """Share ``k``'s hashes into ``hashes``; False if not published yet,
    :class:`ShareError` if the record is not the job's (size, tag)."""
    share = policy.owned(k, hashers, pieces)
    size = 32 * len(share) + TAG_BYTES
    try:
        data = file.records.get(name, size)
    except FileNotFoundError:
        return False
    except BootseerError as exc:  # larger than the share's hashes
        raise ShareError(f"{name}: {exc}") from exc
    if len(data) != size:
        raise ShareError(f"{name}: {len(data)} bytes, not the {len(share)} hashes of "
                         f"share {k} and their tag")
    body, tag = data[:-TAG_BYTES], data[-TAG_BYTES:]
    if not hmac.compare_digest(tag, _share_tag(key, file, k, hashers, body)):
        raise ShareError(f"{name}: not tagged with the cluster's peer key: not this "
                         f"job's nodes' hashes")
    hashes.update((p, body[32 * i:32 * i + 32]) for i, p in enumerate(share))
    return True

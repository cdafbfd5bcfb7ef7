"""Store objects without a content address (checkpoint files), shared among a job's nodes.

A blob's torrent is built by its publisher, who has its bytes at hand. A checkpoint file
was written by the training job, and nobody has hashed it: whoever builds its torrent
must first read all of it from the store, and a node that waited for that would wait a
whole read longer than a node reading it alone. So the nodes of a job hash it together,
each reading only its own share once:

1. Member ``k`` of the ``N`` members (the swarm's order, :meth:`Swarm.members`) reads the
   pieces it would read from the store in the swarm anyway (``p % N == k``) into a spool
   file, hashes each (:func:`~bootseer.p2p.torrents.piece_hash`) and publishes those
   hashes, create-only, as ``p2p/files/ab/<id>.layers/<N>-<k>``.
2. It waits for the other members' hashes. A member whose hashes have not come when
   ``2 x`` this node's own read plus ``piece_grace`` has passed is taken for gone: this
   node reads and hashes that share too (and publishes it, so others need not).
3. All hashes in order are the piece layer: the torrent (``p2p/files/ab/<id>``,
   :func:`~bootseer.p2p.torrents.build_from_layer`) is the same bytes on every node and
   published create-only; a later restart of the same checkpoint loads it and skips
   steps 1 and 2.
4. The swarm fetches the file; this node's share comes from its spool, not the store.

``<id>`` is the sha256 of the object's URL, size and mtime: a rewritten checkpoint is a
new identity. The hashes are the store's (written by the job's own agents, never taken
from a peer); the swarm checks every piece, the store's included, against them, so a
wrong hash record fails the fetch (and the torrent built from it is removed), it never
lets a wrong byte in.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.errors import BootseerError, IntegrityError
from bootseer.store import Store

from .peer import Peer

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
    """A share's hashes are unusable (wrong length): they are removed, and the object is
    read from the store."""


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


def shared_torrent(swarm: Swarm, file: SharedFile, peers: tuple[Peer, ...], spool: Path,
                   piece_grace: float) -> tuple[Torrent, set[int]] | None:
    """The file's torrent and the pieces this node holds in ``spool`` (read while hashing
    its share; none when the torrent was published already). None if the file is not
    shared (too small, or this node is the job's only member)."""
    from . import torrents

    if file.size < MIN_SHARED_SIZE:
        return None
    try:
        return torrents.load(file.records, file.identity, file.size, addressed=False), set()
    except FileNotFoundError:
        pass
    members = swarm.members(peers)
    if len(members) < 2:
        return None
    piece = torrents.piece_size_for(file.size)
    layer, held = _hash_together(file, members.index(swarm.address), len(members), piece,
                                 spool, piece_grace)
    data = torrents.build_from_layer(file.identity, file.size, piece, layer)
    torrents.publish(file.records, file.identity, data, addressed=False)
    return torrents.load(file.records, file.identity, file.size, addressed=False), held


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


def _hash_together(file: SharedFile, me: int, members: int, piece: int, spool: Path,
                   piece_grace: float) -> tuple[bytes, set[int]]:
    """Steps 1 and 2 of the module docstring: the piece layer, and the pieces read."""
    pieces = -(-file.size // piece)
    prefix = _layers_prefix(file)
    hashes: dict[int, bytes] = {}
    held: set[int] = set()
    fd = os.open(spool, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        began = time.monotonic()
        _hash_share(file, fd, me, members, piece, pieces, prefix, hashes, held)
        deadline = time.monotonic() + 2 * (time.monotonic() - began) + piece_grace
        waiting = set(range(members)) - {me}
        while waiting:
            # One listing per look, not a read per member: N nodes wait at once.
            present = {info.key for info in file.records.list(prefix)}
            for k in sorted(waiting):
                key = f"{prefix}{members}-{k}"
                if key in present and _load_share(file, key, k, members, pieces, hashes):
                    waiting.discard(k)
            if waiting and time.monotonic() >= deadline:
                log.info("p2p: %s: no hashes from members %s; reading their shares",
                         file.url, sorted(waiting))
                for k in sorted(waiting):
                    _hash_share(file, fd, k, members, piece, pieces, prefix, hashes, held)
                waiting.clear()
            elif waiting:
                time.sleep(POLL)
    finally:
        os.close(fd)
    return b"".join(hashes[p] for p in range(pieces)), held


def _hash_share(file: SharedFile, fd: int, k: int, members: int, piece: int, pieces: int,
                prefix: str, hashes: dict[int, bytes], held: set[int]) -> None:
    """Read member ``k``'s pieces into the spool, hash them, publish the hashes."""
    from . import torrents

    share = range(k, pieces, members)

    def one(p: int) -> bytes:
        offset = p * piece
        data = file.read_range(offset, min(piece, file.size - offset))
        os.pwrite(fd, data, offset)
        return torrents.piece_hash(data, piece)

    with concurrent.futures.ThreadPoolExecutor(SHARE_READS,
                                               thread_name_prefix="p2p-share") as pool:
        mine = list(pool.map(one, share))
    held.update(share)
    key = f"{prefix}{members}-{k}"
    try:
        file.records.put(key, b"".join(mine), overwrite=False)
        hashes.update(zip(share, mine, strict=True))
    except FileExistsError:
        # Another node hashed this share first: the store's record is what every node
        # builds the torrent from (the same bytes if it is honest; if not, every node's
        # fetch fails alike, against the store's bytes).
        _load_share(file, key, k, members, pieces, hashes)


def _load_share(file: SharedFile, key: str, k: int, members: int, pieces: int,
                hashes: dict[int, bytes]) -> bool:
    """Member ``k``'s hashes into ``hashes``; False if not published yet."""
    share = range(k, pieces, members)
    try:
        data = file.records.get(key, 32 * len(share))
    except FileNotFoundError:
        return False
    except BootseerError as exc:  # larger than the share's hashes
        raise ShareError(f"{key}: {exc}") from exc
    if len(data) != 32 * len(share):
        raise ShareError(f"{key}: {len(data)} bytes, not the {len(share)} hashes of "
                         f"member {k}'s share")
    hashes.update((p, data[32 * i:32 * i + 32]) for i, p in enumerate(share))
    return True

"""The one call a node makes for a blob: through the job's swarm when it has one, else from
the store, with the same verified bytes either way.

``p2p.enabled = false`` (the default) gives no swarm (:func:`open_swarm` returns None, so
nothing listens and libtorrent is not even loaded) and :func:`fetch_blob` is then the
plain read every node did before: the blob's verified chunks streamed from the store into
the file. With a swarm, a blob that has a published torrent is fetched from peers and the
store (:meth:`bootseer.p2p.swarm.Swarm.fetch`); one without a torrent, with a torrent
that is refused, or whose swarm fetch fails for any reason, is read plainly instead, so
peers can cost time but never a start.

Two kinds of object are fetched so: blobs (:class:`~bootseer.store.BlobStore`, read
chunk-verified) and objects stored whole under a key of their own that ends in their
digest (an image's packs, ``packs/<hex>``: :func:`fetch_object`, hashed whole on a plain
read). A :class:`Fanout` is one warm's way to its job's peers: the node's swarm, the
job's members as every node sees them, the torrents it loaded, what its fetches cost.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bootseer.config import P2PConfig
from bootseer.errors import BootseerError, IntegrityError
from bootseer.limits import check_size
from bootseer.nodecache import NodeCache
from bootseer.store import BlobStore, Store

from .peer import Peer

if TYPE_CHECKING:
    from .sharedfile import SharedFile
    from .swarm import Swarm
    from .torrents import Torrent

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
    if swarm is None:
        return read_plain(blobs, digest, dest)
    return Fanout(swarm, tuple(peers)).fetch_blob(blobs, digest, dest)


def fetch_object(store: Store, key: str, digest: str, dest: Path, *, swarm: Swarm | None,
                 peers: Sequence[Peer] = ()) -> FetchResult:
    """The object at ``key``, whose bytes hash to ``digest``, into ``dest`` (a new file),
    verified against the digest."""
    if swarm is None:
        return read_object(store, key, digest, dest)
    return Fanout(swarm, tuple(peers)).fetch_object(store, key, digest, dest)


@dataclass
class Fanout:
    """One warm's fetches through the node's swarm, from the job's members.

    ``peers`` must be the same list on every node of the job (the swarm splits the store
    reads by position in it). Each fetch's :class:`FetchResult` is kept in ``results``
    (bytes from peers and from the store, for the agent's metrics).
    """

    swarm: Swarm
    peers: tuple[Peer, ...]
    #: Objects not every member fetches (a data-parallel group's checkpoint), by URL:
    #: the members that do (:meth:`among`).
    wanting: dict[str, tuple[Peer, ...]] = field(default_factory=dict)
    results: list[FetchResult] = field(default_factory=list)
    _torrents: dict[str, Torrent | None] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fetch_blob(self, blobs: BlobStore, digest: str, dest: Path) -> FetchResult:
        """Like :func:`fetch_blob`, through this fanout's swarm and peers.

        The swarm's store reads take the blob's bytes as stored, not chunk-verified:
        libtorrent checks every piece against the torrent's hashes, and a verified read
        fetches each whole enclosing chunk (1 MiB), so a node's share of a blob with
        smaller pieces would read every chunk, as if it had no peers.
        """
        key = blobs.blob_key(digest)
        size = blobs.stat(digest).size
        result = self._through_swarm(blobs.store, digest, size, dest,
                                     lambda offset, n: blobs.store.read_range(key, offset, n))
        return self._kept(result or read_plain(blobs, digest, dest))

    def cache_blob(self, blobs: BlobStore, digest: str, cache: NodeCache, *,
                   max_size: int | None = None) -> FetchResult | None:
        """Blob ``digest`` into ``cache`` through the swarm (into a temporary of the cache,
        checked against the digest, then made an entry), then seeded from there; None if
        the cache had it already (seeded all the same: the job's later nodes may need it).
        ``max_size`` refuses a larger blob before any of it is read. Shards, manifests and
        hot lists come this way, so that each leaves the store about once per job."""
        hexd = digest.removeprefix("sha256:")
        result = None
        if hexd not in cache:
            if max_size is not None:
                check_size(blobs.stat(digest).size, max_size, f"blob {digest}")
            tmp = cache.new_temporary(hexd)  # a crash leaves it to the next sweep
            try:
                result = self.fetch_blob(blobs, digest, tmp)
                os.chmod(tmp, cache.mode)
                cache.add_file(tmp, hexd)
            finally:
                tmp.unlink(missing_ok=True)
        path = cache.path(hexd)
        if path.is_file():
            self.seed(blobs.store, digest, path)
        return result

    def fetch_object(self, store: Store, key: str, digest: str, dest: Path) -> FetchResult:
        """Like :func:`fetch_object`, through this fanout's swarm and peers."""
        size = store.stat(key).size
        result = self._through_swarm(store, digest, size, dest,
                                     lambda offset, n: store.read_range(key, offset, n))
        return self._kept(result or read_object(store, key, digest, dest))

    def among(self, url: str) -> Fanout:
        """This fanout for ``url``, fetched by the members that want it (all, if the
        records did not say), counting into the same results."""
        peers = self.wanting.get(url, self.peers)
        if peers == self.peers:
            return self
        return Fanout(self.swarm, peers, {}, self.results, self._torrents, self._lock)

    def fetch_file(self, file: SharedFile, dest: Path, spool: Path) -> FetchResult | None:
        """A store object with no digest known (a checkpoint file) into ``dest`` through
        the swarm, its torrent built by the job's members together if none is published
        yet (:mod:`bootseer.p2p.sharedfile`; ``spool``, a path of the caller's that it
        removes, holds this node's share meanwhile). Every piece is checked against that
        torrent. None when the file is not shared (too small, no other member) or the
        swarm failed: then read it from the store."""
        from . import sharedfile

        try:
            found = sharedfile.shared_torrent(self.swarm, file, self.peers, spool,
                                              self.swarm.config.piece_grace)
            if found is None:
                return None
            torrent, held = found
            with self._lock:
                self._torrents[torrent.digest] = torrent
            reader = sharedfile.spool_reader(file, spool, held, torrent.piece_size)
            return self._kept(self.swarm.fetch(torrent, dest, self.peers, reader))
        except IntegrityError as exc:  # the store's bytes fail the torrent: it is wrong
            log.warning("p2p: %s: %s; its torrent is removed, reading it from the store",
                        file.url, exc)
            sharedfile.forget(file)
        except BootseerError as exc:
            log.warning("p2p: %s: %s; reading it from the store", file.url, exc)
        dest.unlink(missing_ok=True)
        return None

    def seed_file(self, file: SharedFile, path: Path) -> bool:
        """Offer ``path``, a verified copy of ``file`` fetched by :meth:`fetch_file`, to the
        job's peers (see :meth:`seed`)."""
        with self._lock:
            torrent = self._torrents.get(file.identity)
        return torrent is not None and self.swarm.seed(torrent, path, self.peers)

    def shares(self, store: Store, digest: str, size: int) -> bool:
        """Whether object ``digest`` has a usable torrent: without one, a fetch through
        this fanout is a plain read of the whole object."""
        try:
            return self._torrent(store, digest, size) is not None
        except BootseerError as exc:
            log.warning("p2p: %s: %s", digest, exc)
            return False

    def seed(self, store: Store, digest: str, path: Path) -> bool:
        """Offer ``path`` (a verified cache entry of ``digest``) to the job's peers; False
        if the object has no usable torrent or is seeded already. The swarm stops when
        its seed time is up or the file is gone (evicted)."""
        try:
            torrent = self._torrent(store, digest, path.stat().st_size)
        except FileNotFoundError:
            return False
        except BootseerError as exc:
            log.warning("p2p: not seeding %s: %s", digest, exc)
            return False
        return torrent is not None and self.swarm.seed(torrent, path, self.peers)

    def _through_swarm(self, store: Store, digest: str, size: int, dest: Path,
                       read_range: Callable[[int, int], bytes]) -> FetchResult | None:
        """The swarm's fetch, or None when it cannot be used (then read plainly)."""
        try:
            torrent = self._torrent(store, digest, size)
            if torrent is None:
                log.debug("p2p: %s has no torrent; reading it from the store", digest)
                return None
            return self.swarm.fetch(torrent, dest, self.peers, read_range)
        except BootseerError as exc:
            log.warning("p2p: %s: %s; reading it from the store", digest, exc)
            return None

    def _torrent(self, store: Store, digest: str, size: int) -> Torrent | None:
        """The object's checked torrent (None if none is published), loaded once."""
        with self._lock:
            if digest in self._torrents:
                return self._torrents[digest]
        from . import torrents

        try:
            torrent: Torrent | None = torrents.load(store, digest, size)
        except FileNotFoundError:
            torrent = None
        with self._lock:
            return self._torrents.setdefault(digest, torrent)

    def _kept(self, result: FetchResult) -> FetchResult:
        with self._lock:
            self.results.append(result)
        return result


def read_plain(blobs: BlobStore, digest: str, dest: Path) -> FetchResult:
    """The blob's verified chunks from the store into ``dest`` (removed on failure)."""
    return _write(dest, digest, blobs.iter_chunks(digest), check=False)


def read_object(store: Store, key: str, digest: str, dest: Path) -> FetchResult:
    """The object at ``key`` from the store into ``dest``, hashed while written and
    checked against ``digest`` at the end (:class:`IntegrityError`; ``dest`` removed)."""
    return _write(dest, digest, store.iter_chunks(key), check=True)


def _write(dest: Path, digest: str, chunks: Iterable[bytes], *, check: bool) -> FetchResult:
    """``chunks`` into the new file ``dest``; with ``check``, hashed against ``digest``
    (a blob's chunks come verified, its whole digest checked after the last)."""
    began = time.monotonic()
    size = 0
    sha = hashlib.sha256()
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        with open(fd, "wb") as f:
            for chunk in chunks:
                if check:
                    sha.update(chunk)
                f.write(chunk)
                size += len(chunk)
        if check and "sha256:" + sha.hexdigest() != digest:
            raise IntegrityError(f"the object read for {digest} does not match it")
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return FetchResult(digest, size, size, 0, 0, (), time.monotonic() - began)

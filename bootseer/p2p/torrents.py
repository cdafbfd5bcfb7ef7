"""BitTorrent v2 metadata for a blob, derived from its content address and kept in the store.

Peers are untrusted, so what a node checks their pieces against must come from where the
blob does: the store. A blob ``sha256:<hex>`` of ``size`` bytes gets one torrent, built
from its bytes by libtorrent (v2 only: SHA-256 merkle trees, no SHA-1) and published
create-only beside it::

    p2p/torrents/sha256/ab/<hex>      one file named <hex>, <size> bytes, piece layer included

A store object that has no content address (a checkpoint file, named by its URL, size
and mtime: :mod:`bootseer.p2p.sharedfile`) gets its torrent under ``p2p/files/ab/<id>``
instead, named by that identity; only its merkle root vouches for its bytes (every piece
is checked against it), since no whole-file digest is known before it is read.

Loading one is reading hostile input (anyone who can write the store can write it), so
:func:`load` checks, before libtorrent sees it, that it is no larger than its piece count
allows, and then that it is v2 only, holds exactly one file named ``<hex>`` of exactly
``size`` bytes, that its piece size and count are within :mod:`bootseer.limits`, and that
its piece layer hashes up to the file's merkle root. Metadata is never taken from peers:
no magnet links, no metadata exchange; a node without the torrent reads the store.

A torrent ties pieces to a merkle root, not to the blob's sha256, so a torrent that lies
about its blob (wrong bytes hashed) cannot be caught here: its pieces then fail against
the store's own bytes, and the swarm's final check of the whole file against the digest
refuses the result (:class:`bootseer.errors.IntegrityError`). It can cost a fetch, never
a wrong byte. :func:`build` checks the file against the digest before it publishes, so an
honest node never publishes such a torrent.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import libtorrent as lt

from bootseer.errors import BootseerError, IntegrityError
from bootseer.limits import (
    TORRENT_MAX_PIECE,
    TORRENT_MAX_PIECES,
    TORRENT_MIN_PIECE,
    check_size,
    torrent_bytes_limit,
)
from bootseer.store import Store

from .trust import Trust

log = logging.getLogger(__name__)

PREFIX = "p2p/torrents/sha256"
FILES_PREFIX = "p2p/files"
#: The piece size a large blob gets: large enough that a piece's request and hash cost
#: little per byte, small enough that N nodes each have a share to start from.
TARGET_PIECE = 1 << 20
#: The piece size of objects read by ranges (an image's packs, read a run of blocks at a
#: time): a demand read fetches whole pieces, so every byte of a piece beyond the read
#: is waited for. Measured (bench-p2p-read, 2 MiB reads over a 25 MB/s link): 256 KiB
#: pieces 1.15x an idle store's read, 64 KiB 1.03x; a whole pack fetched through the
#: swarm (warm --all) takes ~15% longer with 64 KiB (more, smaller store reads).
DEMAND_PIECE = 64 << 10
#: Smaller blobs get smaller pieces, down to TORRENT_MIN_PIECE, so that they still have
#: this many pieces to spread over the nodes that fetch them.
MIN_PIECES = 16
BLOCK = 16 << 10  # BitTorrent v2's merkle leaf


class TorrentError(BootseerError):
    """A torrent in the store is malformed or does not describe the blob it is filed
    under; it is refused, and the blob is read from the store instead."""


@dataclass(frozen=True)
class Torrent:
    """A blob's torrent, checked: what the swarm adds to its session."""

    digest: str  # "sha256:<hex>"
    size: int
    piece_size: int
    num_pieces: int
    data: bytes = field(repr=False)  # the bencoded torrent, as published
    info: lt.torrent_info = field(repr=False, compare=False)
    #: True: ``digest`` is the sha256 of the content (a blob), checked once fetched.
    #: False: it names a store object's identity (``p2p/files``), and the merkle root,
    #: against which every piece is checked, is all that vouches for the bytes.
    addressed: bool = True
    #: The piece hashes (32 bytes each, in order); empty for a one-piece object.
    layer: bytes = field(default=b"", repr=False)

    def piece_digest(self, piece: int) -> bytes:
        """The torrent's hash of ``piece`` (:func:`piece_hash`)."""
        return self.layer[32 * piece:32 * piece + 32]

    @property
    def hex(self) -> str:
        return self.digest[7:]

    def piece_range(self, piece: int) -> tuple[int, int]:
        """(offset, length) of ``piece`` in the blob."""
        offset = piece * self.piece_size
        return offset, min(self.piece_size, self.size - offset)

    def keyed(self, trust: Trust) -> lt.torrent_info:
        """This torrent as the cluster's swarms hold it: its info dictionary with the
        key's tag of its info-hash (:meth:`Trust.swarm_tag`), so that only key holders
        can name it in a handshake, and private (BEP 27), so that libtorrent attaches
        neither peer exchange nor metadata exchange to it: peers are the job's members,
        dialed. The pieces, hence every check, are this torrent's."""
        decoded = lt.bdecode(self.data)
        public = self.info.info_hashes().v2.to_bytes()
        decoded[b"info"][b"bootseer auth"] = trust.swarm_tag(public)
        decoded[b"info"][b"private"] = 1
        return lt.torrent_info(lt.bencode(decoded))


def key(digest: str, *, addressed: bool = True) -> str:
    """Where the torrent of ``digest`` is published: a blob's under ``p2p/torrents``, an
    identity's (``addressed=False``) under ``p2p/files``."""
    hexd = _hex(digest)
    return f"{PREFIX if addressed else FILES_PREFIX}/{hexd[:2]}/{hexd}"


def piece_size_for(size: int, target: int = TARGET_PIECE) -> int:
    """The piece size of a blob of ``size`` bytes: ``target``, halved (not below 16 KiB)
    while the blob would have fewer than MIN_PIECES pieces, doubled while it would have
    more than TORRENT_MAX_PIECES; :class:`TorrentError` beyond TORRENT_MAX_PIECE."""
    piece = target
    while piece > TORRENT_MIN_PIECE and size < piece * MIN_PIECES:
        piece //= 2
    while -(-size // piece) > TORRENT_MAX_PIECES:
        piece *= 2
    if piece > TORRENT_MAX_PIECE:
        raise TorrentError(f"a blob of {size} bytes needs pieces over {TORRENT_MAX_PIECE} "
                           f"bytes; it is not shared between peers")
    return piece


def build(digest: str, size: int, path: Path, piece: int | None = None) -> bytes:
    """The bencoded v2 torrent of the blob whose bytes are the file ``path``.

    The file is checked against ``digest`` (and ``size``) first: a torrent is published
    create-only, so one built from the wrong bytes would stay. libtorrent hashes the
    file under the name ``<hex>``; a file named otherwise is reached through a symlink.
    """
    hexd = _hex(digest)
    if size <= 0:
        raise TorrentError(f"blob {digest} is empty: nothing to share")
    if path.stat().st_size != size:
        raise IntegrityError(f"{path} is {path.stat().st_size} bytes, not the {size} of "
                             f"blob {digest}")
    _check_file_digest(path, digest)
    piece = piece or piece_size_for(size)
    with tempfile.TemporaryDirectory(prefix="bootseer-torrent-") as tmp:
        root = path.parent
        if path.name != hexd:
            root = Path(tmp)
            os.symlink(path.resolve(), root / hexd)
        ct = lt.create_torrent([lt.create_file_entry(hexd, size)], piece,
                               lt.create_torrent.v2_only)
        ct.set_creation_date(0)  # the same blob gives the same bytes on every node
        lt.set_piece_hashes(ct, str(root))
        return lt.bencode(ct.generate())


def piece_hash(data: bytes | memoryview, piece_size: int) -> bytes:
    """The v2 piece-layer hash of one piece (BEP 52): the merkle root of its 16 KiB
    blocks' SHA-256, the last block possibly short, padded with zero leaves to
    ``piece_size`` (the last piece of a file is hashed as if it were whole)."""
    leaves = [hashlib.sha256(data[i:i + BLOCK]).digest() for i in range(0, len(data), BLOCK)]
    return _subtree(leaves, piece_size // BLOCK)


def _subtree(leaves: list[bytes], width: int) -> bytes:
    """The merkle root over ``leaves`` padded with zero leaves to ``width`` (a power of 2)."""
    nodes = leaves + [bytes(32)] * (width - len(leaves))
    while len(nodes) > 1:
        nodes = [hashlib.sha256(nodes[i] + nodes[i + 1]).digest()
                 for i in range(0, len(nodes), 2)]
    return nodes[0]


class LeafHasher:
    """An object's 16 KiB leaf hashes, taken as it is written (a pack streamed to the
    store): its torrent is built once its size, hence its piece size, is known, without
    reading it again. 32 bytes per 16 KiB are kept."""

    def __init__(self) -> None:
        self._leaves: list[bytes] = []
        self._tail = bytearray()
        self.size = 0

    def update(self, data: bytes | memoryview) -> None:
        self.size += len(data)
        view = memoryview(data)
        if self._tail:
            take = min(BLOCK - len(self._tail), len(view))
            self._tail += view[:take]
            view = view[take:]
            if len(self._tail) < BLOCK:
                return
            self._leaves.append(hashlib.sha256(self._tail).digest())
            self._tail.clear()
        whole = len(view) - len(view) % BLOCK
        self._leaves += [hashlib.sha256(view[i:i + BLOCK]).digest()
                         for i in range(0, whole, BLOCK)]
        self._tail += view[whole:]

    def layer(self, piece_size: int) -> bytes:
        """The piece hashes at ``piece_size``, in order (:func:`piece_hash` of each)."""
        leaves = self._leaves + ([hashlib.sha256(self._tail).digest()] if self._tail else [])
        width = piece_size // BLOCK
        return b"".join(_subtree(leaves[i:i + width], width)
                        for i in range(0, len(leaves), width))


def build_from_layer(digest: str, size: int, piece_size: int, layer: bytes) -> bytes:
    """The bencoded v2 torrent of a file named after ``digest`` whose piece hashes
    (:func:`piece_hash`, in order) are ``layer``: the same bytes :func:`build` makes from
    the file, for a file whose pieces were hashed where they were read (on several
    nodes) rather than in one place. At least two pieces: a one-piece file's root is not
    a piece hash."""
    hexd = _hex(digest)
    pieces = -(-size // piece_size)
    if pieces < 2 or len(layer) != 32 * pieces:
        raise TorrentError(f"{digest}: {len(layer) // 32} piece hashes for {pieces} pieces "
                           f"(at least 2) of {piece_size} bytes")
    root = _layer_root(layer, piece_size)
    name = hexd.encode()
    return lt.bencode({
        b"info": {b"file tree": {name: {b"": {b"length": size, b"pieces root": root}}},
                  b"meta version": 2, b"name": name, b"piece length": piece_size},
        b"piece layers": {root: layer},
    })


#: A torrent's top-level key for a tag of Bootseer's (:mod:`bootseer.p2p.sharedfile`):
#: outside the info dictionary, so the info-hash and every piece check stay the torrent's.
TAG_KEY = b"bootseer tag"


def with_tag(data: bytes, tag: bytes) -> bytes:
    """The bencoded torrent ``data`` carrying ``tag``."""
    decoded = lt.bdecode(data)
    decoded[TAG_KEY] = tag
    return lt.bencode(decoded)


def tag_of(data: bytes) -> bytes | None:
    """The tag a (checked) torrent carries, None if none."""
    tag = lt.bdecode(data).get(TAG_KEY)
    return tag if isinstance(tag, bytes) else None


def publish(store: Store, digest: str, data: bytes, *, addressed: bool = True) -> bool:
    """Put a torrent beside its blob, create-only; False if one was there already (two
    nodes building the same blob's torrent build the same info dictionary)."""
    try:
        store.put(key(digest, addressed=addressed), data, overwrite=False)
    except FileExistsError:
        return False
    return True


def load(store: Store, digest: str, size: int, *, addressed: bool = True) -> Torrent:
    """The checked torrent of blob ``digest`` (``size`` bytes, as the caller knows from
    the store); ``FileNotFoundError`` if none was published, :class:`TorrentError` if the
    one published is malformed or describes anything but this blob."""
    max_pieces = min(TORRENT_MAX_PIECES, -(-size // TORRENT_MIN_PIECE))
    try:
        data = store.get(key(digest, addressed=addressed), torrent_bytes_limit(max_pieces))
    except IntegrityError as exc:  # SizeLimitError: larger than the blob's pieces allow
        raise TorrentError(f"torrent of {digest}: {exc}") from exc
    return parse(digest, size, data, addressed=addressed)


def parse(digest: str, size: int, data: bytes, *, addressed: bool = True) -> Torrent:
    """Check ``data`` as the torrent of blob ``digest`` of ``size`` bytes (see the module
    docstring for what is checked)."""
    hexd = _hex(digest)
    what = f"torrent of {digest}"
    check_size(len(data), torrent_bytes_limit(-(-size // TORRENT_MIN_PIECE)), what)
    try:
        decoded = lt.bdecode(data)  # bounded: a depth and token limit of its own
    except RuntimeError as exc:
        raise TorrentError(f"{what} is not bencoded: {exc}") from exc
    if not isinstance(decoded, dict):
        raise TorrentError(f"{what} is not a bencoded dictionary")
    info = decoded.get(b"info")
    if not isinstance(info, dict):
        raise TorrentError(f"{what} has no info dictionary")
    if info.get(b"meta version") != 2 or b"file tree" not in info:
        raise TorrentError(f"{what} is not a BitTorrent v2 torrent")
    if b"pieces" in info or b"files" in info or b"length" in info:
        raise TorrentError(f"{what} is a hybrid (v1 and v2) torrent; only v2 is accepted")
    if info.get(b"name") != hexd.encode():
        raise TorrentError(f"{what} is named {info.get(b'name')!r}, not {hexd!r}")
    piece = info.get(b"piece length")
    if not isinstance(piece, int) or piece & (piece - 1) or \
            not TORRENT_MIN_PIECE <= piece <= TORRENT_MAX_PIECE:
        raise TorrentError(f"{what}: piece length {piece!r} is not a power of two in "
                           f"{TORRENT_MIN_PIECE}-{TORRENT_MAX_PIECE}")
    pieces = -(-size // piece)
    if pieces > TORRENT_MAX_PIECES:
        raise TorrentError(f"{what} has {pieces} pieces, over {TORRENT_MAX_PIECES}")
    tree = info[b"file tree"]
    entry = tree.get(hexd.encode()) if isinstance(tree, dict) and len(tree) == 1 else None
    leaf = entry.get(b"") if isinstance(entry, dict) and len(entry) == 1 else None
    if not isinstance(leaf, dict):
        raise TorrentError(f"{what} does not hold exactly one file named {hexd}")
    if leaf.get(b"length") != size:
        raise TorrentError(f"{what} says the blob is {leaf.get(b'length')!r} bytes, not "
                           f"{size}")
    root = leaf.get(b"pieces root")
    if not isinstance(root, bytes) or len(root) != 32:
        raise TorrentError(f"{what} has no merkle root for its file")
    layers = decoded.get(b"piece layers")
    layer = b""
    if pieces > 1:
        layer = layers.get(root) if isinstance(layers, dict) and len(layers) == 1 else None
        if not isinstance(layer, bytes) or len(layer) != 32 * pieces:
            raise TorrentError(f"{what} does not carry the {pieces} piece hashes of its "
                               f"file")
        if _layer_root(layer, piece) != root:
            raise TorrentError(f"{what}: its piece hashes do not match its merkle root")
    elif layers:
        raise TorrentError(f"{what}: a one-piece file has no piece layer")
    try:
        ti = lt.torrent_info(data, {"max_pieces": TORRENT_MAX_PIECES,
                                    "max_buffer_size": len(data)})
    except RuntimeError as exc:
        raise TorrentError(f"{what} is refused by libtorrent: {exc}") from exc
    hashes = ti.info_hashes()
    files = ti.layout()
    # libtorrent pads a v2 file that ends inside a piece with a pad file of its own
    # (never on disk, never in the torrent's bytes): one file, or that file and its pad.
    padded = files.num_files() == 2 and files.file_flags(1) & files.flag_pad_file and \
        files.file_size(1) == pieces * piece - size
    if hashes.has_v1() or not hashes.has_v2() or (files.num_files() != 1 and not padded) \
            or files.file_size(0) != size or ti.num_pieces() != pieces or \
            ti.piece_length() != piece:
        raise TorrentError(f"{what} is not read by libtorrent as checked")
    return Torrent(digest, size, piece, pieces, data, ti, addressed, layer)


def _layer_root(layer: bytes, piece: int) -> bytes:
    """The merkle root over a piece layer (BEP 52): pieces beyond the file's end are the
    hash of a piece of zero-hash leaves, and the layer is padded to a power of two."""
    pad = bytes(32)
    for _ in range((piece // BLOCK).bit_length() - 1):
        pad = hashlib.sha256(pad + pad).digest()
    nodes = [layer[i:i + 32] for i in range(0, len(layer), 32)]
    while len(nodes) > 1:
        if len(nodes) % 2:
            nodes.append(pad)
        nodes = [hashlib.sha256(nodes[i] + nodes[i + 1]).digest()
                 for i in range(0, len(nodes), 2)]
        pad = hashlib.sha256(pad + pad).digest()
    return nodes[0]


def file_digest(path: Path) -> str:
    """The ``sha256:`` digest of the file at ``path``, read in 4 MiB chunks."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            sha.update(chunk)
    return "sha256:" + sha.hexdigest()


def _check_file_digest(path: Path, digest: str) -> None:
    if file_digest(path) != digest:
        raise IntegrityError(f"{path} does not match {digest}; no torrent is built from it")


def _hex(digest: str) -> str:
    hexd = digest[7:] if digest.startswith("sha256:") else ""
    if len(hexd) != 64 or any(c not in "0123456789abcdef" for c in hexd):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return hexd

"""Bounded reads of store data: every size is checked against its format's limit first.

Whoever can write to the store can write anything, so a manifest, a hot list or a ref is
hostile input to the node processes that read it, several of which run as root. A small
object must not make them allocate without bound: a zstd frame a few KB long can expand
to gigabytes, and a "small" object can simply be large. Each format therefore has a
limit of its own (the constants next to its encoder), and every read here checks it
*before* allocating:

* a torrent (``bootseer/p2p/torrents.py``, BitTorrent v2 metadata for a blob) is refused
  before it is parsed if it is larger than its piece count allows, and after parsing if its
  pieces are outside the bounds below (so a hostile one cannot make a node hash, or hold
  a bitfield of, billions of pieces);
* :func:`decompress` accepts only zstd frames that declare their content size (Bootseer's
  writers always do), refuses a declared size over the limit, and decompresses into
  exactly that many bytes; a frame that holds more than it declares is an error from zstd.
"""

from __future__ import annotations

import zstandard

from bootseer.errors import IntegrityError, SizeLimitError

#: Smallest piece of a torrent: BitTorrent v2 hashes 16 KiB blocks, and a piece holds
#: whole blocks.
TORRENT_MIN_PIECE = 16 << 10
#: Largest piece: one piece is read from the store, held and hashed at once.
TORRENT_MAX_PIECE = 64 << 20
#: Most pieces in one torrent: 64 Ki pieces of 1 MiB cover 64 GiB, with larger pieces
#: up to 4 TiB; the piece hashes (32 bytes each) then take at most 2 MiB.
TORRENT_MAX_PIECES = 1 << 16
#: A torrent is its piece hashes plus an info dictionary of a few hundred bytes.
TORRENT_OVERHEAD = 4 << 10


def torrent_bytes_limit(pieces: int) -> int:
    """The most bytes a torrent of ``pieces`` pieces may take."""
    return 32 * min(pieces, TORRENT_MAX_PIECES) + TORRENT_OVERHEAD


def check_size(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise SizeLimitError(f"{what} is {size} bytes, over the {limit} bytes its format "
                             f"allows; refusing to read it (the store holds hostile or "
                             f"corrupt data)")


def decompress(data: bytes, limit: int, what: str) -> bytes:
    """The content of the zstd frame ``data``, at most ``limit`` bytes."""
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"{what} is not a zstd frame: {exc}") from exc
    if size < 0:
        raise IntegrityError(f"{what} does not declare its size (Bootseer's writers always "
                             f"do); refusing to decompress it")
    check_size(size, limit, what)
    try:
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"{what} does not decompress: {exc}") from exc
    if len(out) != size:
        raise IntegrityError(f"{what} decompresses to {len(out)} bytes, not the {size} it "
                             f"declares")
    return out

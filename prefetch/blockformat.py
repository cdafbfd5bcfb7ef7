"""The lazy image format: a metadata index of the merged rootfs, and content in blocks.

An image converted by Bootseer is three kinds of store objects:

* **blocks** — every regular file's content cut into ``block_size`` pieces (2 MiB by
  default), each compressed with zstd and identified by the sha256 of its *uncompressed*
  bytes, so identical blocks (across layers, files and images) are stored once;
* **packs** — blocks are appended to pack objects (``packs/<sha256 of the pack>``, up to
  ``pack_target`` bytes each) in the order the converter meets them, so a file's blocks,
  and the files of a directory, sit next to each other and a run of neighbouring blocks
  is one ranged read;
* **the image manifest** — one blob (zstd-compressed JSON, format version
  :data:`FORMAT`): the image config, every path of the merged rootfs with its metadata
  and its list of blocks, and the block table (digest → pack, offset, lengths). Its blob
  digest is the image id; the ref ``images/<name>`` names it.

A reader needs only the manifest to list and stat everything, and one ranged read per run
of blocks to read content. Every block is checked against its digest after decompression.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any

import zstandard

from bootseer.errors import BootseerError
from bootseer.limits import decompress
from bootseer.prefetch.rootfs import Kind

FORMAT = "bootseer-image/1"
#: Chosen by ``make bench-blocksize`` (Debian + python3, a ``python3 -c`` start): from 256 KiB
#: to 4 MiB the start fetched the same bytes (its files are mostly smaller than a block)
#: while reads fell from 56 to 38, flat from 2 MiB on. The smaller of the flat sizes keeps
#: the over-fetch of random reads inside large files (shared libraries) lower.
DEFAULT_BLOCK_SIZE = 2 << 20
DEFAULT_PACK_TARGET = 64 << 20
#: Limits of the format, checked before anything is allocated (the store's bytes are
#: hostile input): a block's size, and the decompressed manifest's. A 100,000-file image
#: has a manifest of 20-40 MB; 1 GiB leaves room for millions of files.
MAX_BLOCK_SIZE = 64 << 20
MAX_MANIFEST_BYTES = 1 << 30
_HEX = re.compile(r"[0-9a-f]{64}")
PACK_PREFIX = "packs/"
IMAGE_REF_PREFIX = "images/"


class ImageManifestError(BootseerError):
    """An image manifest is malformed or of an unknown format version."""


@dataclass(frozen=True)
class BlockLocation:
    """Where one block lives: ``length`` compressed bytes at ``offset`` of pack ``pack``."""

    digest: str  # sha256 hex of the uncompressed block
    pack: int  # index into Manifest.packs
    offset: int
    length: int  # compressed
    size: int  # uncompressed


@dataclass(frozen=True)
class FileEntry:
    """One path of the merged rootfs, as the lazy mount serves it."""

    path: str
    kind: Kind
    mode: int
    uid: int
    gid: int
    size: int
    mtime: float
    link_target: str | None
    xattrs: dict[str, bytes]
    devmajor: int
    devminor: int
    ino: int
    nlink: int
    blocks: tuple[int, ...] = ()  # indexes into Manifest.blocks, in file order


@dataclass
class Manifest:
    """Everything a node needs to serve an image lazily."""

    block_size: int
    config: dict[str, Any]
    source: dict[str, Any]
    entries: list[FileEntry]
    blocks: list[BlockLocation]
    packs: list[str]  # store keys of the packs
    by_path: dict[str, FileEntry] = field(init=False, repr=False)
    children: dict[str, list[str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.by_path = {e.path: e for e in self.entries}
        self.children = {}
        for entry in self.entries:
            if entry.path != "/":
                parent, _, name = entry.path.rpartition("/")
                self.children.setdefault(parent or "/", []).append(name)

    @property
    def content_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind == Kind.FILE)

    def encode(self) -> bytes:
        body = {
            "format": FORMAT,
            "block_size": self.block_size,
            "config": self.config,
            "source": self.source,
            "packs": self.packs,
            "blocks": [[b.digest, b.pack, b.offset, b.length, b.size] for b in self.blocks],
            "entries": [
                [e.path, e.kind.value, e.mode, e.uid, e.gid, e.size, e.mtime, e.link_target,
                 {k: base64.b64encode(v).decode() for k, v in e.xattrs.items()},
                 e.devmajor, e.devminor, e.ino, e.nlink, list(e.blocks)]
                for e in self.entries
            ],
        }
        raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        return zstandard.ZstdCompressor(level=10).compress(raw)

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        try:
            body = json.loads(decompress(data, MAX_MANIFEST_BYTES, "an image manifest"))
        except BootseerError as exc:
            raise ImageManifestError(str(exc)) from exc
        except ValueError as exc:
            raise ImageManifestError(f"image manifest is not valid: {exc}") from exc
        if not isinstance(body, dict):
            raise ImageManifestError("image manifest is not a JSON object")
        if body.get("format") != FORMAT:
            raise ImageManifestError(f"image manifest format {body.get('format')!r} is not "
                                     f"supported (this Bootseer reads {FORMAT})")
        try:
            block_size = body["block_size"]
            if not isinstance(block_size, int) or not 0 < block_size <= MAX_BLOCK_SIZE:
                raise ValueError(f"block size {block_size!r} is not in 1..{MAX_BLOCK_SIZE}")
            blocks = [BlockLocation(*b) for b in body["blocks"]]
            packs = body["packs"]
            for b in blocks:  # a block's size bounds what decompressing it may allocate
                if not (0 <= b.size <= block_size and 0 <= b.pack < len(packs)
                        and b.offset >= 0 and b.length >= 0 and _HEX.fullmatch(b.digest)):
                    raise ValueError(f"block {b.digest} has an impossible location or size")
            kinds = {k.value: k for k in Kind}  # a dict lookup: Kind(k) is slow x 100,000
            no_xattrs: dict[str, bytes] = {}  # shared: entries are never modified
            entries = [
                FileEntry(p, kinds[k], mode, uid, gid, size, mtime, link,
                          {n: base64.b64decode(v) for n, v in xattrs.items()} if xattrs
                          else no_xattrs, major, minor, ino, nlink, tuple(blist))
                for p, k, mode, uid, gid, size, mtime, link, xattrs, major, minor, ino, nlink,
                blist in body["entries"]
            ]
            return cls(block_size, body["config"], body["source"], entries, blocks, packs)
        except (KeyError, TypeError, ValueError) as exc:
            raise ImageManifestError(f"image manifest is malformed: {exc}") from exc

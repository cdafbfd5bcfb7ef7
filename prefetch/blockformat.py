"""The lazy image format: a metadata index of the merged rootfs, and content in blocks.

An image converted by Bootseer is three kinds of store objects:

* **blocks** — every regular file's content cut into ``block_size`` pieces (2 MiB by
  default), each compressed with zstd and identified by the sha256 of its *uncompressed*
  bytes, so identical blocks (across layers, files and images) are stored once;
* **packs** — blocks are appended to pack objects (``packs/<sha256 of the pack>``, up to
  ``pack_target`` bytes each) in the order the converter meets them, so a file's blocks,
  and the files of a directory, sit next to each other and a run of neighbouring blocks
  is one ranged read;
* **the image manifest** — one zstd-compressed blob (format version :data:`FORMAT`): the
  image config, every path of the merged rootfs with its metadata and its list of blocks,
  and the block table (digest → pack, offset, lengths). Its blob digest is the image id;
  the ref ``images/<name>`` names it.

A reader needs only the manifest to list and stat everything, and one ranged read per run
of blocks to read content. Every block is checked against its digest after decompression.

Format 2 stores the manifest as binary columns, one per field, that a mount decodes with
whole-array operations and turns into entries only as they are asked for: decoding format
1 (JSON, one list per entry) cost a mount 0.3 s for a 30,000-file image before it served
anything. Format 1 manifests are still read; the converter writes format 2.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import sys
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import zstandard

from bootseer import boundedjson
from bootseer.errors import BootseerError
from bootseer.limits import decompress
from bootseer.prefetch.rootfs import Kind

T = TypeVar("T")

FORMAT = "bootseer-image/2"
FORMAT_V1 = "bootseer-image/1"
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


def pack_digest(key: str) -> str | None:
    """The ``sha256:<hex>`` a pack's store key (``packs/<hex>``) names it by; None if
    ``key`` is not a pack's. Asked by those below prefetch that must tell packs apart
    (peer-to-peer demand reads), so that the key layout is written only here."""
    hexd = key.removeprefix(PACK_PREFIX)
    return "sha256:" + hexd if hexd != key and _HEX.fullmatch(hexd) else None


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
    """Everything a node needs to serve an image lazily.

    Built by the converter from lists; decoded from a format-2 blob, ``entries`` and
    ``blocks`` are tables that build an entry or a block location only when it is first
    asked for, so a mount's cost before it serves does not grow with the image's file
    count beyond one index of its paths."""

    block_size: int
    config: dict[str, Any]
    source: dict[str, Any]
    entries: Sequence[FileEntry]
    blocks: Sequence[BlockLocation]
    packs: list[str]  # store keys of the packs
    #: path → index into ``entries``; built from ``entries`` when not given
    paths: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.paths:
            self.paths = {e.path: i for i, e in enumerate(self.entries)}
        self.by_path = _ByPath(self.entries, self.paths)

    @functools.cached_property
    def block_index(self) -> dict[str, int]:
        """Block digest → the first index of a block with it (built on first use, from the
        table's raw digests when decoded: a mount's hot list and prefetch plan look up a
        few thousand digests, and building every location of a large image to find them
        cost more than the lookups)."""
        if isinstance(self.blocks, BlockTable):
            return self.blocks.digest_index()
        index: dict[str, int] = {}
        for i, block in enumerate(self.blocks):
            index.setdefault(block.digest, i)
        return index

    @functools.cached_property
    def children(self) -> dict[str, list[str]]:
        """Directory path → the names in it, in manifest order (built on first use: a
        start lists few directories, if any)."""
        children: dict[str, list[str]] = {}
        for path in self.paths:
            if path != "/":
                parent, _, name = path.rpartition("/")
                children.setdefault(parent or "/", []).append(name)
        return children

    def node_indexes(self) -> dict[int, int]:
        """Inode number → index of the entry that stands for it (a hard link group's is
        its first path, of kind FILE)."""
        if isinstance(self.entries, EntryTable):
            return self.entries.node_indexes()
        return {e.ino: i for i, e in enumerate(self.entries) if e.kind is not Kind.HARDLINK}

    @property
    def has_xattrs(self) -> bool:
        if isinstance(self.entries, EntryTable):
            return self.entries.has_xattrs
        return any(e.xattrs for e in self.entries)

    @property
    def content_bytes(self) -> int:
        if isinstance(self.entries, EntryTable):
            return self.entries.content_bytes()
        return sum(e.size for e in self.entries if e.kind == Kind.FILE)

    def encode(self) -> bytes:
        """The manifest as a format-2 blob (:data:`FORMAT`)."""
        return zstandard.ZstdCompressor(level=10).compress(_encode_tables(self))

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        """A manifest blob of either format: 2 (binary tables), or 1 (JSON), which images
        converted before format 2 still have."""
        try:
            raw = decompress(data, MAX_MANIFEST_BYTES, "an image manifest")
        except BootseerError as exc:
            raise ImageManifestError(str(exc)) from exc
        if raw.startswith(_MAGIC):
            return _decode_tables(memoryview(raw)[len(_MAGIC):])
        return _decode_json(raw)


class _ByPath(Mapping[str, FileEntry]):
    """path → entry, over the path index and the entry table."""

    def __init__(self, entries: Sequence[FileEntry], paths: dict[str, int]) -> None:
        self._entries, self._paths = entries, paths

    def __getitem__(self, path: str) -> FileEntry:
        return self._entries[self._paths[path]]

    def get(self, path: str, default: Any = None) -> Any:
        i = self._paths.get(path)
        return default if i is None else self._entries[i]

    def __contains__(self, path: object) -> bool:
        return path in self._paths

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)


# -- format 2: binary tables ---------------------------------------------------------------
#
# ``_MAGIC``, a JSON header (format, block size, config, source, packs, the link targets
# and xattr sets entries point at, and each column's length), then the columns back to
# back: fixed-width little-endian arrays, one per field, and the paths NUL-separated.
# Decoding checks every column's length and every index's range with whole-array
# operations (``max`` over an ``array``), then builds nothing per entry until asked.

_MAGIC = b"bootseer-image/2\n"
_KINDS = tuple(Kind)  # a kind's code is its position
_HARDLINK = _KINDS.index(Kind.HARDLINK)
_FILE = _KINDS.index(Kind.FILE)
#: Entry columns and block columns: name → array typecode (u8, u32, u64, i32, f64).
_ENTRY_COLUMNS = {"kind": "B", "mode": "I", "uid": "I", "gid": "I", "size": "Q",
                  "mtime": "d", "devmajor": "I", "devminor": "I", "ino": "Q", "nlink": "I",
                  "link": "i", "xattrs": "i", "first_ref": "Q", "refs": "I"}
_BLOCK_COLUMNS = {"pack": "I", "offset": "Q", "length": "Q", "size": "Q"}
_LITTLE = sys.byteorder == "little"


def _column(typecode: str, values: Iterable[Any]) -> bytes:
    column = array(typecode, values)
    if not _LITTLE:
        column.byteswap()
    return column.tobytes()


def _encode_tables(m: Manifest) -> bytes:
    links: list[str] = []
    link_index: dict[str, int] = {}
    xattr_sets: list[dict[str, str]] = []
    xattr_index: dict[tuple, int] = {}
    link_of, xattrs_of, first_ref, refs = [], [], [], []
    for e in m.entries:
        if e.link_target is None:
            link_of.append(-1)
        else:
            link_of.append(link_index.setdefault(e.link_target, len(links)))
            if link_of[-1] == len(links):
                links.append(e.link_target)
        if not e.xattrs:
            xattrs_of.append(-1)
        else:
            key = tuple(sorted(e.xattrs.items()))
            xattrs_of.append(xattr_index.setdefault(key, len(xattr_sets)))
            if xattrs_of[-1] == len(xattr_sets):
                xattr_sets.append({k: base64.b64encode(v).decode() for k, v in key})
        first_ref.append(len(refs))
        refs.extend(e.blocks)
    kind_code = {k: i for i, k in enumerate(_KINDS)}
    entries = m.entries
    columns = {
        "kind": _column("B", (kind_code[e.kind] for e in entries)),
        "mode": _column("I", (e.mode for e in entries)),
        "uid": _column("I", (e.uid for e in entries)),
        "gid": _column("I", (e.gid for e in entries)),
        "size": _column("Q", (e.size for e in entries)),
        "mtime": _column("d", (e.mtime for e in entries)),
        "devmajor": _column("I", (e.devmajor for e in entries)),
        "devminor": _column("I", (e.devminor for e in entries)),
        "ino": _column("Q", (e.ino for e in entries)),
        "nlink": _column("I", (e.nlink for e in entries)),
        "link": _column("i", link_of), "xattrs": _column("i", xattrs_of),
        "first_ref": _column("Q", first_ref), "refs": _column("I", refs),
        "pack": _column("I", (b.pack for b in m.blocks)),
        "offset": _column("Q", (b.offset for b in m.blocks)),
        "length": _column("Q", (b.length for b in m.blocks)),
        "size_b": _column("Q", (b.size for b in m.blocks)),
        "digests": b"".join(bytes.fromhex(b.digest) for b in m.blocks),
        "paths": b"\0".join(os.fsencode(e.path) for e in entries),
    }
    header = {"format": FORMAT, "block_size": m.block_size, "config": m.config,
              "source": m.source, "packs": m.packs, "links": links, "xattr_sets": xattr_sets,
              "entries": len(entries), "blocks": len(m.blocks), "refs": len(refs),
              "columns": [[name, len(data)] for name, data in columns.items()]}
    head = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    return b"".join([_MAGIC, len(head).to_bytes(4, "little"), head, *columns.values()])


def _decode_tables(raw: memoryview) -> Manifest:
    try:
        head_len = int.from_bytes(raw[:4], "little")
        header = boundedjson.loads(bytes(raw[4 : 4 + head_len]), limit=MAX_MANIFEST_BYTES,
                                   what="an image manifest's header")
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
        if header.get("format") != FORMAT:
            raise ImageManifestError(f"image manifest format {header.get('format')!r} is "
                                     f"not supported (this Bootseer reads {FORMAT} and "
                                     f"{FORMAT_V1})")
        n_entries, n_blocks, n_refs = header["entries"], header["blocks"], header["refs"]
        block_size, packs = header["block_size"], header["packs"]
        links, xattr_sets = header["links"], header["xattr_sets"]
        if not all(isinstance(v, int) and v >= 0 for v in (n_entries, n_blocks, n_refs)):
            raise ValueError("its counts are not non-negative integers")
        if not isinstance(block_size, int) or not 0 < block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"block size {block_size!r} is not in 1..{MAX_BLOCK_SIZE}")
        if not (isinstance(packs, list) and all(isinstance(p, str) for p in packs)
                and isinstance(links, list) and all(isinstance(s, str) for s in links)
                and isinstance(xattr_sets, list)
                and all(isinstance(x, dict) for x in xattr_sets)):
            raise ValueError("its packs, link targets or xattr sets are malformed")
        expected = {**{n: n_entries * array(t).itemsize for n, t in _ENTRY_COLUMNS.items()},
                    "refs": n_refs * 4,
                    **{("size_b" if n == "size" else n): n_blocks * array(t).itemsize
                       for n, t in _BLOCK_COLUMNS.items()},
                    "digests": n_blocks * 32}
        columns: dict[str, memoryview] = {}
        at = 4 + head_len
        for name, length in header["columns"]:
            if name in columns or not isinstance(length, int) or length < 0:
                raise ValueError(f"column {name!r} is repeated or has a bad length")
            if name in expected and length != expected[name]:
                raise ValueError(f"column {name!r} has {length} bytes, not {expected[name]}")
            columns[name] = raw[at : at + length]
            at += length
        if at != len(raw) or set(columns) != set(expected) | {"paths"}:
            raise ValueError("its columns do not add up to the blob")

        def col(name: str, typecode: str) -> array:
            values = array(typecode)
            values.frombytes(columns[name])
            if not _LITTLE:
                values.byteswap()
            return values

        entry_cols = {n: col(n, t) for n, t in _ENTRY_COLUMNS.items()}
        block_cols = {n: col("size_b" if n == "size" else n, t)
                      for n, t in _BLOCK_COLUMNS.items()}
        paths = os.fsdecode(bytes(columns["paths"])).split("\0") if n_entries else []
        if len(paths) != n_entries:
            raise ValueError(f"{len(paths)} paths for {n_entries} entries")
        index = dict(zip(paths, range(n_entries)))
        if len(index) != n_entries:
            raise ValueError("a path appears twice")
        # Every index in range, every block's size within the block size: whole columns.
        e, b = entry_cols, block_cols
        if n_entries and (max(e["kind"]) >= len(_KINDS) or max(e["link"]) >= len(links)
                          or min(e["link"]) < -1 or max(e["xattrs"]) >= len(xattr_sets)
                          or min(e["xattrs"]) < -1):
            raise ValueError("an entry's kind, link target or xattr set is out of range")
        firsts = e["first_ref"].tolist()  # each entry's refs start where the last one's end
        if firsts != sorted(firsts) or (firsts and (firsts[0] != 0 or firsts[-1] > n_refs)):
            raise ValueError("the entries' block references are out of order")
        if n_refs and max(e["refs"]) >= n_blocks:
            raise ValueError("an entry refers to a block the manifest does not have")
        if n_blocks and (max(b["pack"]) >= len(packs) or max(b["size"]) > block_size):
            raise ValueError("a block has an impossible pack or size")
    except ImageManifestError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, UnicodeError) as exc:
        raise ImageManifestError(f"image manifest is malformed: {exc}") from exc
    xattrs = [{k: base64.b64decode(v) for k, v in x.items()} for x in xattr_sets]
    entries = EntryTable(paths, entry_cols, links, xattrs, n_refs)
    blocks = BlockTable(bytes(columns["digests"]), block_cols)
    return Manifest(block_size, header["config"], header["source"], entries, blocks, packs,
                    index)


class _LazyTable(Sequence[T]):
    """A sequence of ``size`` items, each built by :meth:`_build` on first use and kept."""

    def __init__(self, size: int) -> None:
        self._built: list[T | None] = [None] * size

    def __len__(self) -> int:
        return len(self._built)

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...

    def __getitem__(self, i: int | slice) -> T | list[T]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self._built))[i]  # a negative index, as a list takes it
        item = self._built[i]
        if item is None:
            item = self._built[i] = self._build(i)
        return item

    def _build(self, i: int) -> T:
        raise NotImplementedError


class EntryTable(_LazyTable[FileEntry]):
    """A decoded manifest's entries: columns, each :class:`FileEntry` built on first use."""

    def __init__(self, paths: list[str], columns: dict[str, array], links: list[str],
                 xattrs: list[dict[str, bytes]], n_refs: int) -> None:
        super().__init__(len(paths))
        self._paths, self._c, self._links, self._xattrs = paths, columns, links, xattrs
        self._ends = [*columns["first_ref"][1:], n_refs]

    def _build(self, i: int) -> FileEntry:
        c = self._c
        link, xattrs = c["link"][i], c["xattrs"][i]
        return FileEntry(
            self._paths[i], _KINDS[c["kind"][i]], c["mode"][i], c["uid"][i], c["gid"][i],
            c["size"][i], c["mtime"][i], self._links[link] if link >= 0 else None,
            self._xattrs[xattrs] if xattrs >= 0 else _NO_XATTRS, c["devmajor"][i],
            c["devminor"][i], c["ino"][i], c["nlink"][i],
            tuple(c["refs"][c["first_ref"][i] : self._ends[i]]))

    def node_indexes(self) -> dict[int, int]:
        kinds = self._c["kind"]
        return {ino: i for i, ino in enumerate(self._c["ino"]) if kinds[i] != _HARDLINK}

    @property
    def has_xattrs(self) -> bool:
        return bool(self._xattrs)

    def content_bytes(self) -> int:
        kinds = self._c["kind"]
        return sum(size for size, kind in zip(self._c["size"], kinds) if kind == _FILE)


class BlockTable(_LazyTable[BlockLocation]):
    """A decoded manifest's block table: columns, each location built on first use."""

    def __init__(self, digests: bytes, columns: dict[str, array]) -> None:
        super().__init__(len(digests) // 32)
        self._digests, self._c = digests, columns

    def digest_index(self) -> dict[str, int]:
        """Digest → the first index with it, no location built."""
        raw, index = self._digests, {}
        for i in range(len(raw) // 32 - 1, -1, -1):  # backwards: the first one stays
            index[raw[32 * i : 32 * i + 32].hex()] = i
        return index

    def _build(self, i: int) -> BlockLocation:
        c = self._c
        return BlockLocation(self._digests[32 * i : 32 * i + 32].hex(), c["pack"][i],
                             c["offset"][i], c["length"][i], c["size"][i])


_NO_XATTRS: dict[str, bytes] = {}  # shared: entries are never modified


# -- format 1: JSON ------------------------------------------------------------------------


def _decode_json(raw: bytes) -> Manifest:
    try:
        body = boundedjson.loads(raw, limit=MAX_MANIFEST_BYTES, what="an image manifest")
    except ValueError as exc:
        raise ImageManifestError(f"image manifest is not valid: {exc}") from exc
    if not isinstance(body, dict):
        raise ImageManifestError("image manifest is not a JSON object")
    if body.get("format") != FORMAT_V1:
        raise ImageManifestError(f"image manifest format {body.get('format')!r} is not "
                                 f"supported (this Bootseer reads {FORMAT} and {FORMAT_V1})")
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
        entries = [
            FileEntry(p, kinds[k], mode, uid, gid, size, mtime, link,
                      {n: base64.b64decode(v) for n, v in xattrs.items()} if xattrs
                      else _NO_XATTRS, major, minor, ino, nlink, tuple(blist))
            for p, k, mode, uid, gid, size, mtime, link, xattrs, major, minor, ino, nlink,
            blist in body["entries"]
        ]
        return Manifest(block_size, body["config"], body["source"], entries, blocks, packs)
    except (KeyError, TypeError, ValueError) as exc:
        raise ImageManifestError(f"image manifest is malformed: {exc}") from exc


def encode_v1(m: Manifest) -> bytes:
    """``m`` as a format-1 (JSON) blob, as Bootseer wrote before format 2: for tests that
    show such images still mount."""
    body = {
        "format": FORMAT_V1,
        "block_size": m.block_size,
        "config": m.config,
        "source": m.source,
        "packs": m.packs,
        "blocks": [[b.digest, b.pack, b.offset, b.length, b.size] for b in m.blocks],
        "entries": [
            [e.path, e.kind.value, e.mode, e.uid, e.gid, e.size, e.mtime, e.link_target,
             {k: base64.b64encode(v).decode() for k, v in e.xattrs.items()},
             e.devmajor, e.devminor, e.ino, e.nlink, list(e.blocks)]
            for e in m.entries
        ],
    }
    raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    return zstandard.ZstdCompressor(level=10).compress(raw)

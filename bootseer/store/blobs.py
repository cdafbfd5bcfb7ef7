"""Content-addressed blobs and named references, on top of any :class:`Store`.

A blob is addressed by the sha256 of its content (``sha256:<hex>``, the digest form OCI
uses), so identical content is stored once and any copy can be checked by anyone with
``sha256sum``. Every read is verified, ranged reads included: at put time the blob's
content is also hashed in fixed chunks (1 MiB) into a *chunk table*, stored beside it, so
a read of a few bytes fetches and checks only the chunks it touches, and a mismatch names
the blob and the chunk instead of returning wrong bytes. A table is only checked for
damage, so whole reads (``get``, ``iter_chunks``, ``open``) check the whole digest too.

Store layout::

    blobs/sha256/<2 hex>/<64 hex>     the content, unchanged (readable by Hadoop tools)
    chunks/sha256/<2 hex>/<64 hex>    its chunk table (published before the blob)
    refs/<name>                       JSON: {"digest", "size", "meta", "created"}

Publishing a blob is create-only: two writers of the same content race safely, one
publishes and the other finds the object in place; both succeed.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import re
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from bootseer import boundedjson
from bootseer.errors import IntegrityError, InvalidRangeError
from bootseer.limits import check_size
from bootseer.store.base import (
    DigestCheckedStream,
    RangedFile,
    Store,
    check_key,
    chunks_of,
    replaying,
)
from bootseer.zeros import is_zero

log = logging.getLogger(__name__)

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
CHUNK_SIZE = 1 << 20
_READ_CHUNKS = 8  # chunks fetched per backend call when streaming a whole blob
#: Bytes per backend call of :meth:`BlobStore.open`'s stream: a backend call and a copy per
#: 1 MiB chunk cost a restore more CPU than its decompression.
STREAM_READ = 8 << 20
#: The first range of a stream opened before its reader is ready (``open(start=True)``):
#: a restore opens six at once and its workers read two of them first, so a full
#: STREAM_READ for every one would fill the link with bytes that wait in memory while the
#: ones read first are late. A cold ``env run`` over bench-env's 100 MB/s link, 2 cores,
#: medians of 3-4 runs: 2, 4 and 8 MiB took 1.03, 1.02 and 1.16 s for the jupyter preset,
#: 3.94, 3.86 and 3.72 s for the full one (whose longer manifest decode leaves the link
#: more time to fill).
STREAM_START = 4 << 20
_TABLE_MAGIC = b"BSCT"
_TABLE_VERSION = 1
_TABLE_HEADER = struct.Struct(">4sBIQ32s")  # magic, version, chunk size, blob size, digest
#: A ref is a digest, a size and a little metadata: anything larger is not one.
MAX_REF_BYTES = 64 << 10
#: The smallest chunk a table may use: it bounds a table's size by its blob's (0.05%).
MIN_CHUNK_SIZE = 64 << 10


def is_digest(text: str) -> bool:
    return bool(DIGEST_RE.match(text))


def _check_digest(digest: str) -> str:
    if not is_digest(digest):
        raise ValueError(f"not a blob digest: {digest!r} (expected sha256:<64 hex digits>)")
    return digest


@dataclass(frozen=True)
class BlobInfo:
    digest: str
    size: int


@dataclass(frozen=True)
class Ref:
    """A name that points at a blob, with a little metadata about why it does."""

    name: str
    digest: str
    size: int
    meta: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0

    def encode(self) -> bytes:
        body = {"digest": self.digest, "size": self.size, "meta": self.meta,
                "created": self.created}
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, name: str, data: bytes) -> Ref:
        try:
            body = boundedjson.loads(data, limit=MAX_REF_BYTES, what=f"reference {name!r}")
            return cls(name, _check_digest(body["digest"]), int(body["size"]),
                       dict(body.get("meta") or {}), float(body.get("created", 0.0)))
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"reference {name!r} is corrupt: {exc}") from exc


@dataclass(frozen=True)
class ChunkTable:
    """Per-chunk sha256 digests of a blob, so ranged reads can be verified."""

    digest: str
    size: int
    chunk_size: int
    chunk_digests: tuple[bytes, ...]

    def encode(self) -> bytes:
        header = _TABLE_HEADER.pack(_TABLE_MAGIC, _TABLE_VERSION, self.chunk_size, self.size,
                                    bytes.fromhex(self.digest.removeprefix("sha256:")))
        body = header + b"".join(self.chunk_digests)
        return body + hashlib.sha256(body).digest()

    @classmethod
    def decode(cls, digest: str, data: bytes) -> ChunkTable:
        body, trailer = data[:-32], data[-32:]
        if len(data) < _TABLE_HEADER.size + 32 or hashlib.sha256(body).digest() != trailer:
            raise IntegrityError(f"chunk table of blob {digest} is corrupt")
        magic, version, chunk_size, size, raw = _TABLE_HEADER.unpack_from(body)
        if magic != _TABLE_MAGIC or version != _TABLE_VERSION:
            raise IntegrityError(f"chunk table of blob {digest}: unknown format {version}")
        if chunk_size < MIN_CHUNK_SIZE:
            raise IntegrityError(f"chunk table of blob {digest}: chunks of {chunk_size} "
                                 f"bytes are below the format's {MIN_CHUNK_SIZE}")
        if "sha256:" + raw.hex() != digest:
            raise IntegrityError(f"chunk table of blob {digest} belongs to another blob")
        rest = body[_TABLE_HEADER.size :]
        digests = tuple(rest[i : i + 32] for i in range(0, len(rest), 32))
        if len(digests) != -(-size // chunk_size):
            raise IntegrityError(f"chunk table of blob {digest} has the wrong length")
        return cls(digest, size, chunk_size, digests)


class _Hasher:
    """sha256 of the whole stream plus sha256 of each fixed-size chunk, in one pass."""

    _ZERO_DIGESTS: dict[int, bytes] = {}

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self.whole = hashlib.sha256()
        self.chunks: list[bytes] = []
        self.size = 0
        self._partial = bytearray()
        if chunk_size not in self._ZERO_DIGESTS:
            self._ZERO_DIGESTS[chunk_size] = hashlib.sha256(bytes(chunk_size)).digest()

    def update(self, data: bytes) -> None:
        self.whole.update(data)
        self.size += len(data)
        view = memoryview(data)
        if self._partial:
            take = self.chunk_size - len(self._partial)
            self._partial += view[:take]
            view = view[take:]
            if len(self._partial) == self.chunk_size:
                self._add_chunk(self._partial)
                self._partial = bytearray()
        while len(view) >= self.chunk_size:
            self._add_chunk(view[: self.chunk_size])
            view = view[self.chunk_size :]
        self._partial += view

    def _add_chunk(self, chunk: bytes | bytearray | memoryview) -> None:
        if len(chunk) == self.chunk_size and is_zero(chunk):  # holes of sparse files: free
            self.chunks.append(self._ZERO_DIGESTS[self.chunk_size])
        else:
            self.chunks.append(hashlib.sha256(chunk).digest())

    def finish(self) -> ChunkTable:
        if self._partial:
            self._add_chunk(self._partial)
        digest = "sha256:" + self.whole.hexdigest()
        return ChunkTable(digest, self.size, self.chunk_size, tuple(self.chunks))


class BlobStore:
    """Verified content-addressed blobs and references over a :class:`Store`."""

    def __init__(self, store: Store, *, chunk_size: int = CHUNK_SIZE, table_cache: int = 256):
        self.store = store
        self.chunk_size = chunk_size
        self._tables: OrderedDict[str, ChunkTable] = OrderedDict()
        self._table_cache = table_cache
        self._lock = threading.Lock()

    # -- keys ---------------------------------------------------------------------------------

    @staticmethod
    def blob_key(digest: str) -> str:
        hexd = _check_digest(digest)[7:]
        return f"blobs/sha256/{hexd[:2]}/{hexd}"

    @staticmethod
    def table_key(digest: str) -> str:
        hexd = _check_digest(digest)[7:]
        return f"chunks/sha256/{hexd[:2]}/{hexd}"

    @staticmethod
    def ref_key(name: str) -> str:
        return "refs/" + check_key(name)

    # -- blobs --------------------------------------------------------------------------------

    def put(
        self,
        data: bytes | BinaryIO | Iterable[bytes],
        *,
        expect: str | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> BlobInfo:
        """Store ``data`` and return its digest; storing existing content is a no-op.

        ``expect`` is the digest the caller was promised (e.g. by a manifest): if the bytes
        do not match, nothing is published and :class:`IntegrityError` is raised. A write
        the backend interrupts is made again if ``data`` can be read again
        (:func:`~bootseer.store.base.replaying`; ``on_progress`` then hears its bytes again).
        """
        return replaying(data, lambda: self._put_once(data, expect, on_progress))

    def _put_once(self, data: bytes | BinaryIO | Iterable[bytes], expect: str | None,
                  on_progress: Callable[[int], None] | None) -> BlobInfo:
        hasher = _Hasher(self.chunk_size)
        with self.store.open_writer() as writer:
            for chunk in chunks_of(data):
                hasher.update(chunk)
                writer.write(chunk)
                if on_progress:
                    on_progress(len(chunk))
            table = hasher.finish()
            if expect is not None and table.digest != expect:
                raise IntegrityError(f"content does not match the expected digest {expect} "
                                     f"(got {table.digest}); nothing was stored")
            info = BlobInfo(table.digest, table.size)
            if self.store.exists(self.blob_key(table.digest)):
                writer.abort()
                return info
            try:  # create-only: a concurrent writer's table is the same bytes
                self.store.put(self.table_key(table.digest), table.encode(), overwrite=False)
            except FileExistsError:
                pass
            try:
                writer.commit(self.blob_key(table.digest), overwrite=False)
            except FileExistsError:
                log.debug("blob %s was published concurrently by another writer", table.digest)
        self._remember(table)
        return info

    def stat(self, digest: str) -> BlobInfo:
        try:
            return BlobInfo(digest, self.store.stat(self.blob_key(digest)).size)
        except FileNotFoundError:
            raise FileNotFoundError(f"blob {digest} is not in the store {self.store.url}") from None

    def exists(self, digest: str) -> bool:
        return self.store.exists(self.blob_key(digest))

    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` verified bytes of the blob at ``offset``."""
        table = self.chunk_table(digest)
        if offset < 0 or length < 0 or offset + length > table.size:
            raise InvalidRangeError(f"blob {digest}: range {offset}+{length} is outside "
                                    f"its {table.size} bytes")
        if length == 0:
            return b""
        cs = table.chunk_size
        first, last = offset // cs, (offset + length - 1) // cs
        data = self._read_chunks(table, first, last + 1)
        start = offset - first * cs
        return data[start : start + length]

    def iter_chunks(self, digest: str) -> Iterator[bytes]:
        """The whole blob as verified chunks; the full digest is checked at the end too."""
        table = self.chunk_table(digest)
        whole = hashlib.sha256()
        n = len(table.chunk_digests)
        for first in range(0, n, _READ_CHUNKS):
            data = self._read_chunks(table, first, min(n, first + _READ_CHUNKS))
            whole.update(data)
            yield data
        if "sha256:" + whole.hexdigest() != digest:
            raise IntegrityError(f"blob {digest} does not match its digest: the stored "
                                 f"object is corrupt")

    def get(self, digest: str, max_size: int | None = None) -> bytes:
        """The whole blob, verified; with ``max_size``, a larger blob is refused
        (:class:`SizeLimitError`) before any of it is read."""
        if max_size is not None:
            check_size(self.chunk_table(digest).size, max_size, f"blob {digest}")
        return b"".join(self.iter_chunks(digest))

    def read_range_into(self, digest: str, offset: int, buffer: memoryview) -> None:
        """:meth:`read_range` into ``buffer``: a range of whole chunks (the blob's last may
        be short) is read straight into it and verified there, with no copy; any other
        range goes through :meth:`read_range`."""
        table, length = self.chunk_table(digest), len(buffer)
        cs, end = table.chunk_size, offset + length
        if offset < 0 or length == 0 or offset % cs or (end % cs and end != table.size) \
                or end > table.size:
            buffer[:] = self.read_range(digest, offset, length)
            return
        self.store.read_range_into(self.blob_key(digest), offset, buffer)
        self._verify_chunks(table, offset // cs, buffer)

    def open(self, digest: str, *, start: bool = False) -> BinaryIO:
        """The blob as a sequential stream, for blobs too large to hold (snapshot shards),
        checked against its digest as a whole at its end (:class:`DigestCheckedStream`: a
        reader must not act on the bytes for good before the end). The store is read
        :data:`STREAM_READ` bytes ahead of the reader, who takes them as they arrive
        (:class:`~bootseer.store.base.RangedFile`); with ``start``, the first
        :data:`STREAM_START` bytes are fetched from now on, for a stream opened before its
        reader is ready. The chunk
        table is not used: it would hash every byte a second time and cost a read per
        blob, and only the whole digest proves the bytes are the blob's (a table is
        checked for damage, not against the blob)."""
        key = self.blob_key(digest)
        raw = RangedFile(functools.partial(self.store.read_range_into, key),
                         self.stat(digest).size, digest, read_ahead=STREAM_READ)
        if start:
            raw.start(STREAM_START)
        checked = DigestCheckedStream(raw, digest.removeprefix("sha256:"),
                                      f"blob {digest} is corrupt or was replaced in the "
                                      f"store {self.store.url}")
        return io.BufferedReader(checked, buffer_size=STREAM_READ)  # type: ignore[return-value]

    def verify(self, digest: str) -> None:
        """Re-read the whole blob and check it; raises :class:`IntegrityError` if corrupt."""
        for _ in self.iter_chunks(digest):
            pass

    def delete(self, digest: str) -> None:
        self.store.delete(self.blob_key(digest))
        with self._lock:
            self._tables.pop(digest, None)
        try:
            self.store.delete(self.table_key(digest))
        except FileNotFoundError:
            pass

    def list(self) -> Iterator[BlobInfo]:
        for info in self.store.list("blobs/sha256/"):
            yield BlobInfo("sha256:" + info.key.rpartition("/")[2], info.size)

    def chunk_table(self, digest: str) -> ChunkTable:
        with self._lock:
            table = self._tables.get(digest)
            if table is not None:
                self._tables.move_to_end(digest)
                return table
        size = self.stat(digest).size
        limit = _TABLE_HEADER.size + 32 * -(-size // MIN_CHUNK_SIZE) + 32
        try:
            table = ChunkTable.decode(digest, self.store.get(self.table_key(digest), limit))
        except FileNotFoundError:
            table = self._rebuild_table(digest)
        if size != table.size:
            raise IntegrityError(f"blob {digest} is {size} bytes, its chunk table says "
                                 f"{table.size}: the stored object is corrupt")
        self._remember(table)
        return table

    def _rebuild_table(self, digest: str) -> ChunkTable:
        """A blob without a table (e.g. copied in by hand): hash it once and store one."""
        key = self.blob_key(digest)
        if not self.store.exists(key):
            raise FileNotFoundError(f"blob {digest} is not in the store {self.store.url}")
        log.warning("blob %s has no chunk table; rebuilding it", digest)
        hasher = _Hasher(self.chunk_size)
        for chunk in self.store.iter_chunks(key):
            hasher.update(chunk)
        table = hasher.finish()
        if table.digest != digest:
            raise IntegrityError(f"blob {digest} does not match its digest: the stored "
                                 f"object is corrupt")
        self.store.put(self.table_key(digest), table.encode())
        return table

    def _remember(self, table: ChunkTable) -> None:
        with self._lock:
            self._tables[table.digest] = table
            self._tables.move_to_end(table.digest)
            while len(self._tables) > self._table_cache:
                self._tables.popitem(last=False)

    def _read_chunks(self, table: ChunkTable, first: int, stop: int) -> bytes:
        cs = table.chunk_size
        start, end = first * cs, min(table.size, stop * cs)
        data = self.store.read_range(self.blob_key(table.digest), start, end - start)
        self._verify_chunks(table, first, memoryview(data))
        return data

    @staticmethod
    def _verify_chunks(table: ChunkTable, first: int, data: memoryview) -> None:
        """``data`` is chunks ``first``, ``first + 1``, ... of the blob: check each."""
        cs = table.chunk_size
        for k in range(-(-len(data) // cs)):
            i, piece = first + k, data[k * cs : (k + 1) * cs]
            if hashlib.sha256(piece).digest() != table.chunk_digests[i]:
                lo = i * cs
                raise IntegrityError(
                    f"blob {table.digest}: bytes {lo}-{lo + len(piece)} (chunk {i}) do not "
                    f"match their digest: the stored object is corrupt"
                )

    # -- references ---------------------------------------------------------------------------

    def set_ref(
        self, name: str, digest: str, meta: dict[str, Any] | None = None, *,
        overwrite: bool = True,
    ) -> Ref:
        """Point ``name`` at an existing blob (create-only when ``overwrite=False``)."""
        info = self.stat(digest)
        ref = Ref(name, digest, info.size, dict(meta or {}), time.time())
        self.store.put(self.ref_key(name), ref.encode(), overwrite=overwrite)
        return ref

    def get_ref(self, name: str) -> Ref:
        try:
            return Ref.decode(name, self.store.get(self.ref_key(name), MAX_REF_BYTES))
        except FileNotFoundError:
            raise FileNotFoundError(f"no reference {name!r} in {self.store.url}") from None

    def list_refs(self, prefix: str = "") -> Iterator[str]:
        for info in self.store.list("refs/" + prefix):
            yield info.key[len("refs/") :]

    def delete_ref(self, name: str) -> None:
        try:
            self.store.delete(self.ref_key(name))
        except FileNotFoundError:
            raise FileNotFoundError(f"no reference {name!r} in {self.store.url}") from None

    def resolve(self, name_or_digest: str) -> str:
        """A digest as is, or the digest a reference points at."""
        if is_digest(name_or_digest):
            return name_or_digest
        return self.get_ref(name_or_digest).digest

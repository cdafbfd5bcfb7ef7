"""The store interface every backend implements.

A store maps keys (``"/"``-separated relative paths) to immutable byte objects. Everything
in Bootseer (image blocks and hot lists, environment snapshots, checkpoints) rests on two
properties, so a backend must provide exactly these and little else:

* **ranged reads** — ``read_range(key, offset, length)`` maps to a positional read on the
  backend (``pread``, HDFS ``read_at``, an HTTP ``offset``/``length``), never a download of
  the whole object;
* **atomic publish** — a writer streams into a temporary object and publishes it under its
  key in one rename, so a reader never sees a partial object, and a writer that dies
  leaves at most an unlisted temporary.

Following fsspec, the abstract surface is small (``stat``, ``_read_range``, ``open_writer``,
``delete``, ``list``); conveniences (``get``, ``put``, ``exists``, ``open``) are built on it
here once, so every backend gets them and the contract tests in
``tests/support/store_contract.py`` cover all of them.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import posixpath
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO, TypeVar

from tenacity import (
    before_sleep_log,
    retry,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from bootseer.errors import IntegrityError, InvalidRangeError
from bootseer.limits import check_size

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Top-level key prefix reserved for in-flight writes; never listed, never a valid key.
TEMP_PREFIX = ".tmp"

#: How much a convenience method reads or writes per backend call.
IO_CHUNK = 4 << 20


@dataclass(frozen=True)
class ObjectInfo:
    """What a store knows about one published object."""

    key: str
    size: int
    mtime: float


@dataclass(frozen=True)
class Access:
    """Who may read an object, as far as its store can tell (POSIX-style permissions).

    ``uid``/``gid`` are local ids (None where the store's owner or group has no account on
    this node); ``mode`` holds only read bits, and a class of users keeps its bit only if
    every one of them can read the object, directories above it included
    (:func:`readable_bits`). Root can always read. Copies and mounts of the object give
    exactly these, so nobody reads through Bootseer what they could not read at the source.
    """

    uid: int | None
    gid: int | None
    mode: int


@dataclass(frozen=True)
class Perm:
    """One path's owner, group (ids or names, as long as both sides use the same) and
    permission bits."""

    owner: int | str
    group: int | str
    mode: int


def readable_bits(target: Perm, parents: list[Perm]) -> int:
    """The read bits (``0o444`` at most) that hold for *every* user of each class of
    ``target`` (its owner; the other members of its group; everyone else), given that
    reading also needs search (x) permission on each of ``parents``.

    A user is judged by exactly one class at each directory (owner, else group, else
    other), and group membership beyond ``target``'s group is not known here, so a class
    keeps its bit only where every class its members might fall into grants search.
    """
    def search(p: Perm, *, owner_may_be_us: bool, group_may_be_us: bool,
               may_be_other: bool) -> bool:
        return ((not owner_may_be_us or bool(p.mode & 0o100))
                and (not group_may_be_us or bool(p.mode & 0o010))
                and (not may_be_other or bool(p.mode & 0o001)))

    bits = 0
    # The owner: the directory's owner if it is theirs, else maybe in its group, else not.
    if target.mode & 0o400 and all(
            search(p, owner_may_be_us=p.owner == target.owner,
                   group_may_be_us=p.owner != target.owner,
                   may_be_other=p.owner != target.owner) for p in parents):
        bits |= 0o400
    # Group members other than the owner: any of a directory's classes but its owner's
    # when that is the target's owner; surely its group when that is the target's group.
    if target.mode & 0o040 and all(
            search(p, owner_may_be_us=p.owner != target.owner, group_may_be_us=True,
                   may_be_other=p.group != target.group) for p in parents):
        bits |= 0o040
    # Everyone else: any class of a directory but an owner or group they are not in.
    if target.mode & 0o004 and all(
            search(p, owner_may_be_us=p.owner != target.owner,
                   group_may_be_us=p.group != target.group, may_be_other=True)
            for p in parents):
        bits |= 0o004
    return bits


def check_key(key: str) -> str:
    """Reject keys that could escape the store root or collide with temporaries."""
    if not key or key.startswith("/") or key.endswith("/"):
        raise ValueError(f"invalid store key {key!r}: must be a relative path like 'a/b'")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0] == TEMP_PREFIX:
        raise ValueError(f"invalid store key {key!r}")
    if "\0" in key:
        raise ValueError(f"invalid store key {key!r}: contains NUL")
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix is a key or a key with a trailing slash, or empty for everything."""
    if prefix:
        check_key(prefix.rstrip("/"))
    return prefix


class WriteInterrupted(OSError):
    """A write the backend refused for now, though the same write would succeed later
    (HDFS: the NameNode has not yet heard that the previous block reached its DataNodes,
    ``NotReplicatedYetException``). The writer is lost with it; :meth:`Store.put` and
    ``BlobStore.put`` write their data again, from the start, if they can read it again
    (:func:`replaying`)."""


#: :func:`replaying`'s tries of a write the backend interrupted: HDFS's own client asks the NameNode
#: for the next block 5 more times, waiting 0.4 s and then twice as long each time
#: (``dfs.client.block.write.locateFollowingBlock.retries``); so do we, for the whole write.
PUT_TRIES = 6


class ObjectWriter(ABC):
    """A write in progress: bytes go to a temporary object until :meth:`commit`.

    Used as a context manager, a writer that is left by an exception aborts, removing its
    temporary, so the only way an object appears under a key is a successful commit.
    """

    def __init__(self) -> None:
        self.size = 0
        self.closed = False

    @abstractmethod
    def write(self, data: bytes | memoryview) -> None:
        """Append ``data`` to the pending object."""

    @abstractmethod
    def commit(self, key: str, *, overwrite: bool = True) -> ObjectInfo:
        """Publish the pending object under ``key`` atomically.

        With ``overwrite=False`` an existing object wins and ``FileExistsError`` is raised
        (the temporary is removed): this is the create-only publish that lets two writers
        of the same content race safely.
        """

    @abstractmethod
    def abort(self) -> None:
        """Discard the pending object. Safe to call more than once."""

    def __enter__(self) -> ObjectWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.closed:
            self.abort()


class Store(ABC):
    """Immutable byte objects under keys, with ranged reads and atomic publish."""

    #: URL scheme(s) this backend serves, e.g. ``("file",)``; used by the registry.
    protocols: tuple[str, ...] = ()

    def __init__(self, url: str) -> None:
        self.url = url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- the backend's abstract surface ----------------------------------------------------

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Size and modification time of ``key``; ``FileNotFoundError`` if it is absent."""

    @abstractmethod
    def _read_range(self, key: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset``; fewer only where the object ends."""

    @abstractmethod
    def open_writer(self) -> ObjectWriter:
        """Start a write; the object gets its key only when the writer commits."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; ``FileNotFoundError`` if it is absent."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Published objects whose key starts with ``prefix``, in key order, recursively.

        A prefix ending in ``/`` lists a "directory"; one without matches key prefixes
        within the last path segment too, as object stores do.
        """

    @abstractmethod
    def sweep_temporaries(self, older_than: float = 3600.0) -> int:
        """Remove temporaries of writers that died more than ``older_than`` seconds ago."""

    def access(self, key: str) -> Access | None:
        """Who may read ``key`` (:class:`Access`), or None where the store cannot say:
        then only root may read what Bootseer copies or mounts from it."""
        return None

    def replication(self, key: str) -> int | None:
        """How many copies of ``key``'s blocks the backend keeps (HDFS), or None where it
        has no such notion."""
        self.stat(key)  # a missing key is FileNotFoundError everywhere
        return None

    def set_replication(self, key: str, replicas: int) -> bool:
        """Keep ``replicas`` copies of ``key``'s blocks, so that many readers spread over
        as many servers (HDFS: ``setReplication``; the NameNode copies in the background).
        False where the store has nothing to spread (one local copy)."""
        self.stat(key)
        return False

    def open_local(self, key: str) -> int | None:
        """A read-only descriptor of ``key`` where its bytes are a file of this node (the
        caller closes it), or None where they are not: checkpoint readers then read the
        file itself, one open for all their reads, instead of a ranged read per stripe."""
        return None

    def block_size(self, key: str) -> int | None:
        """The backend's block size for ``key`` (HDFS), or None where there are no blocks.

        Readers that fetch in parallel align their ranges to it, so that one range is
        served by one server.
        """
        return None

    # -- conveniences built on the surface above ------------------------------------------

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset``, or :class:`InvalidRangeError`.

        A range that does not lie within the object is an error rather than a short read:
        callers of a content store always know the sizes they expect, so a short read means
        a wrong offset or a truncated object, and either must be loud.
        """
        if offset < 0 or length < 0:
            raise InvalidRangeError(f"{key}: negative range (offset={offset}, length={length})")
        if length == 0:
            size = self.stat(key).size
            if offset > size:
                raise InvalidRangeError(f"{key}: offset {offset} is past the end ({size} bytes)")
            return b""
        data = self._read_range(check_key(key), offset, length)
        if len(data) != length:
            size = self.stat(key).size
            raise InvalidRangeError(
                f"{key}: range {offset}+{length} is past the end of the object ({size} bytes)"
            )
        return data

    def read_range_into(self, key: str, offset: int, buffer: memoryview, *,
                        progress: Progress | None = None) -> None:
        """Fill ``buffer`` with the bytes at ``offset``, or :class:`InvalidRangeError`.

        The same contract as :meth:`read_range`, into memory the caller reuses: backends
        that can read in place (``pread``) override it and save an allocation and
        a copy per call, which is what keeps parallel readers off the CPU ceiling.

        ``progress(n)``, if given, is told that the first ``n`` bytes of ``buffer`` are in
        place, as they are (a backend whose range arrives in pieces calls it per piece,
        from the reading thread), so that another thread may use them before the call
        returns; its last call says ``len(buffer)``.
        """
        buffer[:] = self.read_range(key, offset, len(buffer))
        if progress is not None:
            progress(len(buffer))

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except FileNotFoundError:
            return False
        return True

    def get(self, key: str, max_size: int | None = None) -> bytes:
        """The whole object; meant for small objects (refs, indexes, manifests). With
        ``max_size``, a larger object is refused (:class:`SizeLimitError`) before any of it
        is read."""
        if max_size is None:
            return b"".join(self.iter_chunks(key))
        size = self.stat(key).size
        check_size(size, max_size, f"{self.url}: {key}")
        return b"".join(self.iter_chunks(key, end=size))

    def iter_chunks(
        self, key: str, chunk_size: int = IO_CHUNK, start: int = 0, end: int | None = None
    ) -> Iterator[bytes]:
        """Stream ``[start, end)`` of ``key`` in ranged reads of ``chunk_size`` bytes."""
        size = self.stat(key).size
        end = size if end is None else end
        if not 0 <= start <= end <= size:
            raise InvalidRangeError(f"{key}: range {start}-{end} outside object of {size} bytes")
        for offset in range(start, end, chunk_size):
            yield self.read_range(key, offset, min(chunk_size, end - offset))

    def put(
        self,
        key: str,
        data: bytes | BinaryIO | Iterable[bytes],
        *,
        overwrite: bool = True,
    ) -> ObjectInfo:
        """Write ``data`` (bytes, a binary file, or an iterable of chunks) and publish it.
        A write the backend interrupts (:class:`WriteInterrupted`) is made again from the
        start when ``data`` can be read again (bytes, a seekable file); a stream of chunks
        cannot, and the error reaches the caller."""
        check_key(key)

        def once() -> ObjectInfo:
            with self.open_writer() as writer:
                for chunk in chunks_of(data):
                    writer.write(chunk)
                return writer.commit(key, overwrite=overwrite)

        return replaying(data, once)

    def open(self, key: str) -> BinaryIO:
        """A read-only, seekable binary file over ranged reads of ``key``."""
        fill = functools.partial(self.read_range_into, key)
        return open_ranged(fill, self.stat(key).size, posixpath.join(self.url, key))


def replaying(data: bytes | BinaryIO | Iterable[bytes], write: Callable[[], T]) -> T:
    """``write()``, a write of ``data``, made again from the start while the backend
    interrupts it (:class:`WriteInterrupted`), if ``data`` can be read again (bytes; a
    seekable file, from where it was); a stream of chunks is written once."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        start = None
    elif hasattr(data, "seekable") and data.seekable():  # type: ignore[union-attr]
        start = data.tell()  # type: ignore[union-attr]
    else:
        return write()

    @retry(retry=retry_if_exception_type(WriteInterrupted), stop=stop_after_attempt(PUT_TRIES),
           wait=wait_exponential(multiplier=0.4, max=6.4), reraise=True,
           before_sleep=before_sleep_log(log, logging.INFO))
    def again() -> T:
        if start is not None:
            data.seek(start)  # type: ignore[union-attr]
        return write()

    return again()


def chunks_of(data: bytes | BinaryIO | Iterable[bytes]) -> Iterator[bytes]:
    """Bytes, a binary file or an iterable of chunks, as an iterator of chunks."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        yield bytes(data)
    elif hasattr(data, "read"):
        while chunk := data.read(IO_CHUNK):  # type: ignore[union-attr]
            yield chunk
    else:
        yield from data  # type: ignore[misc]


Progress = Callable[[int], None]
"""``progress(n)``: the first ``n`` bytes of a buffer being filled are in place."""

Fill = Callable[..., object]
"""``fill(offset, view, progress=None)``: write exactly ``len(view)`` bytes of the object
at ``offset`` (a :meth:`Store.read_range_into`), telling ``progress`` as they arrive."""


def open_ranged(fill: Fill, size: int, name: str, *, buffer_size: int = 1 << 20,
                on_close: Callable[[], None] | None = None) -> BinaryIO:
    """A buffered, seekable, read-only file whose bytes come from positional reads."""
    raw = RangedFile(fill, size, name, on_close)
    return io.BufferedReader(raw, buffer_size=buffer_size)  # type: ignore[return-value]


class DigestCheckedStream(io.RawIOBase):
    """A sequential stream hashed as it is read and checked against ``digest`` (sha256,
    hex) at its end, for objects too large to hash before their first byte is used.

    The read that reaches the end raises :class:`IntegrityError` (``mismatch`` says what
    is wrong), after calling ``on_mismatch``, if the bytes do not hash to ``digest``. A
    reader must therefore not act on the bytes for good before that read returns: a
    restore stages them and switches them in only after every stream's end.
    """

    def __init__(self, raw: io.RawIOBase, digest: str, mismatch: str,
                 on_mismatch: Callable[[], None] | None = None) -> None:
        self._raw, self._digest, self._mismatch = raw, digest, mismatch
        self._on_mismatch = on_mismatch
        self._sha = hashlib.sha256()
        self._checked = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        n = self._raw.readinto(buffer)
        if n:
            self._sha.update(memoryview(buffer)[:n])
        elif not self._checked:
            self._checked = True
            if self._sha.hexdigest() != self._digest:
                if self._on_mismatch is not None:
                    self._on_mismatch()
                raise IntegrityError(f"{self._mismatch} (it does not match its digest)")
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


#: What a reader of a range read ahead waits for before it takes a piece (or its end):
#: taken at every DataNode packet (64 KiB), a CUDA restore's workers, waiting on the link,
#: cost it 30% more CPU (19.1 CPU-s against 14.7) in handoffs.
HANDOFF = 1 << 20

#: Streams whose next buffer is fetched at once, per process. A restore's (one per thread
#: and OPEN_AHEAD more) beyond these wait in the order they were opened: its read order.
READ_AHEAD_THREADS = 8


@functools.cache
def _read_ahead_executor() -> ThreadPoolExecutor:
    """The process's read-ahead threads, made on first use (after any fork)."""
    return ThreadPoolExecutor(READ_AHEAD_THREADS, thread_name_prefix="read-ahead")


class _Ahead:
    """The next range of a stream, being fetched into ``data`` by a read-ahead thread, and
    handed to the reader as its bytes arrive: a reader that waits for a whole range
    before its first byte leaves its CPU idle while the range crosses the link (bench-env,
    jupyter preset: 8 MiB ranges shared six ways took 0.5 s to arrive, and every restore
    worker waited for its first)."""

    def __init__(self, fill: Fill, offset: int, data: bytearray) -> None:
        self.offset, self.data = offset, data
        self.filled = 0  # bytes of data in place
        self.taken = 0  # bytes of data given to the reader
        self._arrived = threading.Condition()
        self.future: Future = _read_ahead_executor().submit(self._fetch, fill)

    def _fetch(self, fill: Fill) -> None:
        try:
            fill(self.offset, memoryview(self.data), progress=self._progress)
            self._progress(len(self.data))  # all of it, even from a fill that never said
        finally:
            with self._arrived:
                self._arrived.notify_all()

    def _progress(self, filled: int) -> None:
        with self._arrived:
            self.filled = max(self.filled, filled)
            self._arrived.notify_all()

    def take(self, view: memoryview) -> int:
        """Copy into ``view`` what has arrived and was not taken yet, at most
        ``len(view)``, once :data:`HANDOFF` bytes of it are in (or the range's end, or as
        much as ``view`` holds); the fetch's error if it failed before a byte came."""
        want = min(len(view), len(self.data) - self.taken, HANDOFF)
        with self._arrived:
            while self.filled - self.taken < want and not self.future.done():
                self._arrived.wait()
        if self.filled == self.taken:
            self.future.result()  # raises why the range did not arrive
        n = min(len(view), self.filled - self.taken)
        view[:n] = memoryview(self.data)[self.taken:self.taken + n]
        self.taken += n
        return n

    @property
    def used_up(self) -> bool:
        return self.taken == len(self.data)


class RangedFile(io.RawIOBase):
    """``io.RawIOBase`` over a positional read function; ``BufferedReader`` buffers on top.

    Every read is clamped to the object, so ``fill`` only ever sees ranges inside it; a
    whole-file ``read()`` is one call, which parallel readers turn into parallel fetches.

    With ``read_ahead`` (bytes), a read starts fetching that many bytes after it, and the
    next reads at that offset take them as they arrive (copied: the buffer is the
    caller's; a read may be short), the next range started once this one is used up. A
    stream consumed by a thread that also decompresses, hashes and writes (a restore) then
    keeps its link busy while it works, instead of alternating between the two. An error
    of a read ahead is raised by the read that needs its bytes, never before.
    """

    def __init__(self, fill: Fill, size: int, name: str,
                 on_close: Callable[[], None] | None = None, *,
                 read_ahead: int = 0) -> None:
        self._fill, self._size, self._pos, self._on_close = fill, size, 0, on_close
        self.name = name
        self._read_ahead = read_ahead
        self._ahead: _Ahead | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer) -> int:  # type: ignore[override]
        n = max(0, min(len(buffer), self._size - self._pos))
        if not n:
            return 0
        view = memoryview(buffer).cast("B")[:n]
        ahead = self._ahead
        if ahead is not None and ahead.offset + ahead.taken == self._pos:
            n = ahead.take(view)
            self._pos += n
            if ahead.used_up:  # its buffer is free again: the next range goes into it
                self._ahead = None
                self._start_ahead(self._read_ahead, ahead.data)
            return n
        self._ahead = None  # a range read ahead and not wanted may still be filling its buffer
        self._fill(self._pos, view)
        self._pos += n
        if self._read_ahead:
            self._start_ahead(self._read_ahead, None)
        return n

    def start(self, length: int) -> None:
        """Begin fetching the first ``length`` bytes now: a stream opened before its reader
        is ready keeps its link busy in the meantime (with less than ``read_ahead``, it
        leaves more of the link to the streams being read)."""
        if self._read_ahead and self._pos == 0 and self._ahead is None:
            self._start_ahead(length, None)

    def _start_ahead(self, n: int, spare: bytearray | None) -> None:
        length = min(n, self._size - self._pos)
        if length <= 0:
            return
        data = spare if spare is not None and len(spare) == length else bytearray(length)
        self._ahead = _Ahead(self._fill, self._pos, data)

    def readall(self) -> bytes:
        out = bytearray(max(0, self._size - self._pos))
        view, done = memoryview(out), 0
        while done < len(out):  # a read from a range read ahead may be short
            done += self.readinto(view[done:])
        return bytes(out)

    def close(self) -> None:
        if self._ahead is not None:  # one under way finishes into its own buffer
            self._ahead.future.cancel()
            self._ahead = None
        if not self.closed and self._on_close is not None:
            self._on_close()
        super().close()

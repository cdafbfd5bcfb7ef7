"""The node's checkpoint cache: local copies of store checkpoints, staged before a job.

``bootseer warm --checkpoint URL`` copies checkpoint files here (``stripedfs/stage.py``);
the checkpoint-load API (``bootseer.checkpoint``, via :func:`bootseer.stripedfs.files.open_reader`)
reads a copy instead of the network when the copy is of the object the store holds now.

Layout under ``<cache_dir>/checkpoints``::

    entries/ab/<h>.json          the record: what the copy is a copy of (URL; size and
                                 mtime of the store object) and its content's sha256
    data/ab/<h>.<sha256[:16]>    the copy, read-only          (h = sha256 of the URL)
    tmp/<h>.<pid>.<random>       a copy being written (0600, in a 0700 directory)

A copy and its record carry the owner, group and read bits of their source
(:meth:`bootseer.store.Store.access`): a user who could not read the source finds neither.

Crash safety: a copy is written to ``tmp/``, fsync'ed, renamed into ``data/``, and only
then is its record renamed into ``entries/``; the record is the commit. A copy no record
names (a staging killed between the two renames) and a temporary of a dead process are
never read, and the next staging removes them. A data file's name includes its content
hash, so re-staging a URL never writes over the file a reader may have open.

Validation on open is a ``stat`` of the store object (which the network path does anyway)
and the copy's size: the record must name the object's current size and mtime, else the
checkpoint was rewritten and the copy is ignored. The copy's sha256 is *not* recomputed on
open: that would read the whole multi-GB file before the first byte, the latency staging
exists to remove, and a crash can only leave unnamed files (see above). It is recomputed by
every ``warm`` that finds the copy (off the critical path), which drops damaged copies.

Size: records are kept under ``checkpoint.cache_size``, least recently used go first (a
record's mtime is its last use: staging, or an open). A commit and an eviction take a
lock file, so a standalone ``warm`` and the agent may share the cache; reads take none.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from bootseer.config import load_config
from bootseer.errors import BootseerError, ConfigError
from bootseer.filelock import file_lock
from bootseer.ready import mark_phase
from bootseer.store import Store
from bootseer.store.base import Access, ObjectInfo
from bootseer.store.local import pid_alive

log = logging.getLogger(__name__)

#: Longest a staging waits for another's commit or eviction (they take milliseconds).
LOCK_TIMEOUT = 120.0


def object_url(store: Store, key: str) -> str:
    """The name a copy is filed under: the same whichever way the object was reached
    (``open("…/step100/x")``, or ``StorageReader("…/step100")`` then key ``x``)."""
    return f"{store.url.rstrip('/')}/{key}"


@dataclass(frozen=True)
class CopyRecord:
    """What a staged copy is a copy of, and of what content."""

    url: str
    size: int  # of the store object, and of the copy
    mtime: float  # of the store object when it was staged
    sha256: str  # of the copy's content, computed while staging
    data: str  # the copy's file name under data/<ab>/

    def matches(self, info: ObjectInfo) -> bool:
        return self.size == info.size and self.mtime == info.mtime


class StagingError(BootseerError):
    """A checkpoint file could not be staged (it changed meanwhile, the cache is full), or
    a staged copy shrank while it was being read."""


class CheckpointCache:
    """Staged checkpoint copies in ``directory``; at most ``max_bytes`` of them."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        # Nothing is created here: a training script looking for copies may not be allowed
        # to write the node's cache, and finds nothing in a cache that does not exist.
        self.directory, self.max_bytes = Path(directory), max_bytes
        self._entries = self.directory / "entries"
        self._data = self.directory / "data"
        self.tmp = self.directory / "tmp"

    @staticmethod
    def _hash(url: str) -> str:
        return hashlib.sha256(url.encode()).hexdigest()

    def _record_path(self, url: str) -> Path:
        h = self._hash(url)
        return self._entries / h[:2] / f"{h}.json"

    def _data_path(self, record: CopyRecord) -> Path:
        return self._data / record.data[:2] / record.data

    # -- reading ------------------------------------------------------------------------------

    def record(self, url: str) -> CopyRecord | None:
        """The committed record of ``url``'s copy, or None (none, or unreadable)."""
        return _load_record(self._record_path(url), url)

    def open_copy(self, url: str, info: ObjectInfo) -> CopyReader | None:
        """A reader of the copy of ``url`` if it is a copy of the object ``info`` describes
        (the store's ``stat`` now) and is whole; None otherwise."""
        record = self.record(url)
        if record is None or not record.matches(info):
            return None
        try:
            fd = os.open(self._data_path(record), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # evicted since we read the record
            return None
        except PermissionError:  # staged for readers this user is not one of
            return None
        if os.fstat(fd).st_size != record.size:
            os.close(fd)
            log.warning("staged copy of %s has the wrong size; reading the store", url)
            return None
        self.touch(url)
        return CopyReader(fd, record.size, url)

    def verify(self, url: str, info: ObjectInfo) -> bool:
        """True if ``url`` has a copy of the object ``info`` describes whose content still
        hashes to its record; a copy that does not is removed."""
        record = self.record(url)
        if record is None or not record.matches(info):
            return False
        digest = hashlib.sha256()
        try:
            with open(self._data_path(record), "rb") as f:
                while chunk := f.read(4 << 20):
                    digest.update(chunk)
        except FileNotFoundError:
            return False
        if digest.hexdigest() != record.sha256:
            log.warning("staged copy of %s is damaged; removing it", url)
            self.discard(url)
            return False
        self.touch(url)
        return True

    def discard(self, url: str) -> None:
        """Remove ``url``'s copy, if any (it is stale or damaged)."""
        with self._locked():
            record = self.record(url)
            if record is not None:
                self._remove(record)

    def touch(self, url: str) -> None:
        """Mark ``url``'s copy used now (the LRU order); best effort, readers may not own it."""
        with contextlib.suppress(OSError):
            os.utime(self._record_path(url))

    # -- writing (``warm``) -------------------------------------------------------------------

    def begin(self, url: str) -> Path:
        """A fresh temporary for a copy of ``url``; :meth:`commit` or unlink it."""
        self.tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.tmp / f"{self._hash(url)[:16]}.{os.getpid()}.{secrets.token_hex(4)}"

    def commit(self, tmp: Path, url: str, info: ObjectInfo, sha256: str,
               access: Access | None) -> CopyRecord:
        """Put the complete, fsync'ed copy ``tmp`` in place as the copy of ``url``,
        readable by whom ``access`` (the store's say on the object) lets read it."""
        record = CopyRecord(url, info.size, info.mtime, sha256,
                            f"{self._hash(url)}.{sha256[:16]}")
        data = self._data_path(record)
        path = self._record_path(url)
        with self._locked():
            old = self.record(url)
            data.parent.mkdir(parents=True, exist_ok=True)
            _limit_readers(tmp, access)
            os.replace(tmp, data)
            path.parent.mkdir(parents=True, exist_ok=True)
            pending = self.tmp / f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
            pending.write_text(json.dumps(asdict(record)))
            _limit_readers(pending, access)  # the record names the content's digest too
            os.replace(pending, path)  # the commit
            if old is not None and old.data != record.data:
                self._data_path(old).unlink(missing_ok=True)
        return record

    def make_room(self, size: int, keep: set[str]) -> bool:
        """Evict least recently used copies (not those of ``keep``) until ``size`` more
        bytes fit; False if they cannot."""
        if size > self.max_bytes:
            return False
        with self._locked():
            records = sorted(self._records(), key=lambda r: r[0])
            used = sum(r.size for _, r in records)
            for _, record in records:
                if used + size <= self.max_bytes:
                    break
                if record.url not in keep:
                    self._remove(record)
                    used -= record.size
            return used + size <= self.max_bytes

    def sweep(self) -> int:
        """Remove what killed stagings left: temporaries of dead processes, and copies no
        record names. Returns how many files went."""
        removed = 0
        with self._locked():
            for leftover in self.tmp.iterdir() if self.tmp.is_dir() else ():
                pid = leftover.name.split(".")[-2]
                if not (pid.isdigit() and pid_alive(int(pid))):
                    leftover.unlink(missing_ok=True)
                    removed += 1
            named = {r.data for _, r in self._records()}
            for data in self._data.glob("*/*") if self._data.is_dir() else ():
                if data.name not in named:
                    data.unlink(missing_ok=True)
                    removed += 1
        return removed

    # -- internals ----------------------------------------------------------------------------

    def _records(self) -> Iterator[tuple[float, CopyRecord]]:
        """(last use, record) of every committed copy."""
        for path in self._entries.glob("*/*.json") if self._entries.is_dir() else ():
            try:
                used = path.stat().st_mtime
            except FileNotFoundError:
                continue
            record = _load_record(path, None)
            if record is not None:
                yield used, record

    def _remove(self, record: CopyRecord) -> None:
        """The record first: a reader never finds a record whose copy is gone for good."""
        self._record_path(record.url).unlink(missing_ok=True)
        self._data_path(record).unlink(missing_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with file_lock(self.directory / "lock", timeout=LOCK_TIMEOUT):
            yield


def _limit_readers(path: Path, access: Access | None) -> None:
    """Give a copy the owner, group and read bits of its source (:class:`Access`), so a
    user who could not read the source cannot read the copy. Where the store cannot say
    who may read (``None``), only root may. A copy staged by a user for themselves keeps
    them as owner, and only an "everyone" bit of the source."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.geteuid() == 0:
            mode = access.mode if access is not None else 0o400
            uid = access.uid if access is not None and access.uid is not None else 0
            gid = access.gid if access is not None and access.gid is not None else 0
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode | (0o400 if uid == 0 else 0))
        else:
            os.fchmod(fd, 0o400 | (access.mode & 0o004 if access is not None else 0))
    finally:
        os.close(fd)


def _load_record(path: Path, url: str | None) -> CopyRecord | None:
    try:
        record = CopyRecord(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        log.warning("ignoring unreadable checkpoint cache record %s: %s", path, exc)
        return None
    return record if url is None or record.url == url else None


def node_cache() -> CheckpointCache | None:
    """This node's checkpoint cache per the configuration, for readers; None (and the
    store is read) when the configuration cannot be loaded."""
    try:
        config = load_config().config
    except ConfigError as exc:
        log.warning("not looking for staged checkpoints: %s", exc)
        return None
    return CheckpointCache(config.cache_dir / "checkpoints", config.checkpoint.cache_size)


class CopyReader:
    """A staged copy, read with the striped reader's interface (``read``, ``readinto``,
    ``fetch``, ``submit_range``), so every loader takes either without knowing which."""

    def __init__(self, fd: int, size: int, name: str) -> None:
        self._fd, self.size, self.name = fd, size, name
        self._read_once = False

    def readinto(self, offset: int, buffer: bytearray | memoryview) -> int:
        """Fill ``buffer`` from ``offset``; returns the byte count (short only at EOF)."""
        view = memoryview(buffer).cast("B")[: max(0, self.size - offset)]
        if not view:
            return 0
        done = 0
        while done < len(view):
            n = os.preadv(self._fd, [view[done:]], offset + done)
            if n == 0:
                raise StagingError(f"staged copy of {self.name} ends at {offset + done} "
                                   f"bytes, not {self.size}")
            done += n
        if not self._read_once:  # the start's milestone, as the striped reader marks it
            self._read_once = True
            mark_phase("checkpoint_first_byte")
        return done

    def read(self, offset: int, length: int) -> bytes:
        return bytes(self.fetch(offset, length))

    def fetch(self, offset: int, length: int) -> bytearray:
        buffer = bytearray(max(0, min(length, self.size - offset)))
        self.readinto(offset, buffer)
        return buffer

    def submit_range(self, offset: int, length: int) -> LocalRange:
        """The striped reader's ``submit_range``: read when the result is asked for (local
        reads need no head start, and nothing is held in memory before that)."""
        return LocalRange(self, offset, length)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> CopyReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class LocalRange:
    """A range of a staged copy: :class:`bootseer.stripedfs.reader.PendingRange`'s
    counterpart."""

    reader: CopyReader
    offset: int
    length: int

    def result(self) -> bytearray:
        return self.reader.fetch(self.offset, self.length)

    def cancel(self) -> None:
        """Nothing was started."""

"""The node's checkpoint cache: local copies of store checkpoints, staged before a job.

``bootseer warm --checkpoint URL`` copies checkpoint files here (``stripedfs/stage.py``);
every checkpoint read (:func:`bootseer.stripedfs.files.open_reader`: the API, ``ckpt get``,
checkpoint mounts) reads a copy instead of the network when the copy is of the object the
store holds now.

Layout under ``<cache_dir>/checkpoints``::

    copies/                a NodeCache (bootseer/nodecache.py), the one the node's image
                           blocks and snapshot shards use: a copy's bytes are the entry
                           named by their sha256; one limit, checkpoint.cache_size, for
                           every process; pid-named temporaries swept once their writer
                           is dead
    records/ab/<h>.json    the record: what a copy is a copy of (URL; size and mtime of
                           the store object) and its content's sha256   (h = sha256 of URL)

A copy and its record carry the owner, group and read bits of their source
(:meth:`bootseer.store.Store.access`): a user who could not read the source finds neither.
Two sources with the same bytes share one entry, which keeps the readers of the one staged
first: a user it leaves out reads the store (they could read those very bytes from the
other source, so nothing leaks either way).

Crash safety: a copy is written to a temporary, fsync'ed (it is read unverified, below),
renamed into place as an entry, and only then is its record renamed into ``records/``: the
record is the commit. The bytes of the copy a record named before go when no record names
them any more. A record whose entry is gone (evicted, or never added) is never read
from, and the next commit removes it. A killed staging leaves at most a temporary under its
pid (swept) or an entry no record names (the least recently used: evicted first).

Validation on open is a ``stat`` of the store object (which the network path does anyway)
and the copy's size: the record must name the object's current size and mtime, else the
checkpoint was rewritten and the copy is ignored. The copy's sha256 is *not* recomputed on
open: that would read the whole multi-GB file before the first byte, the latency staging
exists to remove, and only verified bytes ever become an entry. It is recomputed by every
``warm`` that finds the copy (off the critical path), which drops damaged copies.

Bounds: entries by the NodeCache's limit; records by their entries (a commit removes the
records whose entry is gone) and by :data:`MAX_RECORDS`, least recently used first (a
record's mtime is its last use: staging, or an open). Records are written only under the
NodeCache's lock, so they stay in step with adds and evictions of every process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from bootseer import boundedjson
from bootseer.config import Config
from bootseer.errors import BootseerError, IntegrityError
from bootseer.nodecache import CacheBusy, NodeCache, NodeCaches
from bootseer.store import Store
from bootseer.store.base import Access, ObjectInfo
from bootseer.stripedfs.localfile import LocalFileReader
from bootseer.stripedfs.observer import ReadObserver

log = logging.getLogger(__name__)

#: Records kept at most (each well under 1 KiB); beyond it the least recently used go.
MAX_RECORDS = 1 << 16
#: Longest record file read: a URL and four fields.
MAX_RECORD_BYTES = 64 << 10


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
    sha256: str  # of the copy's content: its entry in the NodeCache

    def matches(self, info: ObjectInfo) -> bool:
        return self.size == info.size and self.mtime == info.mtime


class StagingError(BootseerError):
    """A checkpoint file could not be staged (it changed meanwhile, the cache is full), or
    a staged copy shrank while it was being read."""


class CheckpointCache:
    """Staged checkpoint copies in ``directory``; at most ``max_bytes`` of them across every
    process of the node."""

    def __init__(self, directory: Path, copies: NodeCache) -> None:
        # Nothing is created here: a training script looking for copies may not be allowed
        # to write the node's cache, and finds nothing in a cache that does not exist.
        self.directory = Path(directory)
        self.copies = copies
        self._records = self.directory / "records"

    @classmethod
    def for_config(cls, config: Config) -> CheckpointCache:
        """The node's cache as ``config`` places it (:class:`~bootseer.nodecache.NodeCaches`)."""
        caches = NodeCaches.for_config(config)
        return cls(caches.checkpoints, caches.checkpoint_copies())

    @property
    def max_bytes(self) -> int:
        return self.copies.max_bytes

    def _record_path(self, url: str) -> Path:
        h = hashlib.sha256(url.encode()).hexdigest()
        return self._records / h[:2] / f"{h}.json"

    # -- reading ------------------------------------------------------------------------------

    def record(self, url: str) -> CopyRecord | None:
        """The committed record of ``url``'s copy, or None (none, or unreadable)."""
        return _load_record(self._record_path(url), url)

    def open_copy(self, url: str, info: ObjectInfo, *,
                  observer: ReadObserver | None = None) -> LocalFileReader | None:
        """A reader of the copy of ``url`` if it is a copy of the object ``info`` describes
        (the store's ``stat`` now) and is whole; None otherwise."""
        found = self.copy_descriptor(url, info)
        if found is None:
            return None
        record, fd = found
        return LocalFileReader(fd, record.size, url, observer=observer)

    def copy_descriptor(self, url: str, info: ObjectInfo) -> tuple[CopyRecord, int] | None:
        """The record and an open read-only descriptor of the copy of ``url``, if it is a
        copy of the object ``info`` describes and is whole (the caller closes it)."""
        record = self.record(url)
        if record is None or not record.matches(info):
            return None
        try:
            fd = self.copies.open_unverified(record.sha256)
        except FileNotFoundError:  # evicted
            return None
        except PermissionError:  # staged for readers this user is not one of
            return None
        if os.fstat(fd).st_size != record.size:
            os.close(fd)
            log.warning("staged copy of %s has the wrong size; reading the store", url)
            return None
        _touch(self._record_path(url))
        return record, fd

    def verify(self, url: str, info: ObjectInfo) -> CopyRecord | None:
        """The record of ``url``'s copy if it is a copy of the object ``info`` describes and
        its content still hashes to its name; a damaged copy is dropped."""
        record = self.record(url)
        if record is None or not record.matches(info):
            return None
        stream = self.copies.open(record.sha256)  # checked against its digest at the end
        if stream is None:
            return None
        try:
            with stream:
                while stream.read(4 << 20):
                    pass
        except IntegrityError:  # the NodeCache dropped it
            log.warning("staged copy of %s is damaged; it was removed", url)
            return None
        _touch(self._record_path(url))
        return record

    def discard(self, url: str) -> None:
        """Forget ``url``'s copy, if any (it is stale or damaged): its record goes, and its
        bytes too unless another record names them."""
        old = self.record(url)
        with self.copies.locked():
            self._record_path(url).unlink(missing_ok=True)
            named = self._prune_records()
        self._drop_unnamed(old, named)

    # -- writing (``warm``) -------------------------------------------------------------------

    def begin(self) -> Path:
        """A fresh temporary for a copy; :meth:`commit` or unlink it."""
        return self.copies.new_temporary("copy")

    def commit(self, tmp: Path, url: str, info: ObjectInfo, sha256: str,
               access: Access | None, *, keep: Iterable[str] = ()) -> CopyRecord:
        """Put the complete, fsync'ed copy ``tmp`` (content ``sha256``) in place as the copy
        of ``url``, readable by whom ``access`` (the store's say on the object) lets read
        it. Room is made by evicting other copies, never those whose digests are in
        ``keep``; :class:`StagingError` if there is none."""
        record = CopyRecord(url, info.size, info.mtime, sha256)
        _limit_readers(tmp, access)
        try:
            self.copies.add_file(tmp, sha256, keep=keep)
        except BootseerError as exc:  # CacheFull or CacheBusy
            raise StagingError(f"{url}: not staged ({exc}; checkpoint.cache_size)") from exc
        path = self._record_path(url)
        old = self.record(url)
        with self.copies.locked():
            if sha256 not in self.copies:  # evicted by another staging meanwhile
                raise StagingError(f"{url}: its copy was evicted while it was committed "
                                   f"(checkpoint.cache_size is too small for the stagings "
                                   f"running at once)")
            self._mkdir(path.parent)
            pending = self.copies.new_temporary("record")
            fd = os.open(pending, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                         os.O_CLOEXEC, 0o600)
            with open(fd, "w") as f:
                f.write(json.dumps(asdict(record)))
            _limit_readers(pending, access)  # the record names the content's digest too
            os.replace(pending, path)  # the commit
            named = self._prune_records()
        self._drop_unnamed(old, named)
        return record

    # -- internals ----------------------------------------------------------------------------

    def _drop_unnamed(self, old: CopyRecord | None, named: set[str]) -> None:
        """Drop the bytes of a record that went (a rewritten checkpoint's), unless a record
        names them. (After the lock: a staging of the same bytes racing with it can be left
        with a record whose copy is gone, read from the store and staged again by the next
        warm, like any evicted copy.)"""
        if old is not None and old.sha256 not in named:
            with contextlib.suppress(CacheBusy):  # else they are evicted in their turn
                self.copies.drop(old.sha256)

    def _prune_records(self) -> set[str]:
        """Remove records whose copy is gone, then the least recently used beyond
        :data:`MAX_RECORDS`; return the digests the remaining records name. Called with
        the NodeCache's lock held."""
        live = []
        for used, path, record in self._scan_records():
            if record is None or record.sha256 not in self.copies:
                path.unlink(missing_ok=True)
            else:
                live.append((used, str(path), record.sha256))
        live.sort()
        for _, path, _ in live[: max(0, len(live) - MAX_RECORDS)]:
            Path(path).unlink(missing_ok=True)
        return {digest for _, _, digest in live[max(0, len(live) - MAX_RECORDS):]}

    def _scan_records(self) -> Iterator[tuple[float, Path, CopyRecord | None]]:
        """(last use, path, record or None if unreadable) of every record file."""
        for path in self._records.glob("*/*.json") if self._records.is_dir() else ():
            try:
                used = path.stat().st_mtime
            except FileNotFoundError:
                continue
            yield used, path, _load_record(path, None)

    def _mkdir(self, path: Path) -> None:
        """Record directories: readers go through them to their own records."""
        for directory in (self._records, path):
            with contextlib.suppress(FileExistsError):
                directory.mkdir(mode=0o755)


def _touch(path: Path) -> None:
    """Mark a record used now (the LRU order); best effort, readers may not own it."""
    with contextlib.suppress(OSError):
        os.utime(path)


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
    """The record in ``path`` (for ``url``, if given), or None: missing, unreadable, or not
    a record (a digest that is not one names no entry)."""
    try:
        fields = boundedjson.load_file(path, limit=MAX_RECORD_BYTES,
                                       what=f"checkpoint cache record {path}")
        record = CopyRecord(**fields)
        if not (isinstance(record.url, str) and isinstance(record.size, int) and
                isinstance(record.mtime, int | float)):
            raise TypeError("fields of the wrong type")
        NodeCache.check_digest(record.sha256)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        log.warning("ignoring unreadable checkpoint cache record %s: %s", path, exc)
        return None
    return record if url is None or record.url == url else None

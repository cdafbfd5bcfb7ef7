"""A node's cache on disk: verified entries named by their sha256, one size limit that holds
across every process of the node, crash-safe.

Image blocks (``<cache_dir>/blocks``), snapshot shards and unpacked snapshots
(``<cache_dir>/snapshots``), and checkpoint copies (``<cache_dir>/checkpoints/copies``)
are each one :class:`NodeCache`, opened at once by the agent, every mount server, a
standalone ``bootseer warm``, a restore and a checkpoint read. So nothing about the cache
lives in a process: presence is the file, the limit is counted on disk, and what one
process adds, every other sees at once (a server sees the blocks a warm staged after it
started). Where each lives and how large it may grow is decided in one place,
:class:`NodeCaches`, from the config::

    entries/ab/<hex>          an entry, named by the sha256 of its bytes (or a key)
    entries/ab/<hex>/         a tree entry: tree/ its files, size their bytes
    tmp/<hex>.<pid>.<rand>    an entry being written by process <pid>
    building/<hex>            taken (flock) while one process builds a tree the others
                              would build too; 0600
    usage                     the bytes entries hold, as the last add or eviction left it
    lock                      taken (flock) to add, drop or evict; 0600

* **Verified.** An entry is renamed into place only after its bytes matched its digest,
  and is checked again when read back (a disk can still damage it later): a damaged entry
  is dropped and reads as absent. (Checkpoint copies, too large to hash before their
  first byte, are opened unchecked: :meth:`NodeCache.open_unverified`.) Digests are
  checked to be 64 hex digits before they become a path: a manifest naming
  ``../../etc/x`` names nothing.
* **One limit.** Every add counts its bytes into ``usage`` under the lock; an add that
  would take it over ``max_bytes`` first evicts least recently used entries (an entry's
  mtime is its last use: reads touch it) down to ``low_water`` of the limit, never those
  the adder asked to keep, and is refused (:class:`CacheFull`) if that is not enough. The
  count is written before an entry appears and after one goes, so a crash can only leave
  it too high (an eviction then comes early); eviction scans the entries and so recounts,
  and a missing or unreadable count is recounted the same way.
* **Crash-safe.** A killed writer leaves at most a temporary under its own pid; it is
  removed once that process is dead (never while it lives), by the next process to open
  the cache or evict.
* **Trees too.** An entry may be a directory of files (an unpacked snapshot:
  :meth:`NodeCache.add_tree`), counted as the bytes its builder says it holds; it is
  evicted like a file, except while ``in_use`` says something reads it (an overlay mounts
  it), and removed by first renaming it out of ``entries``, so a half-removed tree is
  never taken for one.
* **Readers need no write access.** A process that may only read the cache (a training
  script restoring from the node's shards) finds entries and never creates anything.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import io
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from bootseer.config import Config
from bootseer.errors import BootseerError, IntegrityError
from bootseer.filelock import file_lock
from bootseer.mounts import overlays_reading
from bootseer.store.base import DigestCheckedStream
from bootseer.store.local import pid_alive

log = logging.getLogger(__name__)

_HEX = re.compile(r"[0-9a-f]{64}")
#: A tree entry's files, and the file saying how many bytes they hold.
TREE, TREE_SIZE = "tree", "size"
#: Longest an add or a drop waits for another process's (they take microseconds; an
#: eviction's scan of a very large cache, under a second). Past it, the entry is simply
#: not cached (:class:`CacheBusy`): a process stopped while holding the lock must not
#: stall every reader on the node, and a reader has the bytes in hand either way.
LOCK_TIMEOUT = 5.0
#: After the lock stayed taken that long, this process adds nothing for this many seconds
#: (it does not pay the wait again for every block of a start).
BUSY_BACKOFF = 30.0


class NotCached(BootseerError):
    """The entry was not added; the caller has its bytes and goes on without caching them."""


class CacheBusy(NotCached):
    """The cache's lock stayed taken: the entry was not added (or not dropped)."""


class CacheFull(NotCached):
    """The entry does not fit: larger than the cache, or only evicting entries the caller
    asked to keep would make room."""


class NodeCache:
    """Verified, content-addressed entries in ``directory``, at most ``max_bytes`` of them
    across every process that opens it."""

    def __init__(self, directory: Path, max_bytes: int, *, low_water: float = 0.9,
                 mode: int = 0o644, in_use: Callable[[Path], bool] | None = None) -> None:
        self.directory, self.max_bytes = Path(directory), max_bytes
        self.low_water = low_water
        self.mode = mode  # of entries: shards are read by unprivileged restores
        #: Whether a tree entry is read right now (never evicted then).
        self.in_use = in_use
        #: Directories are as private as the entries: a 0600 cache lists to nobody either.
        self._dir_mode = 0o700 if not mode & 0o077 else 0o755
        self._entries = self.directory / "entries"
        self._entries_text = str(self._entries)
        self._tmp = self.directory / "tmp"
        self._busy_until = 0.0  # monotonic time before which adds fail at once
        with contextlib.suppress(OSError):  # a reader without write access sweeps nothing
            self._sweep_temporaries()

    # -- reading --------------------------------------------------------------------------

    @staticmethod
    def check_digest(digest: object) -> str:
        """``digest`` if it is 64 lowercase hex digits, the only names entries have;
        ``ValueError`` otherwise (so a hostile name never becomes a path)."""
        if not isinstance(digest, str) or not _HEX.fullmatch(digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return digest

    def path(self, digest: str) -> Path:
        """Where entry ``digest`` lives; ``ValueError`` for anything but 64 hex digits."""
        digest = self.check_digest(digest)
        return self._entries / digest[:2] / digest

    def __contains__(self, digest: str) -> bool:
        # On strings, not Path objects: a prefetch of an image already on the node asks
        # this of each of its thousands of hot blocks, at a start.
        return os.path.isfile(f"{self._entries_text}/{self.check_digest(digest)[:2]}/{digest}")

    def get(self, digest: str) -> bytes | None:
        """The entry's bytes, or None if absent or damaged (a damaged entry is dropped)."""
        path = self.path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if hashlib.sha256(data).hexdigest() != digest:
            log.warning("cached entry %s is damaged; dropping it", digest)
            self._drop_quietly(digest)
            return None
        _touch(path)
        return data

    def open(self, digest: str) -> BinaryIO | None:
        """The entry as a stream, or None if absent: for entries too large to hold in
        memory at once (snapshot shards). It is checked against its digest as it is read;
        a mismatch at the end raises :class:`IntegrityError` (the entry is dropped), so a
        reader must not act on the bytes before reaching the end."""
        path = self.path(digest)
        try:
            raw = open(path, "rb", buffering=0)
        except FileNotFoundError:
            return None
        _touch(path)
        def dropped() -> None:
            log.warning("cached entry %s is damaged; dropping it", digest)
            self._drop_quietly(digest)

        return io.BufferedReader(DigestCheckedStream(raw, digest,
                                                     f"cached entry {digest} is damaged",
                                                     dropped))

    def open_unverified(self, digest: str) -> int:
        """A read-only file descriptor of the entry, for random reads that are *not*
        checked against its digest (``FileNotFoundError`` if absent): for entries too
        large to hash before their first byte is needed. They were checked on the way in,
        like every entry; what a disk damaged since is the caller's to find (the
        checkpoint cache re-hashes its copies at every ``warm``)."""
        fd = os.open(self.path(digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        _touch(fd)  # through the descriptor: no second walk of the path
        return fd

    def tree(self, key: str) -> Path | None:
        """Tree entry ``key``'s files (:meth:`add_tree`), marked used; None if absent."""
        path = self.path(key)
        if not path.is_dir():
            return None
        _touch(path)
        return path / TREE

    # -- adding ---------------------------------------------------------------------------

    def put(self, digest: str, data: bytes) -> None:
        """Add an entry whose digest the caller has verified."""
        self.put_many([(digest, data)])

    def get_or_fetch(self, digest: str, fetch: Callable[[], bytes]) -> bytes:
        """The entry's bytes, else what ``fetch`` returns (verified by the caller), kept
        here if the cache can take them: a manifest or hot list read once per node."""
        data = self.get(digest)
        if data is None:
            data = fetch()
            try:
                self.put(digest, data)
            except (OSError, NotCached) as exc:
                log.warning("could not cache %s: %s", digest, exc)
        return data

    def put_many(self, entries: Iterable[tuple[str, bytes]]) -> None:
        """Add entries whose digests the caller has verified, under one lock and one
        update of the count. A prefetch adds hundreds of blocks a second; alone, each add
        costs a lock, a read and a write of the count and two renames, about 1 ms on these
        machines and most of a prefetch's CPU (bench-image-cuda: 1,577 hot blocks).
        Entries are added in order while they fit; :class:`CacheFull` if some did not."""
        written: list[tuple[Path, str]] = []
        try:
            for digest, data in entries:
                final = self.path(digest)
                if final.is_file():
                    _touch(final)
                    continue
                written.append((self._write_temporary(digest, [data], None), digest))
            if written:
                self._add_files(written)
        finally:
            for tmp, _ in written:
                tmp.unlink(missing_ok=True)

    def put_stream(self, digest: str, chunks: Iterable[bytes], *,
                   verified: bool = False) -> None:
        """Add an entry from a stream of chunks, never holding it whole; unless the caller
        has ``verified`` it, it is hashed while written and kept only if it matches
        (:class:`IntegrityError` otherwise)."""
        final = self.path(digest)
        if final.is_file():
            _touch(final)
            return
        sha = None if verified else hashlib.sha256()
        tmp = self._write_temporary(digest, chunks, sha)
        try:
            if sha is not None and sha.hexdigest() != digest:
                raise IntegrityError(f"{digest}: the bytes do not match the digest; not "
                                     f"cached")
            self.add_file(tmp, digest)
        finally:
            tmp.unlink(missing_ok=True)

    def _write_temporary(self, digest: str, chunks: Iterable[bytes], sha) -> Path:
        """A new temporary holding ``chunks`` (hashed into ``sha`` unless None)."""
        tmp = self.new_temporary(digest)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                         os.O_CLOEXEC, self.mode)
            with open(fd, "wb") as f:
                for chunk in chunks:
                    if sha is not None:
                        sha.update(chunk)
                    f.write(chunk)
                f.flush()
                start_writeback(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def new_temporary(self, label: str) -> Path:
        """A fresh path for an entry being written by this process: named by its pid, so
        it is swept once the process is dead and never while it lives. Write it (create
        it exclusively), then :meth:`add_file` it, or unlink it."""
        self._mkdir(self._tmp)
        return self._tmp / f"{label}.{os.getpid()}.{secrets.token_hex(4)}"

    @contextlib.contextmanager
    def building(self, key: str) -> Iterator[None]:
        """Hold the lock of entry ``key``'s build for the ``with`` block: a second builder
        (a start's mount beside the warm that is unpacking the same snapshot, in this
        process or another) waits for the first, then finds its entry, instead of doing
        the same work beside it. A dead builder's lock is released with its process."""
        locks = self.directory / "building"
        self._mkdir(locks)
        with file_lock(locks / self.check_digest(key)):
            yield

    def add_tree(self, tmp: Path, key: str, size: int) -> None:
        """Rename the temporary directory ``tmp`` (:meth:`new_temporary`, holding the
        complete, checked files in ``tmp/tree``) into place as tree entry ``key``, counted
        as ``size`` bytes: a tree's bytes are not its directory's size, so they are written
        beside its files, where a recount finds them. As :meth:`add_file` otherwise."""
        (tmp / TREE_SIZE).write_text(str(size))
        self._add_files([(tmp, key)])

    def add_file(self, tmp: Path, digest: str, *, keep: Iterable[str] = ()) -> None:
        """Rename the complete temporary ``tmp`` (:meth:`new_temporary`, its bytes checked
        against ``digest`` by the caller) into place as entry ``digest`` and count it.

        Room is made first, least recently used entries first but none of ``keep`` (the
        other entries of one request); :class:`CacheFull` if there is no room even so (the
        entry is not added). So the limit holds at every instant, not only after an
        eviction. An entry that is there already is only marked used; ``tmp`` stays the
        caller's to remove.
        """
        self._add_files([(tmp, digest)], keep)

    def _add_files(self, items: list[tuple[Path, str]], keep: Iterable[str] = ()) -> None:
        """:meth:`add_file` for several temporaries at once: room is made for all of them,
        then they go in, in order, while they fit."""
        sized = [(tmp, digest, _size(tmp)) for tmp, digest in items]
        too_large = [n for _, _, n in sized if n > self.max_bytes]
        if too_large:
            raise CacheFull(f"{too_large[0]} bytes do not fit in a cache of {self.max_bytes}")
        with self.locked():
            new = []
            for tmp, digest, size in sized:
                final = self.path(digest)
                if os.path.lexists(final):  # another process added it meanwhile
                    _touch(final)
                else:
                    new.append((tmp, final, size))
            if not new:
                return
            usage = self._read_usage()
            if usage is None:  # never counted, or lost: count what is there
                usage = sum(n for _, n, _ in self._scan())
            wanted = sum(size for _, _, size in new)
            if usage + wanted > self.max_bytes:
                keep_paths = {self.path(d) for d in keep}
                usage = self._evict_locked(int(self.max_bytes * self.low_water) - wanted,
                                           keep_paths)
            fits, total = [], usage
            for tmp, final, size in new:
                if total + size <= self.max_bytes:
                    fits.append((tmp, final))
                    total += size
            self._write_usage(total)  # first: a crash leaves the count high, never low
            for tmp, final in fits:
                self._mkdir(final.parent)
                os.replace(tmp, final)
            if len(fits) < len(new):
                raise CacheFull(f"{wanted} bytes do not fit in {self.directory}: the "
                                f"entries to keep hold {usage} of {self.max_bytes}")

    def drop(self, digest: str) -> None:
        """Remove an entry (damaged, or stale) and its bytes from the count."""
        with self.locked():
            try:
                size = _size(self.path(digest))
                self._remove(self.path(digest))
            except FileNotFoundError:
                return
            counted = self._read_usage()
            if counted is not None:
                self._write_usage(max(0, counted - size))

    def _drop_quietly(self, digest: str) -> None:
        with contextlib.suppress(CacheBusy):  # else the next read finds it and drops it
            self.drop(digest)

    def usage(self) -> int:
        """The bytes entries hold, as counted on disk."""
        return self._read_usage() or 0

    # -- internals ------------------------------------------------------------------------

    def _evict_locked(self, target: int, keep: set[Path]) -> int:
        """Remove least recently used entries (none of ``keep``) until the cache holds at
        most ``target`` bytes, or only entries to keep; return what it holds."""
        self._sweep_temporaries()
        found = sorted(self._scan())
        total = sum(size for _, size, _ in found)
        for _, size, path in found:
            if total <= target:
                break
            if path in keep or (self.in_use is not None and path.is_dir()
                                and self.in_use(path)):
                continue
            with contextlib.suppress(FileNotFoundError):
                self._remove(path)
            total -= size
        return total

    def _remove(self, path: Path) -> None:
        """Remove an entry; a tree is first renamed out of ``entries`` (into a temporary
        of this process, swept if it dies mid-removal), so none is ever half there."""
        if not path.is_dir() or path.is_symlink():
            path.unlink()
            return
        doomed = self.new_temporary(path.name)
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def _scan(self) -> Iterator[tuple[float, int, Path]]:
        """(last use, size, path) of every entry."""
        if not self._entries.is_dir():
            return
        for shard in os.scandir(self._entries):
            if not shard.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(shard.path):
                try:
                    st = entry.stat(follow_symlinks=False)
                    size = _size(Path(entry.path)) if entry.is_dir(follow_symlinks=False) \
                        else st.st_size
                except FileNotFoundError:
                    continue
                yield st.st_mtime, size, Path(entry.path)

    def _sweep_temporaries(self) -> None:
        """Remove what writers that died left; a living writer's temporary stays."""
        for leftover in os.scandir(self._tmp) if self._tmp.is_dir() else ():
            pid = leftover.name.split(".")[-2] if leftover.name.count(".") >= 2 else ""
            if pid.isdigit() and pid_alive(int(pid)):
                continue
            if leftover.is_dir(follow_symlinks=False):  # a tree being built or removed
                shutil.rmtree(leftover.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover.path)

    def _read_usage(self) -> int | None:
        try:
            return int((self.directory / "usage").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _write_usage(self, usage: int) -> None:
        tmp = self.directory / f".usage.{os.getpid()}"
        tmp.write_text(str(usage))
        os.replace(tmp, self.directory / "usage")

    def _mkdir(self, path: Path) -> None:
        """``path`` and its parents up to the cache's directory, with the cache's mode."""
        if path.is_dir():
            return
        if path != self.directory:
            self._mkdir(path.parent)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=self._dir_mode)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cache's lock (not reentrant): adds, drops and evictions wait for it, so
        bookkeeping kept beside the entries (the checkpoint cache's records) can be kept
        in step with them. :class:`CacheBusy` if another process holds it too long."""
        if time.monotonic() < self._busy_until:
            raise CacheBusy(f"{self.directory}: its lock was taken for over {LOCK_TIMEOUT} s "
                            f"a moment ago; not waiting again yet")
        self._mkdir(self.directory)
        try:
            lock = file_lock(self.directory / "lock", timeout=LOCK_TIMEOUT)
            lock.__enter__()
        except BootseerError as exc:
            self._busy_until = time.monotonic() + BUSY_BACKOFF
            raise CacheBusy(f"{self.directory}: {exc}") from exc
        try:
            yield
        finally:
            lock.__exit__(None, None, None)


def _size(path: Path) -> int:
    """The bytes an entry holds: a file's size, or what its tree's builder counted."""
    if not path.is_dir() or path.is_symlink():
        return path.stat().st_size
    try:
        return int((path / TREE_SIZE).read_text())
    except (FileNotFoundError, ValueError):
        return 0  # damaged: it still goes, least recently used first


def _touch(entry: Path | int) -> None:
    """Mark an entry (its path, or an open descriptor) used now (its mtime orders
    eviction); best effort: a reader may not own it, and it may have just been evicted."""
    with contextlib.suppress(OSError):
        os.utime(entry)


def whole_files_beside(blocks: NodeCache) -> NodeCache:
    """The cache of image files kept whole (:mod:`bootseer.prefetch.wholefiles`) beside the
    block cache ``blocks``: ``<cache_dir>/files``, root's alone like the blocks, with the
    same limit, counted on its own. Its entries are named by a key over their blocks'
    digests, not by their own bytes': they are only ever opened unverified."""
    return NodeCache(blocks.directory.parent / "files", blocks.max_bytes, mode=0o600)


@dataclass(frozen=True)
class NodeCaches:
    """Where a node's caches live and how large each may grow, as the config places them:
    the one place that opens them, for the CLI, the agent, the warmers, the mount servers
    and every read that looks for a staged copy. Opening creates nothing (a reader without
    write access finds what is there), so each is opened where it is used."""

    cache_dir: Path
    block_bytes: int  # image.cache_size
    shard_bytes: int  # snapshot.cache_size
    checkpoint_bytes: int  # checkpoint.cache_size

    @classmethod
    def for_config(cls, config: Config) -> NodeCaches:
        return cls(Path(config.cache_dir), config.image.cache_size,
                   config.snapshot.cache_size, config.checkpoint.cache_size)

    def blocks(self) -> NodeCache:
        """Image blocks: root's alone, since they are the content of every tenant's
        images."""
        return NodeCache(self.cache_dir / "blocks", self.block_bytes, mode=0o600)

    def snapshots(self) -> NodeCache:
        """Snapshot shards and manifests, readable by the unprivileged restores of a
        training script."""
        return NodeCache(self.cache_dir / "snapshots", self.shard_bytes,
                         in_use=overlays_reading)

    @property
    def checkpoints(self) -> Path:
        """The checkpoint cache's directory: its copies (:meth:`checkpoint_copies`) and
        the records naming them (:mod:`bootseer.stripedfs.checkpoint_cache`)."""
        return self.cache_dir / "checkpoints"

    def checkpoint_copies(self) -> NodeCache:
        """Checkpoint copies: entries get their source's readers when staged, so the
        directories must let those readers through."""
        return NodeCache(self.checkpoints / "copies", self.checkpoint_bytes, mode=0o644)


#: sync_file_range(2): start writing the range's dirty pages back, do not wait.
_SYNC_FILE_RANGE_WRITE = 2


@functools.cache
def _sync_file_range() -> Callable[..., int]:
    function = ctypes.CDLL(None, use_errno=True).sync_file_range
    function.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    return function


def start_writeback(fd: int) -> None:
    """Start writing ``fd``'s dirty pages to disk, without waiting for them.

    A start adds its blocks to the cache as it runs. Left dirty, they are written when
    something syncs their file system, and what syncs it waits for all of them: unmounting
    an overlay whose upper is there does, Docker's unmount of the container it removes at
    the end of a lazy start among them. In bench-image, `docker run`'s exit after the
    container's release took 0.78 s without a prefetch and 0.67 s with one (78 MB of hot
    blocks); written back as they come, 0.24 s and 0.41 s. Best effort: where it fails,
    the kernel's own writeback is left to do it."""
    _sync_file_range()(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)

"""Restore a snapshot: stage every target beside itself, verify, then switch it in.

For each target ``/p/T`` the new state is built in ``/p/.T.bootseer-new``: a hard-link
clone of the current ``T`` (directories recreated, files linked, never written: every
changed file is a fresh inode), the deletions applied, then the shards fetched, decompressed
and extracted in parallel (a thread pool, one shard per task), every file checked against
the manifest's size as it is written and every shard against the manifest's digest at its
end (so every byte written comes from checked bytes), then hard links, then directory modes
and mtimes, deepest first. Only when *all* targets are staged and verified does the switch
start: per target, one ``renameat2(RENAME_EXCHANGE)`` of the staging directory and ``T``
(a plain rename when ``T`` did not exist), then the old tree is removed.

The guarantee, per target: ``T`` is at every instant either its complete previous state or
its complete restored state. A failure or a crash before the switch (a bad shard, a full
disk, SIGKILL) leaves every target untouched. A crash during the switch phase can leave
the targets switched before it restored and the ones after it previous; running the
restore again completes it, because a snapshot is a delta and applying it to its own result
changes nothing. Leftovers of a crashed restore (staging and old trees) are removed by the
next restore of the same target, under a lock (``/p/.T.bootseer-lock``) that also keeps
two restores of one target on one node apart. Where the file system cannot exchange
(``EINVAL``), ``T`` is renamed to ``/p/.T.bootseer-old`` and the staging directory to
``T``; a crash between the two leaves only the old tree, which the next restore renames
back first.

Writes are confined to the staging directory: manifest paths are checked when it is
decoded (:mod:`bootseer.snapshot.manifest`), tar members must be exactly the manifest's, and every
parent of a path written or deleted must be a real directory (never a symlink) in the
staging tree, so a snapshot cannot write through a link out of its target.

A snapshot restores where it was captured; with ``relocate=True`` it may be restored under
other directories (``targets``, one per captured target, in order), its absolute paths
rewritten by :mod:`bootseer.snapshot.relocate` in the staging directory, after verification.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import io
import logging
import os
import pickle
import shutil
import signal
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import zstandard

from bootseer.errors import BootseerError, IntegrityError, InvalidRangeError
from bootseer.filelock import file_lock
from bootseer.nodecache import NodeCache
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.manifest import Manifest, SnapEntry, UnsafeSnapshotError
from bootseer.snapshot.relocate import Relocation, Watch
from bootseer.snapshot.shardcache import cached_manifest, store_manifest
from bootseer.snapshot.tarstream import MalformedStream, TarStream, TruncatedStream
from bootseer.store import BlobStore, Ref
from bootseer.store.blobs import is_digest

log = logging.getLogger(__name__)

#: Test hook: SIGKILL this process at the named point ("staged", "switched-one",
#: "exchanged") to prove a crash there leaves a consistent state.
CRASH_ENV = "BOOTSEER_SNAPSHOT_CRASH_AT"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@dataclass(frozen=True)
class RestoreResult:
    key: str
    targets: tuple[str, ...]
    files: int
    bytes: int
    shards: int
    seconds: float
    relocated: int = 0  # files rewritten for a new prefix
    mounted: bool = False  # mounted over the node's tree (bootseer.snapshot.mount)


class FirstShards:
    """The shards a restore reads first, opened as soon as the manifest's bytes are in
    (its reference names them: ``first_shards`` in its metadata), their first read begun
    at once: their bytes cross the link while the manifest is decoded and the directories
    staged, which otherwise leave it idle (bench-env probe: 0.38 s of a 5.3 s restore).

    The names are a hint and nothing more. A stream is only used for a shard the manifest
    lists, and it is checked against that digest at its end like any other; one the
    restore does not use is closed after that first read (``limit`` reads of
    :data:`~bootseer.store.blobs.STREAM_READ` bytes at most, whatever the hint says).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._streams: dict[str, BinaryIO] = {}

    def open(self, blobs: BlobStore, ref: Ref) -> None:
        hint = ref.meta.get("first_shards")
        if not isinstance(hint, list):  # published before the hint, or not a list
            return
        for digest in hint[: self.limit]:
            if isinstance(digest, str) and is_digest(digest) and digest not in self._streams:
                with contextlib.suppress(OSError):  # the restore's own open reports it
                    self._streams[digest] = blobs.open(digest, start=True)

    def take(self, digest: str) -> BinaryIO | None:
        """The stream opened for ``digest``, once; None if there is none."""
        return self._streams.pop(digest, None)

    def close(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()

    def __enter__(self) -> FirstShards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def manifest_blob(blobs: BlobStore, key: str,
                  first: FirstShards | None = None) -> tuple[str, bytes]:
    """The digest and bytes of snapshot ``key``'s manifest in the store; ``first`` opens
    the shards its reference names before the manifest is decoded."""
    ref, data = store_manifest(blobs, key)
    if first is not None:  # after the manifest: on a shared link, it would queue behind them
        first.open(blobs, ref)
    return ref.digest, data


def load_manifest(blobs: BlobStore, key: str, cache: NodeCache | None = None,
                  first: FirstShards | None = None) -> Manifest:
    """Snapshot ``key``'s manifest: from the node's snapshot cache when a warm staged it
    there (:mod:`bootseer.snapshot.shardcache`), else from the store, opening ``first`` on
    the way. A restore on a warmed node so reads nothing from the store and never even
    connects to it."""
    cached = cached_manifest(cache, key) if cache is not None else None
    if cached is not None:
        return cached
    return Manifest.decode(manifest_blob(blobs, key, first)[1], key)


def crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _sidecar(target: str, what: str) -> str:
    parent, name = os.path.split(target)
    return os.path.join(parent, f".{name}.bootseer-{what}")


def remove_tree(path: str) -> None:
    """``rm -rf``, read-only directories included; absent is fine."""
    def make_writable(func, failed, _exc) -> None:
        parent = os.path.dirname(failed)
        os.chmod(parent, stat.S_IMODE(os.lstat(parent).st_mode) | 0o700)
        func(failed)

    try:
        mode = os.lstat(path).st_mode  # one call: this runs for every restored entry
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path, onerror=make_writable)
    else:
        os.unlink(path)


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths; False when this system or file system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS):
        return False
    raise OSError(err, os.strerror(err), a, None, b)


def recover(target: str) -> None:
    """Undo what a crashed restore of ``target`` left (call under the target's lock)."""
    old, new = _sidecar(target, "old"), _sidecar(target, "new")
    if os.path.lexists(old):
        if os.path.lexists(target):
            remove_tree(old)
        else:
            log.warning("%s: a restore was interrupted mid-switch; putting back the "
                        "previous state", target)
            os.rename(old, target)
    remove_tree(new)


def _lchown(path: str, uid: int, gid: int) -> None:
    if os.geteuid() == 0 and (uid, gid) != (0, os.getegid()):  # new files are ours already
        os.lchown(path, uid, gid)


class _Stage:
    """One target's staging directory and what is needed to finish its directories: beside
    the target, or ``root`` (a layer's, :func:`stage_layer`)."""

    def __init__(self, target: str, root: str | None = None, *, layer: bool = False) -> None:
        self.target, self.root = target, root or _sidecar(target, "new")
        self.dirs: dict[str, tuple[int, int, int, int]] = {}  # rel -> mode, uid, gid, mtime
        self._safe: set[str] = {""}
        # Staged from nothing (no current target): only this restore's own directories are
        # there, and manifest paths are unique, so there is never anything to clear.
        self.from_nothing = False
        # A layer's stage (stage_layer), staged from nothing: a parent the snapshot did not
        # change is made here, and listed, for whoever mounts the layer to check and to
        # give the target's attributes (it is in the target, as a restore requires).
        self.layer = layer
        self.made_parents: list[str] = []

    def path(self, rel: str) -> str:
        return self.root if rel == "." else os.path.join(self.root, rel)

    def check_parents(self, rel: str) -> None:
        """Every parent of ``rel`` must be a real directory: never write through a link."""
        parent = rel.rpartition("/")[0] if rel != "." else ""
        todo = []
        while parent not in self._safe:
            todo.append(parent)
            parent = parent.rpartition("/")[0]
        for p in reversed(todo):
            try:
                st = os.lstat(self.path(p))
            except FileNotFoundError:
                if not self.layer:
                    raise BootseerError(
                        f"{os.path.join(self.target, p)} is missing: this target does not "
                        f"match the state the snapshot was captured on") from None
                with contextlib.suppress(FileExistsError):  # else another shard's thread
                    os.mkdir(self.path(p), 0o755)
                    self.made_parents.append(p)
                st = os.lstat(self.path(p))
            if stat.S_ISLNK(st.st_mode):
                raise UnsafeSnapshotError(f"{os.path.join(self.target, p)} is a symlink here; "
                                          f"restoring below it would write outside the target")
            if not stat.S_ISDIR(st.st_mode):
                raise BootseerError(f"{os.path.join(self.target, p)} is not a directory here")
            self._safe.add(p)

    def clear(self, rel: str) -> None:
        """Make room for a new entry at ``rel`` (never modify a linked inode in place)."""
        self.check_parents(rel)
        if not self.from_nothing:
            remove_tree(self.path(rel))

    def clone_current(self) -> None:
        """The current target as hard links; directories are new, their metadata kept."""
        src_root = self.target

        def walk(rel: str) -> None:
            src = src_root if rel == "." else os.path.join(src_root, rel)
            st = os.lstat(src)
            os.mkdir(self.path(rel), 0o700)
            self.dirs[rel] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns)
            with os.scandir(src) as it:
                children = [e.name for e in it]
            for name in children:
                child = name if rel == "." else f"{rel}/{name}"
                s, d = os.path.join(src, name), self.path(child)
                cst = os.lstat(s)
                if stat.S_ISDIR(cst.st_mode):
                    walk(child)
                elif stat.S_ISLNK(cst.st_mode):
                    os.symlink(os.readlink(s), d)
                    _lchown(d, cst.st_uid, cst.st_gid)
                    os.utime(d, ns=(cst.st_atime_ns, cst.st_mtime_ns), follow_symlinks=False)
                elif stat.S_ISSOCK(cst.st_mode):
                    log.warning("%s: a socket; not carried into the restored target", s)
                else:
                    try:
                        os.link(s, d, follow_symlinks=False)
                    except PermissionError:  # protected_hardlinks: someone else's file
                        shutil.copy2(s, d, follow_symlinks=False)

        walk(".")

    def whiteout(self, rel: str) -> None:
        """Mark ``rel`` deleted, in a layer: overlayfs's whiteout, a 0/0 character device."""
        self.check_parents(rel)
        os.mknod(self.path(rel), stat.S_IFCHR | 0o600, os.makedev(0, 0))

    def make_dir(self, entry: SnapEntry) -> None:
        path = self.path(entry.path)
        if entry.path != ".":
            self.check_parents(entry.path)
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:  # cloned from the target: replaced unless a directory
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    remove_tree(path)
                    os.mkdir(path, 0o700)
            else:
                if self.from_nothing:  # made here, in a staging only this restore writes
                    self._safe.add(entry.path)
        self.dirs[entry.path] = (entry.mode, entry.uid, entry.gid, entry.mtime_ns)

    def finish_dirs(self) -> None:
        for rel in sorted(self.dirs, key=lambda r: (r != ".", r.count("/")), reverse=True):
            mode, uid, gid, mtime_ns = self.dirs[rel]
            path = self.path(rel)
            if not stat.S_ISDIR(_lstat_mode(path)):  # a cloned directory deleted or replaced
                continue
            _lchown(path, uid, gid)
            os.chmod(path, mode)
            os.utime(path, ns=(mtime_ns, mtime_ns))


def _lstat_mode(path: str) -> int:
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return 0


def _set_meta(path: str, entry: SnapEntry) -> None:
    _lchown(path, entry.uid, entry.gid)
    if entry.kind != "symlink":
        os.chmod(path, entry.mode)
    os.utime(path, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)


#: Shard streams opened beyond one per extraction thread. Enough that the link still
#: carries bytes while every thread writes files; few enough that the shards needed next
#: are not starved by those after them (all streams share the link alike). bench-env, full
#: preset, 100 MB/s, 2 threads: 0 more 4.74 s, 4 more 4.45 s, 10 more 5.12 s.
OPEN_AHEAD = 4


class _ShardStreams:
    """The shards' streams in read order, each opened ``depth`` shards before an
    extraction thread takes it (:data:`OPEN_AHEAD` more than the threads), its first read
    under way: the link carries the next shards' bytes while the threads write files,
    instead of waiting for a thread to finish one. (One stream per thread leaves the link
    idle whenever every thread is writing: bench-env, full preset, 100 MB/s, 4 threads:
    4.81 s, then 4.50 s with a stream opened ahead per thread.) A stream is opened by
    ``first`` already, or from the node's snapshot cache (``bootseer warm --env``), else
    from the store; it is checked against its digest at its end, which
    :func:`_extract_shard` reads to. At most ``depth`` streams wait untaken, each with one
    :data:`~bootseer.store.blobs.STREAM_READ` read under way."""

    def __init__(self, blobs: BlobStore, cache: NodeCache | None, first: FirstShards | None,
                 order: list[str], depth: int) -> None:
        self._blobs, self._cache, self._first = blobs, cache, first
        self._order, self._depth = order, depth
        self._opened: dict[str, BinaryIO] = {}
        self._next = 0  # the position in order of the next shard to open ahead
        self._lock = threading.Lock()

    def _open(self, digest: str) -> BinaryIO:
        opened = self._first.take(digest) if self._first is not None else None
        if opened is not None:
            return opened
        cached = (self._cache.open(digest.removeprefix("sha256:"))
                  if self._cache is not None else None)
        return cached if cached is not None else self._blobs.open(digest, start=True)

    def take(self, digest: str) -> BinaryIO:
        """``digest``'s stream (the caller closes it), the shards ``depth`` after it opened."""
        with self._lock:
            stream = self._opened.pop(digest, None)
            if stream is None:  # needed now: before those ahead
                stream = self._open(digest)
            position = self._order.index(digest)
            self._next = max(self._next, position + 1)
            while self._next < min(len(self._order), position + 1 + self._depth):
                ahead = self._order[self._next]
                self._next += 1
                with contextlib.suppress(OSError):  # its own take() opens it and reports
                    self._opened.setdefault(ahead, self._open(ahead))
        return stream

    def close(self) -> None:
        """Close the streams nobody took (a failed restore)."""
        with self._lock:
            for stream in self._opened.values():
                stream.close()
            self._opened.clear()


def _extract_shard(opened: Callable[[], BinaryIO], manifest: Manifest, number: int,
                   expected: dict[str, SnapEntry], stages: list[_Stage],
                   on_progress: Callable[[int], None] | None,
                   relocation: Relocation | None = None) -> None:
    """Unpack shard ``number`` from the stream ``opened()`` returns (closed here)."""
    seen: set[str] = set()
    try:
        with opened() as raw, zstandard.ZstdDecompressor().stream_reader(raw) as stream:
            tar = TarStream(stream)
            for member in tar:
                entry = expected.get(member.name)
                if entry is None or member.name in seen:
                    raise UnsafeSnapshotError(
                        f"snapshot {manifest.key}: shard {number} holds {member.name!r}, "
                        f"which the manifest does not place there; nothing was restored")
                seen.add(member.name)
                if member.kind != entry.kind or member.link != (entry.link or "") \
                        or member.size != entry.size:
                    raise IntegrityError(f"snapshot {manifest.key}: shard {number}: "
                                         f"{member.name} is not the manifest's {entry.kind}")
                stage = stages[entry.target]
                stage.clear(entry.path)
                path = stage.path(entry.path)
                if entry.kind == "symlink":
                    link = entry.link or ""
                    os.symlink(relocation.link(link) if relocation else link, path)
                    _set_meta(path, entry)
                    continue
                watch = relocation.watch() if relocation else None
                _write_file(tar.content(), path, entry, manifest.key, watch)
                if on_progress:
                    on_progress(entry.size)
                if relocation and watch:
                    relocation.apply(path, entry.path, os.path.join(stage.target, entry.path),
                                     watch)
                    _set_meta(path, entry)  # a rewrite changed the mtime
            while raw.read(1 << 20):  # to the end: the shard is checked there
                pass
    except (zstandard.ZstdError, MalformedStream, EOFError, InvalidRangeError) as exc:
        raise _corrupt(manifest, number, exc) from exc
    missing = expected.keys() - seen
    if missing:
        raise IntegrityError(f"snapshot {manifest.key}: shard {number} lacks "
                             f"{len(missing)} entries, e.g. {sorted(missing)[0]!r}")


#: Extract in forked worker processes (one per thread the restore would use) rather than
#: in threads, whose Python work between system calls takes turns on the GIL. A restore
#: from local disk on 2 cores (a fresh ext4): the jupyter preset's 18k files in 0.80 s
#: and 1.33 s of CPU with 2 processes, against 1.24 s and 1.83 s with 2 threads (``tar -x``
#: of the tree: 0.80 s); the full preset's in 2.3 s and 3.8 s, against 2.6-2.9 s and
#: 4.3-4.6 s. A relocated restore keeps to threads (its rewrites are counted here).
PROCESSES = True
_FRAME = struct.Struct("<i")  # a shard's number, then frames of its bytes: length, bytes
_PIPE_BYTES = 1 << 20


class _PipedShard(io.RawIOBase):
    """A shard's bytes as the parent writes them to a worker's pipe, in frames that end
    with an empty one: the parent sends that only after the shard passed its digest
    check, so a worker never reports a shard done that the store did not vouch for."""

    def __init__(self, pipe: BinaryIO) -> None:
        self._pipe, self._left, self._ended = pipe, 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if self._ended:
            return 0
        if not self._left:
            self._left = _read_int(self._pipe)
            if not self._left:
                self._ended = True
                return 0
        view = memoryview(buffer).cast("B")[: self._left]
        got = self._pipe.readinto(view)
        if not got:
            raise TruncatedStream("the restore's parent stopped sending a shard")
        self._left -= got
        return got


def _read_int(pipe: BinaryIO) -> int:
    data = pipe.read(_FRAME.size)
    if len(data) != _FRAME.size:
        raise TruncatedStream("the restore's parent stopped sending shards")
    return _FRAME.unpack(data)[0]


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _send(fd: int, message: object) -> None:
    data = pickle.dumps(message)
    os.write(fd, _FRAME.pack(len(data)))
    _write_all(fd, data)


def _worker(data_fd: int, result_fd: int, manifest: Manifest,
            per_shard: list[dict[str, SnapEntry]], stages: list[_Stage]) -> int:
    """(In a forked worker) unpack the shards the parent sends until it sends -1; report
    each one done, then the parents a layer's stages made here, or the first error."""
    pipe = open(data_fd, "rb", buffering=_PIPE_BYTES)  # noqa: SIM115
    inherited = [len(stage.made_parents) for stage in stages]  # the parent has those
    try:
        def shard() -> BinaryIO:
            return io.BufferedReader(_PipedShard(pipe), _PIPE_BYTES)  # type: ignore[return-value]

        while (number := _read_int(pipe)) >= 0:
            _extract_shard(shard, manifest, number, per_shard[number], stages, None)
            _send(result_fd, ("shard", number))
        _send(result_fd, ("parents", [stage.made_parents[n:]
                                      for stage, n in zip(stages, inherited)]))
        return 0
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        with contextlib.suppress(Exception):
            _send(result_fd, ("error", exc))
        return 1


@dataclass
class _Worker:
    pid: int
    data: int  # the parent's end of the shard pipe
    results: BinaryIO  # the parent's end of the result pipe


def _extract_in_processes(streams: _ShardStreams, manifest: Manifest, order: list[int],
                          per_shard: list[dict[str, SnapEntry]], stages: list[_Stage],
                          on_progress: Callable[[int], None] | None, count: int) -> None:
    """Unpack the shards in ``count`` forked workers. The parent keeps the store (its
    client's threads do not survive a fork) and the link: a feeder thread per worker takes
    the next shard in read order, streams its bytes (checked against the digest at the
    end) down the worker's pipe, and takes another as soon as the pipe has room; so a
    worker that finishes early is given more. The first error, the parent's or a worker's,
    stops every worker and is raised."""
    workers: list[_Worker] = []
    for _ in range(count):
        data_r, data_w = os.pipe()
        result_r, result_w = os.pipe()
        with contextlib.suppress(OSError):  # Linux: a deeper pipe, fewer wake-ups
            fcntl.fcntl(data_w, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        pid = os.fork()
        if pid == 0:  # the worker: only its own ends, then never back into the caller
            code = 1
            try:
                os.close(data_w)
                os.close(result_r)
                for other in workers:
                    os.close(other.data)
                    other.results.close()
                code = _worker(data_r, result_w, manifest, per_shard, stages)
            finally:
                os._exit(code)
        os.close(data_r)
        os.close(result_w)
        workers.append(_Worker(pid, data_w, open(result_r, "rb")))  # noqa: SIM115
    pending = iter(order)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def stop_all() -> None:
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)

    def feed(worker: _Worker) -> None:
        try:
            while True:
                with lock:
                    number = next(pending, -1)
                os.write(worker.data, _FRAME.pack(number))
                if number < 0:
                    return
                shard = manifest.shards[number]
                try:
                    with streams.take(shard.digest) as raw:
                        # read1: what has crossed the link, at once (store.base._Ahead)
                        while chunk := raw.read1(_PIPE_BYTES):
                            os.write(worker.data, _FRAME.pack(len(chunk)))
                            _write_all(worker.data, chunk)
                except (EOFError, InvalidRangeError) as exc:
                    raise _corrupt(manifest, number, exc) from exc
                os.write(worker.data, _FRAME.pack(0))
        except BrokenPipeError:
            return  # the worker died: its result pipe says why
        except BaseException as exc:
            errors.append(exc)
            stop_all()
        finally:
            os.close(worker.data)

    def collect(worker: _Worker) -> None:
        try:
            while size := worker.results.read(_FRAME.size):
                try:
                    kind, value = pickle.loads(worker.results.read(_FRAME.unpack(size)[0]))
                except Exception as exc:  # noqa: BLE001 - killed midway through a report
                    errors.append(BootseerError(
                        f"snapshot {manifest.key}: a restore worker ({worker.pid}) "
                        f"stopped midway through a report ({exc}); nothing was switched in"))
                    stop_all()
                    return
                if kind == "shard" and on_progress:
                    on_progress(sum(e.size for e in per_shard[value].values()
                                    if e.kind == "file"))
                elif kind == "parents":
                    for stage, made in zip(stages, value):
                        stage.made_parents.extend(made)
                elif kind == "error":
                    errors.append(value)
                    stop_all()
        finally:
            worker.results.close()

    threads = [threading.Thread(target=job, args=(worker,), name=f"restore-{job.__name__}")
               for worker in workers for job in (feed, collect)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [w.pid for w in workers if os.waitpid(w.pid, 0)[1] != 0]
    if errors:
        raise errors[0]
    if failed:
        raise BootseerError(f"snapshot {manifest.key}: a restore worker ({failed[0]}) "
                            f"died; nothing was switched in")


def _corrupt(manifest: Manifest, number: int, exc: Exception) -> IntegrityError:
    return IntegrityError(f"snapshot {manifest.key}: shard {number} "
                          f"({manifest.shards[number].digest}) is truncated or corrupt: {exc}")


def _write_file(content: Iterator[memoryview], path: str, entry: SnapEntry, key: str,
                watch: Watch | None = None) -> None:
    """Write the file, checking its size against the manifest, and give it the manifest's
    owner, mode and mtime through the open descriptor (no path lookups: tens of thousands
    of files make per-file system calls count).

    Its content is not hashed: it is the output of a shard that is checked as a whole
    against the manifest's digest for it (the stream raises at its end), and hashing every
    file again would cost a restore a sixth of its CPU (bench-env: 1.5 GB at 1 GB/s)."""
    size = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        for view in content:
            size += len(view)
            if watch:
                watch.see(view)
            _write_all(fd, view)
        if os.geteuid() == 0 and (entry.uid, entry.gid) != (0, os.getegid()):
            os.fchown(fd, entry.uid, entry.gid)
        os.fchmod(fd, entry.mode)
        os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
    finally:
        os.close(fd)
    if size != entry.size:
        raise IntegrityError(f"snapshot {key}: {entry.member} does not match the manifest "
                             f"({size} bytes; expected {entry.size})")


@contextmanager
def locked_targets(targets: tuple[str, ...]) -> Iterator[None]:
    """Hold the targets' locks: one restore (or mount) of a target at a time on the node."""
    with ExitStack() as stack:
        for target in sorted(targets):
            stack.enter_context(file_lock(Path(_sidecar(target, "lock"))))
        yield


def restore(blobs: BlobStore, manifest: Manifest, *, targets: tuple[str, ...] | None = None,
            relocate: bool = False, options: SnapshotOptions | None = None,
            on_progress: Callable[[int], None] | None = None,
            cache: NodeCache | None = None,
            first: FirstShards | None = None) -> RestoreResult:
    """Restore ``manifest`` where it was captured, or with ``relocate`` under ``targets``
    (see the module doc for the guarantee), ``options.concurrency`` shards at once; shards
    staged in ``cache`` are read from it, and those ``first`` opened (:func:`load_manifest`)
    from their streams."""
    concurrency = (options or SnapshotOptions()).concurrency
    targets, relocation = _relocation(manifest, targets, relocate)
    started = time.monotonic()
    with locked_targets(targets):
        for target in targets:
            recover(target)
        stages = [_Stage(t) for t in targets]
        try:
            _stage_all(blobs, manifest, stages, concurrency, on_progress, relocation, cache,
                       first)
        except BaseException:
            for stage in stages:
                remove_tree(stage.root)
            raise
        if relocation:
            relocation.report()
        crash_point("staged")
        for number, stage in enumerate(stages):
            if number:
                crash_point("switched-one")
            _switch(stage)
    files = sum(1 for e in manifest.entries if e.kind != "dir")
    return RestoreResult(manifest.key, targets, files, manifest.content_bytes,
                         len(manifest.shards), time.monotonic() - started,
                         relocation.rewritten if relocation else 0)


def _relocation(manifest: Manifest, targets: tuple[str, ...] | None, relocate: bool
                ) -> tuple[tuple[str, ...], Relocation | None]:
    """The directories to restore to, and the relocation to them if they are new ones."""
    old = manifest.targets
    if targets is None:
        return old, None
    targets = tuple(os.path.normpath(t) for t in targets)
    if len(targets) != len(old):
        raise BootseerError(
            f"snapshot {manifest.key} was captured for {len(old)} target(s) "
            f"({', '.join(old)}); give exactly one --path per target, in that order "
            f"(got {len(targets)})")
    if targets == old:
        return old, None
    if not relocate:
        moved = ", ".join(f"{o} -> {n}" for o, n in zip(old, targets) if o != n)
        raise BootseerError(
            f"snapshot {manifest.key} was captured for {', '.join(old)}; restoring it "
            f"under another prefix ({moved}) needs relocation: pass --relocate to rewrite "
            f"its absolute paths (script shebangs, pyvenv.cfg, activate scripts, .pth "
            f"files, ...) for the new location; nothing was restored")
    if not all(t.startswith("/") for t in targets) or len(set(targets)) != len(targets):
        raise BootseerError(f"relocation targets must be distinct absolute paths: "
                            f"{', '.join(targets)}")
    return targets, Relocation(old, targets)


def stage_layer(blobs: BlobStore, manifest: Manifest, root: str, *,
                options: SnapshotOptions | None = None,
                on_progress: Callable[[int], None] | None = None,
                cache: NodeCache | None = None,
                first: FirstShards | None = None) -> list[list[str]]:
    """Unpack ``manifest`` below ``root`` as an overlayfs layer: each target at its
    absolute path, what it changed as files, and each deletion a whiteout. Checked as a
    restore is (a shard that does not match raises, leaving ``root`` to the caller).
    Returns, per target, the directories it made that the snapshot did not change (the
    parents of files changed in place), parents first."""
    stages = [_Stage(t, os.path.join(root, t.lstrip("/")), layer=True)
              for t in manifest.targets]
    _stage_all(blobs, manifest, stages, (options or SnapshotOptions()).concurrency,
               on_progress, None, cache, first)
    return [sorted(stage.made_parents, key=lambda r: r.count("/")) for stage in stages]


def _stage_all(blobs: BlobStore, manifest: Manifest, stages: list[_Stage], concurrency: int,
               on_progress: Callable[[int], None] | None,
               relocation: Relocation | None = None,
               cache: NodeCache | None = None,
               first: FirstShards | None = None) -> None:
    for stage in stages:
        os.makedirs(os.path.dirname(stage.root), exist_ok=True)
        if stage.layer:  # from nothing: what is below it stays in the layers under it
            os.mkdir(stage.root, 0o700)
            stage.from_nothing = True
            stage.dirs["."] = (0o755, 0, 0, time.time_ns())
        elif os.path.lexists(stage.target):
            if not os.path.isdir(stage.target) or os.path.islink(stage.target):
                raise BootseerError(f"{stage.target} exists and is not a directory")
            stage.clone_current()
        else:
            os.mkdir(stage.root, 0o700)
            stage.from_nothing = True
            stage.dirs["."] = (0o755, os.getuid(), os.getgid(), time.time_ns())
    for deletion in manifest.deleted:
        if not stages[deletion.target].layer:
            stages[deletion.target].clear(deletion.path)
    for entry in manifest.entries:
        if entry.kind == "dir":
            stages[entry.target].make_dir(entry)
    for deletion in manifest.deleted:  # in a layer: once the directories are there
        if stages[deletion.target].layer:
            stages[deletion.target].whiteout(deletion.path)
    per_shard: list[dict[str, SnapEntry]] = [{} for _ in manifest.shards]
    for entry in manifest.entries:
        if entry.shard is not None and entry.kind != "dir" and entry.kind != "hardlink":
            per_shard[entry.shard][entry.member] = entry
    order = manifest.read_order()
    streams = _ShardStreams(blobs, cache, first, [manifest.shards[n].digest for n in order],
                            max(1, concurrency) + OPEN_AHEAD)
    try:
        if concurrency > 1 and relocation is None and PROCESSES:
            _extract_in_processes(streams, manifest, order, per_shard, stages, on_progress,
                                  concurrency)
        else:
            with ThreadPoolExecutor(max(1, concurrency)) as pool:
                futures = [pool.submit(_extract_shard,
                                       functools.partial(streams.take,
                                                         manifest.shards[n].digest),
                                       manifest, n, per_shard[n], stages, on_progress,
                                       relocation)
                           for n in order]
                for future in futures:
                    future.result()
    finally:
        streams.close()
    for entry in manifest.entries:
        if entry.kind == "hardlink":
            stage = stages[entry.target]
            stage.clear(entry.path)
            os.link(stage.path(entry.link or ""), stage.path(entry.path))
    for stage in stages:
        stage.finish_dirs()


def _switch(stage: _Stage) -> None:
    target, new = stage.target, stage.root
    if not os.path.lexists(target):
        os.rename(new, target)
        return
    if _exchange(new, target):
        crash_point("exchanged")
        remove_tree(new)  # now the previous tree
        return
    old = _sidecar(target, "old")
    os.rename(target, old)
    os.rename(new, target)
    remove_tree(old)

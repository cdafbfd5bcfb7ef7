"""``hdfs://namenode:port/path``: HDFS through hdfs-native, a client of HDFS's own RPC and
data-transfer protocols written in Rust, with no JVM.

This is the path production clusters use: NameNode RPC, reads straight from the DataNodes
with their CRC checksums verified, positional reads that fetch only the bytes asked for.
It replaced libhdfs (Hadoop's Java client over JNI), whose JVM every process paid at its
first connection, before a byte could cross the link: 0.4 s and 0.5 s of CPU at the start
of each restore, FUSE server and checkpoint load, against 0.013 s and 0.03 s of CPU here
(``bench-env``'s cold restore waited on it). Reading is cheaper too: 1 GiB from the dev
cluster into a reused buffer costs 1.3-1.4 s of CPU (checksums verified), libhdfs 2.7 s
(and that only with our writers choosing CRC32, an intrinsic of the JVM, over CRC32C).

Configuration is Hadoop's: ``core-site.xml`` and ``hdfs-site.xml`` from
``HADOOP_CONF_DIR`` (name services, HA NameNodes, ``dfs.client.use.datanode.hostname``).
The HDFS user is ``hdfs.user``, else ``HADOOP_USER_NAME``, else this process's user. The
client reads it from the environment at each connection, so ``hdfs.user`` sets
``HADOOP_USER_NAME`` for the process (and the children it starts), and while a store acting
as one user is open, a store for another is refused rather than silently acting as the
first. Kerberos (``hdfs.kerberos = true``): GSSAPI through the system's
``libgssapi_krb5``, with the ticket cache named by ``KRB5CCNAME`` (from ``kinit``); there
is no KDC on the development machines, so it is untested.
"""

from __future__ import annotations

import errno
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TypeVar

import hdfs_native  # missing: the registry's BackendUnavailableError says what to install

from bootseer.errors import BackendUnavailableError, InvalidRangeError
from bootseer.store.base import Perm, Progress, WriteInterrupted
from bootseer.store.hadoop import HadoopStyleStore, OutputFile, PathInfo

_T = TypeVar("_T")

#: The environment variable the client takes its (simple authentication) user from.
USER_VARIABLE = "HADOOP_USER_NAME"
_user_lock = threading.Lock()
_stores_with_user: weakref.WeakSet[HdfsStore] = weakref.WeakSet()


class HdfsStore(HadoopStyleStore):
    """A store under a directory of HDFS."""

    protocols = ("hdfs",)
    default_port = 8020
    renames_over = True

    def __init__(
        self,
        url: str,
        *,
        user: str | None = None,
        replication: int | None = None,
        block_size: int | None = None,
        kerberos: bool = False,
    ) -> None:
        super().__init__(url)
        self.user = user
        if user is not None:
            _act_as(self, user)
        self._write = hdfs_native.WriteOptions(replication=replication, block_size=block_size,
                                               overwrite=True, create_parent=True)
        config = {"hadoop.security.authentication": "kerberos"} if kerberos else None
        try:
            # Connects on the first call: a process that finds everything on the node (a
            # warmed restore, say) never opens a connection.
            self._client = hdfs_native.Client(
                f"hdfs://{self.host}:{self.port}", config,
                kerberos_cache=os.environ.get("KRB5CCNAME") if kerberos else None)
        except Exception as exc:
            raise BackendUnavailableError(f"cannot open {self.url}: {exc}") from exc

    def _fs_info(self, path: str) -> PathInfo | None:
        status = self._status(path)
        return None if status is None else _path_info(status)

    def _fs_perm(self, path: str) -> Perm | None:
        status = self._status(path)
        if status is None:
            return None
        return Perm(status.owner, status.group, status.permission & 0o777)

    def _fs_read(self, path: str, offset: int, length: int) -> bytes:
        chunks: list[bytes] = []
        self._read_chunks(path, offset, length, chunks.append)
        return b"".join(chunks)

    def read_range_into(self, key: str, offset: int, buffer: memoryview, *,
                        progress: Progress | None = None) -> None:
        """A positional read straight into ``buffer``: the DataNode sends exactly the range
        (a stateful read asks it for the rest of the block, and what it pushed before the
        stream closed crossed its link for nothing: bench-ckpt's per-DataNode bytes)."""
        done = 0

        def put(chunk: bytes) -> None:
            nonlocal done
            if done + len(chunk) > len(buffer):
                raise OSError(errno.EIO, f"{self.url}: {key}: the DataNodes sent more than "
                                         f"the {len(buffer)} bytes asked for at {offset}")
            buffer[done:done + len(chunk)] = chunk
            done += len(chunk)
            if progress is not None:
                progress(done)

        self._read_chunks(self._path(key), offset, len(buffer), put)
        if done < len(buffer):
            raise InvalidRangeError(f"{key}: range {offset}+{len(buffer)} is past the end "
                                    f"of the object ({offset + done} bytes)")

    def _read_chunks(self, path: str, offset: int, length: int,
                     put: Callable[[bytes], None]) -> None:
        """The bytes of ``path`` at ``offset`` (fewer only at its end), as the DataNodes'
        packets (64 KiB) handed to ``put``. Not as one ``read_range``: the client returns
        that as a fresh buffer copied twice, and at 8 MiB a read those allocations fault in
        new pages every time (bench-env, CUDA preset: 15 s of system CPU against 5 for the
        same restore through libhdfs; 1 GiB read: 1.6-1.8 s of system CPU against 0.7)."""
        def read() -> None:
            reader = self._client.read(path)
            try:
                end = min(offset + length, len(reader))
                if end > offset:
                    for chunk in reader.read_range_stream(offset, end - offset):
                        put(chunk)
            finally:
                reader.close()
        _call(read, path)

    def _fs_create(self, path: str) -> OutputFile:
        return _Output(_call(lambda: self._client.create(path, self._write), path), path)

    def _fs_rename(self, src: str, dst: str, *, overwrite: bool = False) -> bool:
        try:
            _call(lambda: self._client.rename(src, dst, overwrite=overwrite), src)
        except FileExistsError:
            return False
        return True

    def _fs_replication(self, path: str) -> int | None:
        status = self._status(path)
        return None if status is None else status.replication

    def _fs_set_replication(self, path: str, replicas: int) -> bool:
        try:
            return _call(lambda: self._client.set_replication(path, replicas), path)
        except FileNotFoundError:
            return False

    def _fs_delete(self, path: str) -> bool:
        try:
            return _call(lambda: self._client.delete(path, recursive=False), path)
        except FileNotFoundError:
            return False

    def _fs_mkdirs(self, path: str) -> None:
        _call(lambda: self._client.mkdirs(path, 0o755, create_parent=True), path)

    def _fs_walk(self, path: str) -> Iterator[PathInfo]:
        try:
            listing = _call(lambda: list(self._client.list_status(path, recursive=True)), path)
        except FileNotFoundError:
            return
        for status in listing:
            if not status.isdir:
                yield _path_info(status)

    def _status(self, path: str) -> hdfs_native.FileStatus | None:
        try:
            return _call(lambda: self._client.get_file_info(path), path)
        except FileNotFoundError:
            return None


class _Output:
    """A file being written, its errors as :func:`_call` gives them."""

    def __init__(self, file: hdfs_native.FileWriter, path: str) -> None:
        self._file, self._path = file, path

    def write(self, data: bytes | memoryview) -> object:
        return _call(lambda: self._file.write(data), self._path)

    def close(self) -> None:
        _call(self._file.close, self._path)


def _call(fn: Callable[[], _T], path: str) -> _T:
    """``fn()``, with the client's errors as the ``OSError`` kinds callers handle: a
    missing path is ``FileNotFoundError`` (also when the NameNode says so in a Java
    exception), an existing one ``FileExistsError``, a next block the NameNode will give
    once it has heard the last one is on its DataNodes ``WriteInterrupted`` (HDFS's own
    client waits and asks again; hdfs-native does not, and its writer cannot go on after
    it), anything else (an RPC or DataNode failure, a checksum mismatch)
    ``OSError(EIO)``."""
    try:
        return fn()
    except OSError:
        raise
    except RuntimeError as exc:
        text = str(exc)
        if "FileNotFoundException" in text:
            raise FileNotFoundError(errno.ENOENT, f"{path}: not found") from exc
        if "FileAlreadyExistsException" in text:
            raise FileExistsError(errno.EEXIST, f"{path}: exists") from exc
        if "NotReplicatedYetException" in text:
            raise WriteInterrupted(errno.EAGAIN, f"HDFS {path}: the NameNode has not yet "
                                   f"seen the previous block on its DataNodes; the write "
                                   f"can be made again") from exc
        raise OSError(errno.EIO, f"HDFS {path}: {text}") from exc


def _act_as(store: HdfsStore, user: str) -> None:
    """Make ``user`` this process's HDFS user, unless an open store acts as another."""
    with _user_lock:
        others = {other.user for other in _stores_with_user} - {user}
        if others:
            raise BackendUnavailableError(
                f"this process has an hdfs:// store open acting as HDFS user "
                f"{others.pop()!r}; a store for user {user!r} needs a process of its own "
                f"(the HDFS client takes its user from {USER_VARIABLE})")
        os.environ[USER_VARIABLE] = user
        _stores_with_user.add(store)


def _path_info(status: hdfs_native.FileStatus) -> PathInfo:
    return PathInfo(status.path, status.length, status.modification_time / 1000,
                    status.isdir, status.blocksize or None)

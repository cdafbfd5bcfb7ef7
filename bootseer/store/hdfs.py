"""``hdfs://namenode:port/path`` — HDFS through libhdfs (JNI), via ``pyarrow.fs``.

This is the path production clusters use: the Java HDFS client inside the process, with
short-circuit and DataNode-side checksums, positional reads (``read_at``) that fetch only
the bytes asked for. It needs ``libhdfs.so`` and a JVM at run time: ``JAVA_HOME``,
``ARROW_LIBHDFS_DIR`` (or ``HADOOP_HOME``) and ``CLASSPATH`` as an explicit jar list
(JNI does not expand wildcards); ``python -m bootseer_dev.cluster env`` prints them for the
test cluster. Kerberos (``hdfs.kerberos = true``): libhdfs authenticates with the ticket
cache named by ``KRB5CCNAME`` (from ``kinit``), as the Hadoop configuration on the
``CLASSPATH`` requires; there is no KDC on the development machines, so it is untested.

``pyarrow``'s ``move`` clobbers an existing destination (delete, then rename), which would
break create-only publish, so the rename itself is HDFS's own ``hdfsRename``, called
through ``ctypes`` on the same libhdfs and JVM: it refuses an existing destination. The
block size (for aligned striped reads) comes from ``hdfsGetPathInfo`` the same way.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import functools
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from bootseer.errors import BackendUnavailableError, InvalidRangeError
from bootseer.store import jvmshare
from bootseer.store.base import Perm
from bootseer.store.hadoop import HadoopStyleStore, OutputFile, PathInfo

try:
    import pyarrow.fs as pafs
except ImportError as exc:  # pragma: no cover - pyarrow is a core dependency
    raise BackendUnavailableError("hdfs:// needs pyarrow: pip install pyarrow") from exc

log = logging.getLogger(__name__)


class HdfsStore(HadoopStyleStore):
    """A store under a directory of HDFS, reached through libhdfs."""

    protocols = ("hdfs",)
    default_port = 8020

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
        self._options = {"replication": replication or 0,  # 0: the cluster's dfs.replication
                         "default_block_size": block_size or None,
                         "kerb_ticket": os.environ.get("KRB5CCNAME",
                                                       f"/tmp/krb5cc_{os.getuid()}")
                         if kerberos else None}
        self._connecting = threading.Lock()
        self._connection: tuple[pafs.HadoopFileSystem, _Libhdfs] | None = None

    def _connect(self) -> tuple[pafs.HadoopFileSystem, _Libhdfs]:
        """The JVM and the NameNode connection, made on first use: starting a JVM costs a
        second or two of CPU, which a process that finds everything on the node (a warmed
        restore, say) never pays."""
        with self._connecting:
            if self._connection is None:
                _jvm_options()
                try:
                    fs = pafs.HadoopFileSystem(self.host, self.port, user=self.user,
                                               **self._options)
                except OSError as exc:
                    raise BackendUnavailableError(
                        f"cannot connect to {self.url} through libhdfs ({exc}); it needs "
                        f"JAVA_HOME, ARROW_LIBHDFS_DIR and CLASSPATH (`python -m "
                        f"bootseer_dev.cluster env` prints them for the test cluster)"
                    ) from exc
                self._connection = fs, _Libhdfs(self.host, self.port, self.user)
            return self._connection

    @property
    def fs(self) -> pafs.HadoopFileSystem:
        return (self._connection or self._connect())[0]

    @property
    def _libhdfs(self) -> _Libhdfs:
        return (self._connection or self._connect())[1]

    def _fs_info(self, path: str) -> PathInfo | None:
        info = self.fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            return None
        return _path_info(path, info)

    def block_size(self, key: str) -> int | None:
        return self._libhdfs.block_size(self._path(key))

    def _fs_perm(self, path: str) -> Perm | None:
        return self._libhdfs.perm(path)

    def _fs_read(self, path: str, offset: int, length: int) -> bytes:
        with self.fs.open_input_file(path) as f:
            return f.read_at(length, offset)

    def read_range_into(self, key: str, offset: int, buffer: memoryview) -> None:
        """A positional read straight into ``buffer`` (``hdfsPread``): the DataNode sends
        exactly the range. A stateful read (``seek`` + ``read``) asks it for the rest of
        the block, and what it pushed before the stream closed crossed its link for
        nothing (bench-ckpt's per-DataNode bytes)."""
        done = self._libhdfs.pread_into(self._path(key), offset, buffer)
        if done < len(buffer):
            raise InvalidRangeError(f"{key}: range {offset}+{len(buffer)} is past the end "
                                    f"of the object ({offset + done} bytes)")

    def _fs_create(self, path: str) -> OutputFile:
        return self.fs.open_output_stream(path)

    def _fs_rename(self, src: str, dst: str) -> bool:
        return self._libhdfs.rename(src, dst)

    def _fs_replication(self, path: str) -> int | None:
        return self._libhdfs.replication(path)

    def _fs_set_replication(self, path: str, replicas: int) -> bool:
        return self._libhdfs.set_replication(path, replicas)

    def _fs_delete(self, path: str) -> bool:
        # libhdfs reports a missing path as EIO, not ENOENT: look before deleting.
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            return False
        try:
            self.fs.delete_file(path)
        except OSError:
            if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
                return False  # deleted concurrently
            raise
        return True

    def _fs_mkdirs(self, path: str) -> None:
        self.fs.create_dir(path, recursive=True)

    def _fs_walk(self, path: str) -> Iterator[PathInfo]:
        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.File:
                yield _path_info(info.path, info)


def _path_info(path: str, info: pafs.FileInfo) -> PathInfo:
    if "://" in path:  # pyarrow may return hdfs://host:port/path
        path = "/" + path.split("://", 1)[1].split("/", 1)[1]
    mtime = info.mtime.timestamp() if info.mtime else 0.0
    return PathInfo(path, info.size or 0, mtime, info.type == pafs.FileType.Directory)


class _FileInfo(ctypes.Structure):
    """``hdfsFileInfo`` from libhdfs's ``hdfs.h``."""

    _fields_ = [
        ("kind", ctypes.c_int), ("name", ctypes.c_char_p), ("last_mod", ctypes.c_long),
        ("size", ctypes.c_int64), ("replication", ctypes.c_short),
        ("block_size", ctypes.c_int64), ("owner", ctypes.c_char_p),
        ("group", ctypes.c_char_p), ("permissions", ctypes.c_short),
        ("last_access", ctypes.c_long),
    ]


class _Libhdfs:
    """The libhdfs calls pyarrow does not expose: a non-clobbering ``hdfsRename``,
    ``hdfsGetPathInfo`` (block size, permissions, replication) and ``hdfsSetReplication``,
    on the libhdfs and JVM pyarrow loaded."""

    _lib: ctypes.CDLL | None = None
    _lock = threading.Lock()

    def __init__(self, host: str, port: int, user: str | None) -> None:
        lib = self._load()
        # The connection is Hadoop's cached FileSystem, shared with pyarrow's: never close it.
        self._fs = lib.hdfsConnectAsUser(host.encode(), port, user.encode() if user else None)
        if not self._fs:
            raise BackendUnavailableError(f"libhdfs could not connect to {host}:{port}")
        self._lib_handle = lib

    @classmethod
    def _load(cls) -> ctypes.CDLL:
        with cls._lock:
            if cls._lib is None:
                lib = ctypes.CDLL(str(_libhdfs_path()), use_errno=True)
                lib.hdfsConnectAsUser.restype = ctypes.c_void_p
                lib.hdfsConnectAsUser.argtypes = [ctypes.c_char_p, ctypes.c_uint16,
                                                  ctypes.c_char_p]
                lib.hdfsRename.restype = ctypes.c_int
                lib.hdfsRename.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
                lib.hdfsGetPathInfo.restype = ctypes.POINTER(_FileInfo)
                lib.hdfsGetPathInfo.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
                lib.hdfsSetReplication.restype = ctypes.c_int
                lib.hdfsSetReplication.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                                   ctypes.c_int16]
                lib.hdfsFreeFileInfo.restype = None
                lib.hdfsFreeFileInfo.argtypes = [ctypes.POINTER(_FileInfo), ctypes.c_int]
                lib.hdfsOpenFile.restype = ctypes.c_void_p
                lib.hdfsOpenFile.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                             ctypes.c_int, ctypes.c_short, ctypes.c_int32]
                lib.hdfsPread.restype = ctypes.c_int32
                lib.hdfsPread.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                          ctypes.c_void_p, ctypes.c_int32]
                lib.hdfsCloseFile.restype = ctypes.c_int
                lib.hdfsCloseFile.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                cls._lib = lib
            return cls._lib

    def rename(self, src: str, dst: str) -> bool:
        return self._lib_handle.hdfsRename(self._fs, src.encode(), dst.encode()) == 0

    def block_size(self, path: str) -> int | None:
        info = self._lib_handle.hdfsGetPathInfo(self._fs, path.encode())
        if not info:
            raise FileNotFoundError(f"{path}: not found")
        try:
            return info.contents.block_size or None
        finally:
            self._lib_handle.hdfsFreeFileInfo(info, 1)

    def replication(self, path: str) -> int | None:
        info = self._lib_handle.hdfsGetPathInfo(self._fs, path.encode())
        if not info:
            return None
        try:
            return int(info.contents.replication)
        finally:
            self._lib_handle.hdfsFreeFileInfo(info, 1)

    def set_replication(self, path: str, replicas: int) -> bool:
        return self._lib_handle.hdfsSetReplication(self._fs, path.encode(), replicas) == 0

    def pread_into(self, path: str, offset: int, buffer: memoryview) -> int:
        """Bytes of ``path`` at ``offset`` into ``buffer`` (writable, contiguous) by
        positional reads; returns how many (fewer only at the end of the file)."""
        lib = self._lib_handle
        f = lib.hdfsOpenFile(self._fs, path.encode(), os.O_RDONLY, 0, 0, 0)
        if not f:
            err = ctypes.get_errno()
            if err in (0, errno.ENOENT):
                raise FileNotFoundError(f"{path}: not found")
            raise OSError(err, f"hdfsOpenFile {path}: {os.strerror(err)}")
        try:
            target = (ctypes.c_char * len(buffer)).from_buffer(buffer)
            base, done = ctypes.addressof(target), 0
            while done < len(buffer):
                # tSize is 32-bit: at most 1 GiB per call.
                n = lib.hdfsPread(self._fs, f, offset + done, base + done,
                                  min(len(buffer) - done, 1 << 30))
                if n < 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"hdfsPread {path} at {offset + done}: "
                                       f"{os.strerror(err)}")
                if n == 0:
                    break
                done += n
            del target
            return done
        finally:
            lib.hdfsCloseFile(self._fs, f)

    def perm(self, path: str) -> Perm | None:
        info = self._lib_handle.hdfsGetPathInfo(self._fs, path.encode())
        if not info:
            return None
        try:
            c = info.contents
            return Perm((c.owner or b"").decode(), (c.group or b"").decode(),
                        c.permissions & 0o777)
        finally:
            self._lib_handle.hdfsFreeFileInfo(info, 1)


#: JVM options libhdfs's JVM gets unless ``LIBHDFS_OPTS`` (Hadoop's own knob) sets them.
#: ``-Xrs``: otherwise the JVM takes over SIGTERM and SIGINT and exits the process on the
#: spot, skipping Python's cleanup (a FUSE server would leave a dead mount, a training
#: script's Ctrl-C would skip its ``finally``). ``-XX:TieredStopAtLevel=1``: the client
#: compiles with C1 only; C2 spends more CPU compiling than a start-up's few hundred MB of
#: reads win back (bench-env, 384 MB from HDFS: 2.3 -> 1.8 CPU s, the JVM start 0.2 s
#: shorter; the hot loops, CRC32C and copies, are intrinsics either way).
JVM_OPTIONS = {"-Xrs": "-Xrs", "-XX:TieredStopAtLevel": "-XX:TieredStopAtLevel=1"}


@functools.cache
def _jvm_options() -> None:
    """Add :data:`JVM_OPTIONS` to ``LIBHDFS_OPTS``, and the class-data-sharing archive's
    (:mod:`bootseer.store.jvmshare`) unless ``LIBHDFS_OPTS`` chooses about sharing itself
    (``-Xshare:off``, ``-XX:SharedArchiveFile``). Once per process: only its first HDFS
    connection starts the JVM."""
    opts = os.environ.get("LIBHDFS_OPTS", "").split()
    given = {o.split("=", 1)[0] for o in opts}
    opts += [value for name, value in JVM_OPTIONS.items() if name not in given]
    if not any(o.startswith(("-Xshare", "-XX:SharedArchiveFile")) for o in opts):
        setup = jvmshare.prepare(os.environ.get("CLASSPATH", ""), os.environ.get("JAVA_HOME"))
        opts += setup.options
        if setup.classpath:
            os.environ["CLASSPATH"] = setup.classpath
        if setup.at_exit is not None:
            atexit.register(setup.at_exit)
    os.environ["LIBHDFS_OPTS"] = " ".join(opts)


def _libhdfs_path() -> Path:
    candidates = []
    if os.environ.get("ARROW_LIBHDFS_DIR"):
        candidates.append(Path(os.environ["ARROW_LIBHDFS_DIR"], "libhdfs.so"))
    if os.environ.get("HADOOP_HOME"):
        candidates.append(Path(os.environ["HADOOP_HOME"], "lib", "native", "libhdfs.so"))
    for path in candidates:
        if path.exists():
            return path
    raise BackendUnavailableError("libhdfs.so not found: set ARROW_LIBHDFS_DIR or HADOOP_HOME")

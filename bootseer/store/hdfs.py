"""``hdfs://namenode:port/path`` — HDFS through libhdfs (JNI), via ``pyarrow.fs``.

This is the path production clusters use: the Java HDFS client inside the process, with
short-circuit and DataNode-side checksums, positional reads (``read_at``) that fetch only
the bytes asked for. It needs ``libhdfs.so`` and a JVM at run time: ``JAVA_HOME``,
``ARROW_LIBHDFS_DIR`` (or ``HADOOP_HOME``) and ``CLASSPATH`` as an explicit jar list
(JNI does not expand wildcards); ``python -m bootseer.devcluster env`` prints them for the
test cluster. Kerberos (``hdfs.kerberos = true``): libhdfs authenticates with the ticket
cache named by ``KRB5CCNAME`` (from ``kinit``), as the Hadoop configuration on the
``CLASSPATH`` requires; there is no KDC on the development machines, so it is untested.

``pyarrow``'s ``move`` clobbers an existing destination (delete, then rename), which would
break create-only publish, so the rename itself is HDFS's own ``hdfsRename``, called
through ``ctypes`` on the same libhdfs and JVM: it refuses an existing destination.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from bootseer.errors import BackendUnavailableError
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
        ticket = os.environ.get("KRB5CCNAME", "/tmp/krb5cc_%d" % os.getuid()) if kerberos else None
        try:
            self.fs = pafs.HadoopFileSystem(
                self.host, self.port, user=user,
                replication=replication or 0,  # 0: the cluster's dfs.replication
                default_block_size=block_size or None,
                kerb_ticket=ticket,
            )
        except OSError as exc:
            raise BackendUnavailableError(
                f"cannot connect to {self.url} through libhdfs ({exc}); it needs JAVA_HOME, "
                f"ARROW_LIBHDFS_DIR and CLASSPATH (`python -m bootseer.devcluster env` prints "
                f"them for the test cluster)"
            ) from exc
        self._renamer = _LibhdfsRename(self.host, self.port, user)

    def _fs_info(self, path: str) -> PathInfo | None:
        info = self.fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            return None
        return _path_info(path, info)

    def _fs_read(self, path: str, offset: int, length: int) -> bytes:
        with self.fs.open_input_file(path) as f:
            return f.read_at(length, offset)

    def _fs_create(self, path: str) -> OutputFile:
        return self.fs.open_output_stream(path)

    def _fs_rename(self, src: str, dst: str) -> bool:
        return self._renamer.rename(src, dst)

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


class _LibhdfsRename:
    """``hdfsRename`` from the libhdfs that pyarrow loaded, on the JVM it started."""

    _lib: ctypes.CDLL | None = None
    _lock = threading.Lock()

    def __init__(self, host: str, port: int, user: str | None) -> None:
        lib = self._load()
        connect = lib.hdfsConnectAsUser
        connect.restype = ctypes.c_void_p
        connect.argtypes = [ctypes.c_char_p, ctypes.c_uint16, ctypes.c_char_p]
        # The connection is Hadoop's cached FileSystem, shared with pyarrow's: never close it.
        self._fs = connect(host.encode(), port, user.encode() if user else None)
        if not self._fs:
            raise BackendUnavailableError(f"libhdfs could not connect to {host}:{port}")
        self._rename = lib.hdfsRename
        self._rename.restype = ctypes.c_int
        self._rename.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]

    @classmethod
    def _load(cls) -> ctypes.CDLL:
        with cls._lock:
            if cls._lib is None:
                cls._lib = ctypes.CDLL(str(_libhdfs_path()))
            return cls._lib

    def rename(self, src: str, dst: str) -> bool:
        return self._rename(self._fs, src.encode(), dst.encode()) == 0


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

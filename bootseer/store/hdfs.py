"""``hdfs://namenode:port/path`` — HDFS through libhdfs (Hadoop's C client, over JNI).

This is the path production clusters use: the Java HDFS client inside the process, with
short-circuit and DataNode-side checksums, positional reads (``hdfsPread``) that fetch only
the bytes asked for. It needs ``libhdfs.so`` and a JVM at run time: ``JAVA_HOME``,
``ARROW_LIBHDFS_DIR`` (the name pyarrow gave it) or ``HADOOP_HOME``, and ``CLASSPATH`` as
an explicit jar list (JNI does not expand wildcards); ``python -m bootseer_dev.cluster env``
prints them for the test cluster. Kerberos (``hdfs.kerberos = true``): libhdfs
authenticates with the ticket cache named by ``KRB5CCNAME`` (from ``kinit``), as the
Hadoop configuration on the ``CLASSPATH`` requires; there is no KDC on the development
machines, so it is untested.

libhdfs is called through ``ctypes`` (:class:`_Libhdfs`) rather than a binding: a store
needs a dozen of its calls, and pyarrow, the binding this went through before, took 0.2 s
to import on a cold start (bench-env's restores start cold) for nothing else. Its rename,
``hdfsRename``, refuses an existing destination, which create-only publish needs.
"""

from __future__ import annotations

import atexit
import contextlib
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
        self._replication = replication or 0  # 0: the cluster's dfs.replication
        self._block_size = block_size or 0  # 0: the cluster's dfs.blocksize
        self._kerb_ticket = os.environ.get("KRB5CCNAME", f"/tmp/krb5cc_{os.getuid()}") \
            if kerberos else None
        self._connecting = threading.Lock()
        self._connection: _Libhdfs | None = None

    def _connect(self) -> _Libhdfs:
        """The JVM and the NameNode connection, made on first use: starting a JVM costs a
        second or two of CPU, which a process that finds everything on the node (a warmed
        restore, say) never pays."""
        with self._connecting:
            if self._connection is None:
                _jvm_options()
                self._connection = _Libhdfs(self.host, self.port, self.user,
                                            self._kerb_ticket)
            return self._connection

    @property
    def _libhdfs(self) -> _Libhdfs:
        return self._connection or self._connect()

    def _fs_info(self, path: str) -> PathInfo | None:
        return self._libhdfs.info(path)

    def block_size(self, key: str) -> int | None:
        info = self._libhdfs.info(self._path(key))
        if info is None:
            raise FileNotFoundError(f"{key}: not found on {self.url}")
        return info.block_size

    def _fs_perm(self, path: str) -> Perm | None:
        return self._libhdfs.perm(path)

    def _fs_read(self, path: str, offset: int, length: int) -> bytes:
        buffer = bytearray(length)
        done = self._libhdfs.pread_into(path, offset, memoryview(buffer))
        return bytes(buffer) if done == length else bytes(buffer[:done])

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
        return self._libhdfs.create(path, self._replication, self._block_size)

    def _fs_rename(self, src: str, dst: str) -> bool:
        return self._libhdfs.rename(src, dst)

    def _fs_replication(self, path: str) -> int | None:
        return self._libhdfs.replication(path)

    def _fs_set_replication(self, path: str, replicas: int) -> bool:
        return self._libhdfs.set_replication(path, replicas)

    def _fs_delete(self, path: str) -> bool:
        # libhdfs reports a missing path as EIO, not ENOENT: look before deleting.
        if self._libhdfs.info(path) is None:
            return False
        if not self._libhdfs.delete(path):
            if self._libhdfs.info(path) is None:
                return False  # deleted concurrently
            raise OSError(errno.EIO, f"{self.url}: deleting {path} failed")
        return True

    def _fs_mkdirs(self, path: str) -> None:
        self._libhdfs.mkdirs(path)

    def _fs_walk(self, path: str) -> Iterator[PathInfo]:
        pending = [path]
        while pending:
            for info in self._libhdfs.listdir(pending.pop()):
                if info.is_dir:
                    pending.append(info.path)
                else:
                    yield info


class _FileInfo(ctypes.Structure):
    """``hdfsFileInfo`` from libhdfs's ``hdfs.h``."""

    _fields_ = [
        ("kind", ctypes.c_int), ("name", ctypes.c_char_p), ("last_mod", ctypes.c_long),
        ("size", ctypes.c_int64), ("replication", ctypes.c_short),
        ("block_size", ctypes.c_int64), ("owner", ctypes.c_char_p),
        ("group", ctypes.c_char_p), ("permissions", ctypes.c_short),
        ("last_access", ctypes.c_long),
    ]


_DIRECTORY = ord("D")  # hdfsFileInfo.kind: kObjectKindFile 'F', kObjectKindDirectory 'D'
_MAX_CALL = 1 << 30  # tSize is 32-bit: at most 1 GiB per hdfsPread / hdfsWrite


#: Hadoop settings for this client, over the site's. The checksum HDFS stores with a block
#: is chosen by its writer, and every reader verifies it. A JVM without Hadoop's native
#: library (``libhadoop.so``; the usual case for libhdfs in a Python process) verifies the
#: default, CRC32C, in pure Java, but CRC32 through ``java.util.zip.CRC32``, an intrinsic:
#: reading 256 MB took 0.52-0.64 s of CPU against 0.26-0.32 s. Where the native library is
#: present, both are native. So what this client writes (shards, image blocks, manifests)
#: is read back at half the CPU, and HDFS still checks every replica it reads or scans.
CLIENT_CONF = {"dfs.checksum.type": "CRC32"}


def _c(lib: ctypes.CDLL, name: str, restype, *argtypes) -> None:
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = restype, list(argtypes)


class _Libhdfs:
    """One NameNode connection of libhdfs, and the calls a store makes on it."""

    _lib: ctypes.CDLL | None = None
    _lock = threading.Lock()

    def __init__(self, host: str, port: int, user: str | None,
                 kerb_ticket: str | None) -> None:
        lib = self._load()
        # The builder keeps these pointers, not copies: the bytes must outlive the connect.
        c_host, c_user = host.encode(), user.encode() if user else None
        c_ticket = kerb_ticket.encode() if kerb_ticket else None
        c_conf = [(k.encode(), v.encode()) for k, v in CLIENT_CONF.items()]
        builder = lib.hdfsNewBuilder()
        for key, value in c_conf:
            if lib.hdfsBuilderConfSetStr(builder, key, value):
                raise BackendUnavailableError(f"libhdfs refused the setting {key.decode()}")
        lib.hdfsBuilderSetNameNode(builder, c_host)
        lib.hdfsBuilderSetNameNodePort(builder, port)
        if c_user:
            lib.hdfsBuilderSetUserName(builder, c_user)
        if c_ticket:
            lib.hdfsBuilderSetKerbTicketCachePath(builder, c_ticket)
        # Hadoop's cached FileSystem for this NameNode and user: never disconnected.
        self._fs = lib.hdfsBuilderConnect(builder)  # frees the builder
        del c_host, c_user, c_ticket, c_conf
        if not self._fs:
            err = ctypes.get_errno()
            raise BackendUnavailableError(
                f"cannot connect to hdfs://{host}:{port} through libhdfs "
                f"({os.strerror(err) if err else 'no reason given'}); it needs JAVA_HOME, "
                f"ARROW_LIBHDFS_DIR and CLASSPATH (`python -m bootseer_dev.cluster env` "
                f"prints them for the test cluster)")
        self._lib_handle = lib

    @classmethod
    def _load(cls) -> ctypes.CDLL:
        """libjvm (from ``JAVA_HOME``; libhdfs needs it by name, not by path), then
        libhdfs, with the prototypes of the calls made here."""
        with cls._lock:
            if cls._lib is None:
                ctypes.CDLL(str(_libjvm_path()), mode=ctypes.RTLD_GLOBAL)
                lib = ctypes.CDLL(str(_libhdfs_path()), use_errno=True)
                vp, cp, i32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32
                info_p = ctypes.POINTER(_FileInfo)
                _c(lib, "hdfsNewBuilder", vp)
                _c(lib, "hdfsBuilderSetNameNode", None, vp, cp)
                _c(lib, "hdfsBuilderSetNameNodePort", None, vp, ctypes.c_uint16)
                _c(lib, "hdfsBuilderSetUserName", None, vp, cp)
                _c(lib, "hdfsBuilderSetKerbTicketCachePath", None, vp, cp)
                _c(lib, "hdfsBuilderConfSetStr", ctypes.c_int, vp, cp, cp)
                _c(lib, "hdfsBuilderConnect", vp, vp)
                _c(lib, "hdfsRename", ctypes.c_int, vp, cp, cp)
                _c(lib, "hdfsDelete", ctypes.c_int, vp, cp, ctypes.c_int)
                _c(lib, "hdfsCreateDirectory", ctypes.c_int, vp, cp)
                _c(lib, "hdfsGetPathInfo", info_p, vp, cp)
                _c(lib, "hdfsListDirectory", info_p, vp, cp, ctypes.POINTER(ctypes.c_int))
                _c(lib, "hdfsFreeFileInfo", None, info_p, ctypes.c_int)
                _c(lib, "hdfsSetReplication", ctypes.c_int, vp, cp, ctypes.c_int16)
                _c(lib, "hdfsOpenFile", vp, vp, cp, ctypes.c_int, ctypes.c_int,
                   ctypes.c_short, i32)
                _c(lib, "hdfsPread", i32, vp, vp, ctypes.c_int64, vp, i32)
                _c(lib, "hdfsWrite", i32, vp, vp, vp, i32)
                _c(lib, "hdfsCloseFile", ctypes.c_int, vp, vp)
                cls._lib = lib
            return cls._lib

    def _error(self, call: str, path: str) -> OSError:
        err = ctypes.get_errno() or errno.EIO
        if err == errno.ENOENT:
            return FileNotFoundError(err, f"{path}: not found")
        return OSError(err, f"{call} {path}: {os.strerror(err)}")

    @contextlib.contextmanager
    def _stat(self, path: str, *, strict: bool = True) -> Iterator[_FileInfo | None]:
        """``hdfsGetPathInfo``'s record of ``path``, freed after use; None if it does not
        exist (and, unless ``strict``, if it cannot be read)."""
        ctypes.set_errno(0)
        info = self._lib_handle.hdfsGetPathInfo(self._fs, path.encode())
        if not info:
            if not strict or ctypes.get_errno() in (0, errno.ENOENT):
                yield None
                return
            raise self._error("hdfsGetPathInfo", path)
        try:
            yield info.contents
        finally:
            self._lib_handle.hdfsFreeFileInfo(info, 1)

    def info(self, path: str) -> PathInfo | None:
        """The path's size, mtime, kind and block size; None if it does not exist."""
        with self._stat(path) as info:
            return None if info is None else _path_info(path, info)

    def listdir(self, path: str) -> list[PathInfo]:
        """The directory's entries (none if it is empty or does not exist)."""
        count = ctypes.c_int(0)
        ctypes.set_errno(0)
        infos = self._lib_handle.hdfsListDirectory(self._fs, path.encode(),
                                                   ctypes.byref(count))
        if not infos:
            if ctypes.get_errno() in (0, errno.ENOENT):
                return []
            raise self._error("hdfsListDirectory", path)
        try:
            return [_path_info(_uri_path(infos[i].name.decode()), infos[i])
                    for i in range(count.value)]
        finally:
            self._lib_handle.hdfsFreeFileInfo(infos, count.value)

    def rename(self, src: str, dst: str) -> bool:
        return self._lib_handle.hdfsRename(self._fs, src.encode(), dst.encode()) == 0

    def delete(self, path: str) -> bool:
        return self._lib_handle.hdfsDelete(self._fs, path.encode(), 0) == 0

    def mkdirs(self, path: str) -> None:
        if self._lib_handle.hdfsCreateDirectory(self._fs, path.encode()) != 0:
            raise self._error("hdfsCreateDirectory", path)

    def replication(self, path: str) -> int | None:
        with self._stat(path, strict=False) as info:
            return None if info is None else int(info.replication)

    def perm(self, path: str) -> Perm | None:
        with self._stat(path, strict=False) as info:
            if info is None:
                return None
            return Perm((info.owner or b"").decode(), (info.group or b"").decode(),
                        info.permissions & 0o777)

    def set_replication(self, path: str, replicas: int) -> bool:
        return self._lib_handle.hdfsSetReplication(self._fs, path.encode(), replicas) == 0

    def create(self, path: str, replication: int, block_size: int) -> _OutputFile:
        """A new file (replaced if it exists: callers write unique temporaries)."""
        f = self._lib_handle.hdfsOpenFile(self._fs, path.encode(), os.O_WRONLY, 0,
                                          replication, block_size)
        if not f:
            raise self._error("hdfsOpenFile", path)
        return _OutputFile(self, f, path)

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
            if not len(buffer):
                return 0
            target = (ctypes.c_char * len(buffer)).from_buffer(buffer)
            base, done = ctypes.addressof(target), 0
            while done < len(buffer):
                n = lib.hdfsPread(self._fs, f, offset + done, base + done,
                                  min(len(buffer) - done, _MAX_CALL))
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

class _OutputFile:
    """A file libhdfs is writing; ``close`` returns once the DataNodes acknowledged all."""

    def __init__(self, libhdfs: _Libhdfs, handle: int, path: str) -> None:
        self._libhdfs, self._handle, self._path = libhdfs, handle, path

    def write(self, data: bytes | memoryview) -> None:
        data = bytes(data) if not isinstance(data, bytes) else data
        lib, fs = self._libhdfs._lib_handle, self._libhdfs._fs
        base, done = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value, 0
        while done < len(data):
            n = lib.hdfsWrite(fs, self._handle, base + done, min(len(data) - done, _MAX_CALL))
            if n < 0:
                raise self._libhdfs._error("hdfsWrite", self._path)
            done += n

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None and self._libhdfs._lib_handle.hdfsCloseFile(
                self._libhdfs._fs, handle) != 0:
            raise self._libhdfs._error("hdfsCloseFile", self._path)


def _uri_path(name: str) -> str:
    """``hdfs://host:port/a/b`` (how listings name entries) as ``/a/b``."""
    return "/" + name.split("://", 1)[1].split("/", 1)[1] if "://" in name else name


def _path_info(path: str, info: _FileInfo) -> PathInfo:
    return PathInfo(path, int(info.size), float(info.last_mod), info.kind == _DIRECTORY,
                    int(info.block_size) or None)


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


def _libjvm_path() -> Path:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        for rel in ("lib/server/libjvm.so", "jre/lib/amd64/server/libjvm.so"):
            if Path(java_home, rel).exists():
                return Path(java_home, rel)
    raise BackendUnavailableError("libjvm.so not found: set JAVA_HOME to a JDK or JRE")


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

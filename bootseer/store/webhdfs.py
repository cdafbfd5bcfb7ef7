"""``webhdfs://namenode:http-port/path`` — HDFS over its REST API, via HdfsCLI (``hdfs``).

No JVM on the client: metadata calls go to the NameNode's HTTP port, data is redirected
to the DataNodes' HTTP ports. Ranged reads use WebHDFS ``OPEN`` with ``offset`` and
``length``; writes stream through ``CREATE`` into a temporary path, published by
``RENAME`` (which refuses an existing destination, so create-only publish is atomic).

Kerberos: set ``hdfs.kerberos = true`` in the config to use HdfsCLI's ``KerberosClient``
(needs ``pip install requests-kerberos`` and a ticket from ``kinit``). This cannot be
tested on the development machines, which have no KDC.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterator

import requests
from tenacity import (
    before_sleep_log,
    retry,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from bootseer.errors import BackendUnavailableError
from bootseer.store.base import Perm
from bootseer.store.hadoop import HadoopStyleStore, OutputFile, PathInfo

try:
    from hdfs import HdfsError, InsecureClient
except ImportError as exc:  # pragma: no cover - hdfs is a core dependency
    raise BackendUnavailableError("webhdfs:// needs HdfsCLI: pip install hdfs") from exc

log = logging.getLogger(__name__)


class WebHdfsStore(HadoopStyleStore):
    """A store under a directory of HDFS, reached through WebHDFS."""

    protocols = ("webhdfs",)
    default_port = 9870

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
        endpoint = f"http://{self.host}:{self.port}"
        if kerberos:
            try:
                from hdfs.ext.kerberos import KerberosClient
            except ImportError as exc:
                raise BackendUnavailableError(
                    "hdfs.kerberos needs requests-kerberos: pip install requests-kerberos"
                ) from exc
            self.client = KerberosClient(endpoint)
        else:
            self.client = InsecureClient(endpoint, user=user)
        self.new_file_replication = replication
        self.new_file_block_size = block_size

    def _fs_info(self, path: str) -> PathInfo | None:
        status = self.client.status(path, strict=False)
        return None if status is None else _path_info(path, status)

    def _fs_replication(self, path: str) -> int | None:
        status = self.client.status(path, strict=False)
        return None if status is None or status["type"] != "FILE" else int(status["replication"])

    def _fs_set_replication(self, path: str, replicas: int) -> bool:
        if self._fs_replication(path) is None:  # HdfsCLI checks too, with a vaguer error
            return False
        try:
            self.client.set_replication(path, replicas)
        except HdfsError as exc:
            raise OSError(f"{self.url}: setting the replication of {path}: {exc}") from exc
        return True

    def _fs_perm(self, path: str) -> Perm | None:
        status = self.client.status(path, strict=False)
        if status is None:
            return None
        return Perm(status["owner"], status["group"], int(status["permission"], 8) & 0o777)

    @retry(
        retry=retry_if_exception_type(requests.ConnectionError),
        stop=stop_after_attempt(8),
        wait=wait_exponential(multiplier=0.05, max=2.0),
        before_sleep=before_sleep_log(log, logging.INFO),
        reraise=True,
    )
    def _fs_read(self, path: str, offset: int, length: int) -> bytes:
        # A dead DataNode stays in the NameNode's block locations until its heartbeats
        # time out, so a redirect may point at it: retrying lands on another replica.
        try:
            with self.client.read(path, offset=offset, length=length) as reader:
                return reader.read()
        except HdfsError as exc:
            if getattr(exc, "exception", None) == "FileNotFoundException" or \
                    any(s in str(exc) for s in ("FileNotFoundException", "does not exist",
                                                " not found")):
                raise FileNotFoundError(f"{path}: not found on {self.url}") from exc
            if "Offset" in str(exc) and "greater than" in str(exc):
                return b""  # offset past the end: a short read, like pread
            raise OSError(f"{self.url}: reading {path} failed: {exc}") from exc

    def _fs_create(self, path: str) -> OutputFile:
        return _WebHdfsOutput(self.client.write(
            path, overwrite=False, replication=self.new_file_replication,
            blocksize=self.new_file_block_size,
        ))

    def _fs_rename(self, src: str, dst: str) -> bool:
        try:
            self.client.rename(src, dst)
        except HdfsError as exc:
            log.debug("rename %s -> %s refused: %s", src, dst, exc)
            return False
        return True

    def _fs_delete(self, path: str) -> bool:
        return bool(self.client.delete(path))

    def _fs_mkdirs(self, path: str) -> None:
        self.client.makedirs(path)

    def _fs_walk(self, path: str) -> Iterator[PathInfo]:
        if self.client.status(path, strict=False) is None:
            return
        for directory, _dirs, files in self.client.walk(path, status=True):
            for name, status in files:
                yield _path_info(posixpath.join(directory[0], name), status)


def _path_info(path: str, status: dict) -> PathInfo:
    return PathInfo(path, int(status["length"]), status["modificationTime"] / 1000.0,
                    status["type"] == "DIRECTORY", int(status.get("blockSize") or 0) or None)


class _WebHdfsOutput:
    """HdfsCLI's streaming writer (a context manager) as a write/close file."""

    def __init__(self, writer) -> None:
        self._cm = writer
        self._file = writer.__enter__()

    def write(self, data: bytes | memoryview) -> None:
        self._file.write(bytes(data))

    def close(self) -> None:
        self._cm.__exit__(None, None, None)

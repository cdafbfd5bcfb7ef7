"""``webhdfs://namenode:http-port/path`` — HDFS over its REST API, via HdfsCLI (``hdfs``).

No JVM on the client: metadata calls go to the NameNode's HTTP port, data is redirected
to the DataNodes' HTTP ports. Ranged reads use WebHDFS ``OPEN`` with ``offset`` and
``length``, following the redirect here rather than in HdfsCLI so that a DataNode that fails
a read is known and excluded from its retries; writes stream through ``CREATE`` into a
temporary path, published by ``RENAME`` (which refuses an existing destination, so
create-only publish is atomic).

Kerberos: set ``hdfs.kerberos = true`` in the config to use HdfsCLI's ``KerberosClient``
(needs ``pip install requests-kerberos`` and a ticket from ``kinit``). This cannot be
tested on the development machines, which have no KDC.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterator
from urllib.parse import quote, urlsplit

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

#: How long a DataNode may keep a read waiting (for its connection, or between two bytes)
#: before it counts as failed: the minute Hadoop's own WebHDFS client waits
#: (``URLConnectionFactory.DEFAULT_SOCKET_TIMEOUT``).
DATANODE_TIMEOUT_S = 60.0

#: How a read fails when a DataNode died, hung or dropped the connection: refused or
#: timed-out connections and resets (``ConnectionError``, ``Timeout``), and a body cut
#: short of its ``Content-Length`` (``ChunkedEncodingError``). A NameNode that cannot be
#: reached raises ``ConnectionError`` too, and its reads are retried the same way.
_READ_FAILURES: tuple[type[Exception], ...] = (
    requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
)


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
        self._webhdfs = f"{endpoint}/webhdfs/v1"

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

    def _fs_read(self, path: str, offset: int, length: int) -> bytes:
        return self._read_excluding(path, offset, length, [])

    @retry(
        retry=retry_if_exception_type(_READ_FAILURES),
        stop=stop_after_attempt(8),
        wait=wait_exponential(multiplier=0.05, max=2.0),
        before_sleep=before_sleep_log(log, logging.INFO),
        reraise=True,
    )
    def _read_excluding(self, path: str, offset: int, length: int,
                        excluded: list[str]) -> bytes:
        """One try at a read: the NameNode redirects it to a DataNode holding the block at
        ``offset``, any but those in ``excluded`` (WebHDFS ``excludedatanodes``).

        A dead DataNode stays in the NameNode's block locations until its heartbeats time
        out, and the NameNode picks among the replicas at random: a DataNode that fails
        the read joins ``excluded``, so the next try (tenacity calls again with the same
        list) goes to another replica rather than, by chance, to the dead one again.
        """
        res = self.client._request(
            "GET", self._webhdfs + quote(path), allow_redirects=False,
            params={"op": "OPEN", "offset": offset, "length": length,
                    "excludedatanodes": ",".join(excluded) or None},
        )
        if not res.is_redirect:
            return self._failed_read(path, res)
        location = res.headers["Location"]
        try:
            # Sent as HdfsCLI's redirect-following sent it: the Location alone, no session
            # parameters or authentication (a secure cluster's Location carries a token).
            with self.client._session.send(requests.Request("GET", location).prepare(),
                                           stream=True, timeout=DATANODE_TIMEOUT_S) as data:
                if not data.ok:
                    return self._failed_read(path, data)
                return b"".join(data.iter_content(chunk_size=None))
        except _READ_FAILURES:
            self._exclude(path, offset, location, excluded)
            raise

    def _exclude(self, path: str, offset: int, location: str, excluded: list[str]) -> None:
        """Add the DataNode that ``location`` (an ``OPEN`` redirect) named to ``excluded``.

        The NameNode looks each excluded ``host:port`` up by IP address and *data-transfer*
        port (Hadoop 2.7's ``NamenodeWebHdfsMethods.chooseDatanode`` calls
        ``DatanodeManager.getDatanodeByXferAddr``), so the redirect's own host and HTTP
        port, which Hadoop's Java client sends, exclude nothing; and a bare host is any
        DataNode of that address. The block's locations give each replica's ``ipAddr``
        and ``xferPort``. Once every replica has failed this read, the next try may go to
        any of them again, as Hadoop's ``DFSInputStream`` does: otherwise the NameNode only
        answers "No active nodes contain this block".
        """
        res = self.client._request("GET", self._webhdfs + quote(path), params={
            "op": "GET_BLOCK_LOCATIONS", "offset": offset, "length": 1})
        if not res.ok:
            raise self._error(path, res)
        blocks = res.json()["LocatedBlocks"]["locatedBlocks"]
        replicas = blocks[0]["locations"] if blocks else []
        redirected = urlsplit(location)
        addresses = {f"{r['ipAddr']}:{r['xferPort']}" for r in replicas}
        for replica in replicas:
            if replica["infoPort"] == redirected.port and \
                    redirected.hostname in (replica["hostName"], replica["ipAddr"]):
                address = f"{replica['ipAddr']}:{replica['xferPort']}"
                log.info("%s: DataNode %s failed reading %s; excluding it", self.url,
                         address, path)
                excluded.append(address)
        if addresses and addresses <= set(excluded):
            log.warning("%s: every replica of %s at offset %d failed; trying them all again",
                        self.url, path, offset)
            excluded.clear()

    def _failed_read(self, path: str, res: requests.Response) -> bytes:
        """A read WebHDFS answered with an error: ``b""`` for an offset past the end (a
        short read, like pread), else the error raised."""
        error, (_, message) = self._error(path, res), _remote_exception(res)
        if not isinstance(error, FileNotFoundError) and "Offset" in message and \
                "greater than" in message:
            return b""
        raise error

    def _error(self, path: str, res: requests.Response) -> OSError:
        """The error a WebHDFS answer to a read stands for, the NameNode's or a
        DataNode's: a missing file is :class:`FileNotFoundError`, anything else
        :class:`OSError`."""
        exception, message = _remote_exception(res)
        if exception == "FileNotFoundException" or \
                any(s in message for s in ("FileNotFoundException", "does not exist",
                                           " not found")):
            return FileNotFoundError(f"{path}: not found on {self.url}")
        return OSError(f"{self.url}: reading {path} failed: HTTP {res.status_code} {message}")

    def _fs_create(self, path: str) -> OutputFile:
        return _WebHdfsOutput(self.client.write(
            path, overwrite=False, replication=self.new_file_replication,
            blocksize=self.new_file_block_size,
        ))

    def _fs_rename(self, src: str, dst: str, *, overwrite: bool = False) -> bool:
        assert not overwrite, "WebHDFS 2.7 has no rename with OVERWRITE"
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


def _remote_exception(res: requests.Response) -> tuple[str | None, str]:
    """A WebHDFS error's Java exception name and message (``{"RemoteException": {...}}``),
    or no name and the start of the body when it is not one (a proxy's error page)."""
    try:
        remote = res.json()["RemoteException"]
        return remote.get("exception"), str(remote.get("message"))
    except (ValueError, KeyError, TypeError):
        return None, res.text[:1000]


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

"""The HDFS backends against a real HDFS cluster: the store contract, Hadoop's own client
reading what Bootseer wrote (and the other way round), and a DataNode dying mid-read."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import uuid
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from support.store_contract import GIB, MIB, StoreContract, ramp

from bootseer.store import BlobStore, open_store

_unique = itertools.count()


def _root() -> str:
    return f"/bootseer-test/{uuid.uuid4().hex[:8]}-{next(_unique)}"


class TestHdfsStore(StoreContract):
    large_object_size = 2 * GIB + 64 * MIB

    @pytest.fixture
    def store_url(self, hdfs_cluster) -> str:
        return f"{hdfs_cluster.namenode_rpc_url}{_root()}"


class TestWebHdfsStore(StoreContract):
    large_object_size = 2 * GIB + 64 * MIB

    @pytest.fixture
    def store_url(self, hdfs_cluster) -> str:
        return f"{hdfs_cluster.webhdfs_url}{_root()}"


def _fsshell(cluster, *args: str, stdin: bytes | None = None) -> bytes:
    """Hadoop's own Java client (org.apache.hadoop.fs.FsShell)."""
    env = cluster.env()
    cmd = [str(cluster.jdk / "bin" / "java"), "-Xmx256m", "-cp", env["CLASSPATH"],
           "org.apache.hadoop.fs.FsShell", "-fs", cluster.namenode_rpc_url, *args]
    result = subprocess.run(cmd, input=stdin, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    return result.stdout


@pytest.mark.parametrize("scheme", ["hdfs", "webhdfs"])
def test_hadoop_client_cross_check(hdfs_cluster, scheme: str) -> None:
    base = hdfs_cluster.namenode_rpc_url if scheme == "hdfs" else hdfs_cluster.webhdfs_url
    root = _root()
    blobs = BlobStore(open_store(base + root))
    data = ramp(12345, 5 * MIB + 17)  # several 1 MiB HDFS blocks, not block-aligned
    info = blobs.put(data)
    # Bootseer wrote it; Hadoop's FsShell reads it back byte-identical.
    assert _fsshell(hdfs_cluster, "-cat", f"{root}/{BlobStore.blob_key(info.digest)}") == data
    # Hadoop wrote it; Bootseer reads it (whole and ranged) byte-identical.
    other = ramp(999, 3 * MIB + 5)
    _fsshell(hdfs_cluster, "-put", "-", f"{root}/from-hadoop/file", stdin=other)
    store = open_store(base + root)
    assert store.get("from-hadoop/file") == other
    assert store.read_range("from-hadoop/file", MIB - 3, 10) == other[MIB - 3 : MIB + 7]


_AS_USER = r"""
import sys
from bootseer.errors import BackendUnavailableError
from bootseer.store import open_store
store = open_store(sys.argv[1], user="alice")
store.put("owned", b"x")
print(store._fs_perm(store._path("owned")).owner)
try:
    open_store(sys.argv[1], user="bob")
except BackendUnavailableError as exc:
    print(exc)
"""


def test_the_store_acts_as_its_configured_user(hdfs_cluster) -> None:
    """``hdfs.user``: what the store writes is owned by that HDFS user; the client takes
    the user from the process's environment, so a second user in one process, while the
    first's store is open, is refused, not silently ignored."""
    env = {k: v for k, v in os.environ.items() if k != "HADOOP_USER_NAME"}
    out = subprocess.run([sys.executable, "-c", _AS_USER,
                          hdfs_cluster.namenode_rpc_url + _root()],
                         capture_output=True, text=True, timeout=60, env=env, check=True)
    owner, refusal = out.stdout.splitlines()
    assert owner == "alice"
    assert "acting as HDFS user 'alice'" in refusal and "'bob'" in refusal


def test_an_overwrite_replaces_the_object_in_one_rename(hdfs_cluster) -> None:
    """``hdfs://`` publishes an overwrite as one ``rename`` with ``OVERWRITE``: the
    NameNode's audit log shows that rename onto the key and never a delete of it, so no
    reader can find the reference missing in between."""
    root = _root()
    store = open_store(hdfs_cluster.namenode_rpc_url + root)
    store.put("refs/latest", b"one")
    store.put("refs/latest", b"two")
    assert store.get("refs/latest") == b"two"
    dest = f"{root}/refs/latest"
    renames, deletes = [], []
    for line in hdfs_cluster.log_path("namenode").read_text(errors="replace").splitlines():
        fields = dict(f.split("=", 1) for f in line.split("\t") if "=" in f)
        if fields.get("cmd", "").startswith("rename") and fields.get("dst") == dest:
            renames.append(fields["cmd"])
        if fields.get("cmd") == "delete" and fields.get("src") == dest:
            deletes.append(line)
    assert renames == ["rename (options=[OVERWRITE])"] * 2, renames  # a put overwrites
    assert deletes == []


class _OpenRedirects:
    """Every WebHDFS ``OPEN`` redirect the NameNode sends this process, seen below the store
    (at requests' HTTP adapter), however the store follows it; :meth:`kill_next` makes the
    next one kill the DataNode it names before the store can connect there. The NameNode
    picks among the replicas at random, so killing a fixed DataNode would let a read pass
    by luck, never having asked the dead one."""

    def __init__(self, cluster, monkeypatch: pytest.MonkeyPatch) -> None:
        self.cluster = cluster
        self.datanode_at = {cluster.spec.datanode_ports(i).http: i
                            for i in range(cluster.spec.datanodes)}
        #: ((path, offset, length) of the read, index of the DataNode it was sent to)
        self.seen: list[tuple[tuple[str, ...], int]] = []
        self.killed: int | None = None
        self.killed_at = 0  # index in `seen` of the redirect to the DataNode killed
        self._armed = False
        send = requests.adapters.HTTPAdapter.send

        def observed_send(adapter, request, *args, **kwargs):
            response = send(adapter, request, *args, **kwargs)
            self._saw(request.url, response)
            return response

        monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", observed_send)

    def kill_next(self) -> None:
        self._armed = True

    def _saw(self, url: str, response: requests.Response) -> None:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        if query.get("op") != ["OPEN"] or not response.is_redirect:
            return
        datanode = self.datanode_at[urlsplit(response.headers["Location"]).port]
        read = (parts.path, *query.get("offset", ["0"]), *query.get("length", ["-"]))
        self.seen.append((read, datanode))
        if self._armed:
            self._armed = False
            self.killed, self.killed_at = datanode, len(self.seen) - 1
            self.cluster.stop_datanode(datanode, sig=signal.SIGKILL)


@pytest.mark.parametrize("scheme", ["hdfs", "webhdfs"])
def test_datanode_killed_mid_read(hdfs_cluster, scheme: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Replication 2: losing one DataNode halfway through a read loses no byte.

    Over WebHDFS the DataNode killed is the one the NameNode has just redirected a read
    to, and a retry of a read that DataNode failed must not go back to it (the retry
    names it in ``excludedatanodes``): by chance alone, half of them would. Each chunk is a
    read of its own, so that many reads meet the dead DataNode."""
    base = hdfs_cluster.namenode_rpc_url if scheme == "hdfs" else hdfs_cluster.webhdfs_url
    blobs = BlobStore(open_store(base + _root()))
    size = 24 * MIB
    info = blobs.put(ramp(0, size))
    redirects = _OpenRedirects(hdfs_cluster, monkeypatch) if scheme == "webhdfs" else None
    stopped: int | None = None

    def killed() -> int | None:
        return redirects.killed if redirects else stopped

    got = bytearray()
    try:
        for offset in range(0, size, MIB):
            got += blobs.read_range(info.digest, offset, MIB)
            if offset == 0 and redirects:
                redirects.kill_next()
            elif offset == 0:
                stopped = 0
                hdfs_cluster.stop_datanode(stopped, sig=signal.SIGKILL)
        assert killed() is not None, "no read was redirected once the kill was armed"
        assert bytes(got) == ramp(0, size)
        assert blobs.read_range(info.digest, size - MIB - 5, MIB) == ramp(size - MIB - 5, MIB)
        if redirects:
            after = redirects.seen[redirects.killed_at:]
            back = [int(read[1]) for (read, dn), (retry, retry_dn) in itertools.pairwise(after)
                    if read == retry and dn == retry_dn == redirects.killed]
            assert not back, (f"retries of reads at offsets {back} went back to the dead "
                              f"DataNode {killed()}")
    finally:
        if killed() is not None:
            hdfs_cluster.start_datanode(killed())


@pytest.mark.parametrize("scheme", ["hdfs", "webhdfs"])
def test_config_sets_replication_and_block_size_of_new_files(hdfs_cluster, tmp_path, scheme):
    """`bootseer store put` with BOOTSEER_HDFS_* set: the options reach the new HDFS file."""
    base = hdfs_cluster.namenode_rpc_url if scheme == "hdfs" else hdfs_cluster.webhdfs_url
    root = _root()
    source = tmp_path / "data.bin"
    source.write_bytes(ramp(0, 5 * MIB))
    env = {**os.environ, "BOOTSEER_STORE": base + root, "BOOTSEER_HDFS_REPLICATION": "1",
           "BOOTSEER_HDFS_BLOCK_SIZE": "2m"}
    result = subprocess.run([sys.executable, "-m", "bootseer", "store", "put", str(source)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    digest = result.stdout.strip()
    blocks = hdfs_cluster.block_locations(f"{root}/{BlobStore.blob_key(digest)}")
    assert [b.length for b in blocks] == [2 * MIB, 2 * MIB, MIB]
    assert all(len(b.datanodes) == 1 for b in blocks)

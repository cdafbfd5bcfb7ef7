"""The HDFS backends against a real HDFS cluster: the store contract, Hadoop's own client
reading what Bootseer wrote (and the other way round), and a DataNode dying mid-read."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import uuid

import pytest
from store_contract import GIB, MIB, StoreContract, ramp

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


def test_the_store_writes_blocks_with_crc32_checksums(hdfs_cluster) -> None:
    """hdfs:// chooses CRC32 for what it writes (``CLIENT_CONF``), which a JVM without
    Hadoop's native library verifies through an intrinsic; a file Hadoop's own client
    wrote keeps its CRC32C, and both read back."""
    root = _root()
    store = open_store(hdfs_cluster.namenode_rpc_url + root)
    info = BlobStore(store).put(ramp(7, 3 * MIB + 1))
    _fsshell(hdfs_cluster, "-put", "-", f"{root}/from-hadoop", stdin=ramp(0, MIB))

    def algorithm(key: str) -> str:
        return _fsshell(hdfs_cluster, "-checksum", f"{root}/{key}").decode().split("\t")[1]

    assert algorithm(BlobStore.blob_key(info.digest)).endswith("-of-512CRC32")
    assert algorithm("from-hadoop").endswith("-of-512CRC32C")
    assert store.get(BlobStore.blob_key(info.digest)) == ramp(7, 3 * MIB + 1)
    assert store.get("from-hadoop") == ramp(0, MIB)


@pytest.mark.parametrize("scheme", ["hdfs", "webhdfs"])
def test_datanode_killed_mid_read(hdfs_cluster, scheme: str) -> None:
    """Replication 2: losing one DataNode halfway through a read loses no byte."""
    base = hdfs_cluster.namenode_rpc_url if scheme == "hdfs" else hdfs_cluster.webhdfs_url
    blobs = BlobStore(open_store(base + _root()))
    size = 24 * MIB
    info = blobs.put(ramp(0, size))
    got = bytearray()
    try:
        for i, chunk in enumerate(blobs.iter_chunks(info.digest)):
            got += chunk
            if i == 0:
                hdfs_cluster.stop_datanode(0, sig=signal.SIGKILL)
        assert bytes(got) == ramp(0, size)
        assert blobs.read_range(info.digest, size - MIB - 5, MIB) == ramp(size - MIB - 5, MIB)
    finally:
        hdfs_cluster.start_datanode(0)


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

"""The hdfs:// backend's handling of what its client returns, with the client replaced:
a DataNode that sends more or fewer bytes than asked, and the NameNode's Java exceptions
(the real cluster's tests are tests/integration/test_store_hdfs.py)."""

from __future__ import annotations

import errno

import pytest

from bootseer.errors import InvalidRangeError
from bootseer.store import BlobStore
from bootseer.store.base import WriteInterrupted
from bootseer.store.hdfs import HdfsStore


class _Reader:
    def __init__(self, size: int, chunks: list[bytes]) -> None:
        self.size, self.chunks = size, chunks

    def __len__(self) -> int:
        return self.size

    def read_range_stream(self, offset: int, length: int):
        yield from self.chunks

    def close(self) -> None:
        pass


class _Client:
    """Answers every read with ``chunks``; every rename with ``rename_error``."""

    def __init__(self, size: int, chunks: list[bytes], rename_error: str = "") -> None:
        self.size, self.chunks, self.rename_error = size, chunks, rename_error

    def read(self, path: str) -> _Reader:
        return _Reader(self.size, self.chunks)

    def get_file_info(self, path: str):
        raise RuntimeError('RPCError("java.io.FileNotFoundException", "File does not exist")')

    def rename(self, src: str, dst: str, overwrite: bool) -> None:
        if self.rename_error:
            raise RuntimeError(self.rename_error)


def _store(client: _Client) -> HdfsStore:
    store = HdfsStore("hdfs://127.0.0.1:1/bootseer")  # connects on first use: never here
    store._client = client
    return store


def test_a_datanode_sending_more_than_asked_is_an_error_and_writes_past_nothing() -> None:
    buffer = bytearray(b"." * 12)
    store = _store(_Client(1 << 20, [b"a" * 4, b"b" * 4, b"c" * 4]))
    with pytest.raises(OSError) as raised:
        store.read_range_into("k", 0, memoryview(buffer)[:8])
    assert raised.value.errno == errno.EIO and "more than the 8 bytes" in str(raised.value)
    assert buffer == b"aaaabbbb...."


def test_a_short_read_is_an_invalid_range() -> None:
    store = _store(_Client(6, [b"abcdef"]))
    with pytest.raises(InvalidRangeError, match="past the end"):
        store.read_range_into("k", 0, memoryview(bytearray(8)))


def test_the_namenodes_exceptions_become_the_errors_callers_handle() -> None:
    store = _store(_Client(0, [], rename_error='RPCError("org.apache.hadoop.fs.'
                                               'FileAlreadyExistsException", "exists")'))
    with pytest.raises(FileNotFoundError):
        store.stat("missing")
    assert store._fs_rename("/a", "/b") is False  # create-only publish: taken, not an error
    store._client.rename_error = 'RPCError("java.io.IOException", "DataNode gone")'
    with pytest.raises(OSError) as raised:
        store._fs_rename("/a", "/b")
    assert raised.value.errno == errno.EIO


class _Writer:
    def __init__(self, files: dict[str, bytearray], path: str, refuse: bool) -> None:
        self.files, self.path, self.refuse = files, path, refuse

    def write(self, data: bytes) -> int:
        if self.refuse:  # the NameNode refuses the next block: this writer is lost
            raise RuntimeError('RPCError("org.apache.hadoop.hdfs.server.namenode.'
                               'NotReplicatedYetException", "Not replicated yet: x")')
        self.files[self.path] += data
        return len(data)

    def close(self) -> None:
        pass


class _WritingClient:
    """An HDFS whose NameNode refuses the next block ``refusals`` times."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.files = refusals, {}

    def create(self, path: str, options: object) -> _Writer:
        self.files[path] = bytearray()
        refuse, self.refusals = self.refusals > 0, self.refusals - 1
        return _Writer(self.files, path, refuse)

    def mkdirs(self, path: str, mode: int, create_parent: bool) -> None:
        pass

    def rename(self, src: str, dst: str, overwrite: bool) -> None:
        self.files[dst] = self.files.pop(src)

    def delete(self, path: str, recursive: bool) -> bool:
        return self.files.pop(path, None) is not None

    def get_file_info(self, path: str):
        raise RuntimeError('RPCError("java.io.FileNotFoundException", "File does not exist")')


def test_a_write_the_namenode_interrupts_is_made_again_when_its_data_can_be_read_again(
        tmp_path) -> None:
    client = _WritingClient(refusals=2)
    store = _store(client)  # type: ignore[arg-type]
    assert store.put("k", b"payload").size == 7
    source = tmp_path / "source"
    source.write_bytes(b"xxfile")
    client.refusals = 1
    with source.open("rb") as file:
        file.read(2)  # a put writes from where the file is
        assert store.put("f", file).size == 4
    # Every interrupted write's temporary is gone; each key holds its data once.
    assert client.files == {"/bootseer/k": bytearray(b"payload"),
                            "/bootseer/f": bytearray(b"file")}
    client.refusals = 1
    blobs = BlobStore(store)
    blob = blobs.put(b"blob bytes")  # blobs too
    assert client.files.pop(f"/bootseer/{blobs.blob_key(blob.digest)}") == b"blob bytes"
    assert client.files.pop(f"/bootseer/{blobs.table_key(blob.digest)}")
    client.refusals = 1
    with pytest.raises(WriteInterrupted) as raised:  # chunks gone by: cannot be made again
        store.put("s", iter([b"a", b"b"]))
    assert raised.value.errno == errno.EAGAIN and "made again" in str(raised.value)
    assert set(client.files) == {"/bootseer/k", "/bootseer/f"}

"""The hdfs:// backend's handling of what its client returns, with the client replaced:
a DataNode that sends more or fewer bytes than asked, and the NameNode's Java exceptions
(the real cluster's tests are tests/integration/test_store_hdfs.py)."""

from __future__ import annotations

import errno

import pytest

from bootseer.errors import InvalidRangeError
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

"""From a URL to a striped, file-like reader: what the checkpoint API and FUSE share.

A checkpoint URL names one object: ``hdfs://nn:9000/ckpt/step100/model.pt`` is the key
``model.pt`` in the store rooted at ``hdfs://nn:9000/ckpt/step100``. Stores are opened once
per directory and process, so repeated opens reuse the HDFS connection.
"""

from __future__ import annotations

import functools
import io
import posixpath
from typing import BinaryIO
from urllib.parse import urlsplit, urlunsplit

from bootseer.store import Store, open_store
from stripedfs.config import StripeConfig
from stripedfs.reader import StripedReader


def split_url(url: str) -> tuple[str, str]:
    """``scheme://host/dir/name`` → (``scheme://host/dir``, ``name``)."""
    parts = urlsplit(url)
    directory, name = posixpath.split(parts.path.rstrip("/"))
    if not name:
        raise ValueError(f"{url}: names a directory, not a checkpoint file")
    return urlunsplit(parts._replace(path=directory or "/")), name


@functools.lru_cache(maxsize=64)
def store_for(directory_url: str) -> Store:
    return open_store(directory_url)


class StripedFile(io.RawIOBase):
    """A read-only, seekable raw file over a :class:`StripedReader`."""

    def __init__(self, reader: StripedReader) -> None:
        self.reader = reader
        self.name = reader.name
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.reader.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer) -> int:  # type: ignore[override]
        n = self.reader.readinto(self._pos, buffer)
        self._pos += n
        return n

    def readall(self) -> bytes:
        data = self.reader.read(self._pos, max(0, self.reader.size - self._pos))
        self._pos += len(data)
        return data

    def close(self) -> None:
        if not self.closed:
            self.reader.close()
        super().close()


def open_striped(url: str, *, config: StripeConfig | None = None,
                 buffer_size: int = 1 << 20) -> BinaryIO:
    """A buffered binary file reading ``url`` through the striped reader."""
    directory, name = split_url(url)
    reader = StripedReader(store_for(directory), name, config=config)
    return io.BufferedReader(StripedFile(reader), buffer_size=buffer_size)  # type: ignore[return-value]

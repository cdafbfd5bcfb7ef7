"""From a URL to a striped, file-like reader: what the checkpoint API and FUSE share.

A checkpoint URL names one object: ``hdfs://nn:9000/ckpt/step100/model.pt`` is the key
``model.pt`` in the store rooted at ``hdfs://nn:9000/ckpt/step100``. Stores are opened once
per directory and process, so repeated opens reuse the HDFS connection.
"""

from __future__ import annotations

import functools
import posixpath
from typing import BinaryIO
from urllib.parse import urlsplit, urlunsplit

from bootseer.store import Store, open_store
from bootseer.store.base import open_ranged
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


def open_striped(url: str, *, config: StripeConfig | None = None,
                 buffer_size: int = 1 << 20) -> BinaryIO:
    """A buffered binary file reading ``url`` through the striped reader."""
    directory, name = split_url(url)
    reader = StripedReader(store_for(directory), name, config=config)
    return striped_file(reader, buffer_size=buffer_size)


def striped_file(reader: StripedReader, *, buffer_size: int = 1 << 20) -> BinaryIO:
    """A buffered, seekable file over ``reader``; closing it closes the reader."""
    return open_ranged(reader.readinto, reader.size, reader.name, buffer_size=buffer_size,
                       on_close=reader.close)

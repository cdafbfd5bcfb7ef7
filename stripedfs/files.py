"""From a URL to a striped, file-like reader: what the checkpoint API and FUSE share.

A checkpoint URL names one object: ``hdfs://nn:9000/ckpt/step100/model.pt`` is the key
``model.pt`` in the store rooted at ``hdfs://nn:9000/ckpt/step100``. Stores are opened once
per directory and process, so repeated opens reuse the HDFS connection.

The checkpoint API opens objects with :func:`open_reader`: the node's staged copy
(``bootseer warm --checkpoint``, :mod:`bootseer.stripedfs.checkpoint_cache`) when it is a copy of
the object the store holds now, else the striped reader over the network.
"""

from __future__ import annotations

import functools
import posixpath
from typing import BinaryIO
from urllib.parse import urlsplit, urlunsplit

from bootseer.store import Store, open_store
from bootseer.store.base import open_ranged
from bootseer.stripedfs.checkpoint_cache import CopyReader, node_cache, object_url
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.reader import StripedReader

#: What :func:`open_reader` returns: both read with the same methods.
Reader = StripedReader | CopyReader


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
    """A buffered binary file reading ``url``: its staged copy, or the striped reader."""
    directory, name = split_url(url)
    return striped_file(open_reader(store_for(directory), name, config=config),
                        buffer_size=buffer_size)


def open_reader(store: Store, key: str, *, config: StripeConfig | None = None) -> Reader:
    """``key`` of ``store`` from the node's staged copy if it matches the object now, else
    through the striped reader; one ``stat`` of the object either way."""
    info = store.stat(key)
    cache = node_cache()
    copy = cache.open_copy(object_url(store, key), info) if cache is not None else None
    if copy is not None:
        return copy
    return StripedReader(store, key, config=config, size=info.size)


def striped_file(reader: Reader, *, buffer_size: int = 1 << 20) -> BinaryIO:
    """A buffered, seekable file over ``reader``; closing it closes the reader."""
    return open_ranged(reader.readinto, reader.size, reader.name, buffer_size=buffer_size,
                       on_close=reader.close)

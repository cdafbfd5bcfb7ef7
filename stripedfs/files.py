"""The one checkpoint read path: from a store object to a reader, staged copy first.

Every checkpoint byte Bootseer reads (the checkpoint API, ``bootseer ckpt get``, checkpoint
mounts) comes through :func:`open_reader`: the node's staged copy (``bootseer warm
--checkpoint``, :mod:`bootseer.stripedfs.checkpoint_cache`) when it is a copy of the object
the store holds now, else the striped reader over the network.

A process reads checkpoints per its configuration through a :class:`CheckpointSource`:
stores opened with the configured ``hdfs.*`` options (one function,
:func:`bootseer.store.registry.store_options`, for every command), once per directory, so
repeated opens reuse the HDFS connection; the node's copies where the configuration (CLI
flags included, for commands) puts them; and the observer that hears about reads.

A checkpoint URL names one object: ``hdfs://nn:9000/ckpt/step100/model.pt`` is the key
``model.pt`` in the store rooted at ``hdfs://nn:9000/ckpt/step100``.
"""

from __future__ import annotations

import functools
import os
import posixpath
from collections.abc import Callable
from typing import Any, BinaryIO
from urllib.parse import urlsplit, urlunsplit

from bootseer.config import Config
from bootseer.store import ObjectInfo, Store, open_store
from bootseer.store.base import open_ranged
from bootseer.store.registry import store_options
from bootseer.stripedfs.checkpoint_cache import CheckpointCache, object_url
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.localfile import LocalFileReader
from bootseer.stripedfs.observer import ReadObserver
from bootseer.stripedfs.reader import StripedReader

#: What :func:`open_reader` returns: both read with the same methods.
Reader = StripedReader | LocalFileReader
#: ``peers(url, info, offset, length)``: bytes of the object ``url`` (the version ``info``
#: describes) through the node's peers, or None (a checkpoint mount of a job's container:
#: :meth:`bootseer.agents.client.AgentClient.peer_read_file`).
PeerFiles = Callable[[str, ObjectInfo, int, int], "bytes | None"]


def split_url(url: str) -> tuple[str, str]:
    """``scheme://host/dir/name`` → (``scheme://host/dir``, ``name``)."""
    parts = urlsplit(url)
    directory, name = posixpath.split(parts.path.rstrip("/"))
    if not name:
        raise ValueError(f"{url}: names a directory, not a checkpoint file")
    return urlunsplit(parts._replace(path=directory or "/")), name


def open_reader(store: Store, key: str, *, config: StripeConfig | None = None,
                copies: CheckpointCache | None = None,
                observer: ReadObserver | None = None,
                peers: PeerFiles | None = None) -> Reader:
    """``key`` of ``store``: from its copy in ``copies`` if that is a copy of the object
    the store holds now; else the file itself where the store is this node's file system
    and no ``peers`` are asked; else through the striped reader (with ``config``; each
    stripe asked of ``peers`` first, if given). ``observer`` hears of the reader's first
    bytes."""
    info = store.stat(key)
    url = object_url(store, key)
    if copies is not None:
        copy = copies.open_copy(url, info, observer=observer)
        if copy is not None:
            return copy
    fd = None if peers is not None else store.open_local(key)
    if fd is not None:
        return LocalFileReader(fd, os.fstat(fd).st_size, url, observer=observer)
    peer_read = None if peers is None else functools.partial(peers, url, info)
    return StripedReader(store, key, config=config, size=info.size, observer=observer,
                         peer_read=peer_read)


def striped_file(reader: Reader, *, buffer_size: int = 1 << 20) -> BinaryIO:
    """A buffered, seekable file over ``reader``; closing it closes the reader."""
    return open_ranged(reader.readinto, reader.size, reader.name, buffer_size=buffer_size,
                       on_close=reader.close)


class CheckpointSource:
    """Where one process reads checkpoints from, as ``config`` says: its stores, the
    node's staged copies, and ``observer`` told of every reader's first bytes."""

    def __init__(self, config: Config, *, observer: ReadObserver | None = None) -> None:
        self.config, self.observer = config, observer
        self.copies = CheckpointCache.for_config(config)
        #: The striped reader's knobs as the config file sets them (``[checkpoint]``).
        self.stripes = StripeConfig.from_config(config)

    def store(self, url: str) -> Store:
        """The store rooted at ``url``, with the configured backend options."""
        return _open_store(url, tuple(sorted(store_options(self.config, url).items())))

    def locate(self, url: str) -> tuple[Store, str]:
        """The store holding the checkpoint file ``url``, and its key there."""
        directory, name = split_url(url)
        return self.store(directory), name

    def open(self, store: Store, key: str, *, config: StripeConfig | None = None) -> Reader:
        """:func:`open_reader` with this source's copies and observer, and its
        :attr:`stripes` unless ``config`` is given."""
        return open_reader(store, key, config=config or self.stripes, copies=self.copies,
                           observer=self.observer)

    def open_url(self, url: str, *, config: StripeConfig | None = None) -> Reader:
        return self.open(*self.locate(url), config=config)


@functools.lru_cache(maxsize=64)
def _open_store(url: str, options: tuple[tuple[str, Any], ...]) -> Store:
    """Stores are opened once per URL and options per process (an HDFS connection each)."""
    return open_store(url, **dict(options))

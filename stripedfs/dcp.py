"""A ``torch.distributed.checkpoint`` storage reader that reads every item in parallel.

DCP's ``FileSystemReader`` (and ``FsspecReader`` on top of it) reads a checkpoint file one
item range at a time, in a loop: over a remote store that is one round trip after another.
This reader keeps DCP's own logic (planning, transforms, tensor placement) and changes
only where the bytes come from: before DCP walks its items, every item's byte range is
submitted to the striped reader, stripes of all items in parallel, with at most
``max_bytes_in_flight`` fetched ahead of the item DCP is loading.
"""

from __future__ import annotations

import io
import os
import posixpath
from collections import deque
from collections.abc import Generator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader

from bootseer.store import Store
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.files import CheckpointSource, Reader, striped_file
from bootseer.stripedfs.localfile import LocalRange
from bootseer.stripedfs.reader import PendingRange


class _StoreFileSystem(FileSystemBase):
    """DCP's file-system interface over a store (read side only)."""

    def __init__(self, source: CheckpointSource, url: str, config: StripeConfig) -> None:
        self.source, self.config = source, config
        self.store: Store = source.store(url)

    def open(self, path: str) -> Reader:
        return self.source.open(self.store, path, config=self.config)

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if "r" not in mode:
            raise io.UnsupportedOperation("the striped DCP reader only reads")
        with striped_file(self.open(str(path))) as f:
            yield f

    def concat_path(self, path: str | os.PathLike, suffix: str) -> str:
        return posixpath.join(str(path), suffix) if str(path) else suffix

    def init_path(self, path: str | os.PathLike) -> str:
        return ""

    def exists(self, path: str | os.PathLike) -> bool:
        return self.store.exists(str(path))

    def rename(self, path, new_path) -> None:
        raise io.UnsupportedOperation("read only")

    def mkdir(self, path) -> None:
        raise io.UnsupportedOperation("read only")

    def rm_file(self, path) -> None:
        raise io.UnsupportedOperation("read only")

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return "://" in str(checkpoint_id)


class StripedStorageReader(FileSystemReader):
    """Load a DCP checkpoint directory at ``url`` with parallel, batched reads, through
    ``source`` (its stores, staged copies and observer: the checkpoint API's)."""

    def __init__(self, url: str, *, source: CheckpointSource,
                 config: StripeConfig | None = None,
                 max_bytes_in_flight: int = 1 << 30) -> None:
        super().__init__(".")
        self.url, self.source = url, source
        self.config = config or source.stripes
        self.fs = _StoreFileSystem(source, url, self.config)
        self.path = ""
        self.max_bytes_in_flight = max_bytes_in_flight
        self._fetched: dict[tuple[str, int, int], PendingRange | LocalRange] = {}
        self._queue: deque[tuple[str, int, int]] = deque()
        self._readers: dict[str, Reader] = {}
        self._in_flight = 0

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(None)
        if checkpoint_id:
            self.url = str(checkpoint_id)
            self.fs = _StoreFileSystem(self.source, self.url, self.config)
        self.path = ""

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return _StoreFileSystem.validate_checkpoint_id(checkpoint_id)

    def read_data(self, plan: Any, planner: Any) -> Future[None]:
        # The same order FileSystemReader.read_data walks: grouped by file, then by item.
        per_file: dict[str, list[tuple[str, int, int]]] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            per_file.setdefault(info.relative_path, []).append(
                (info.relative_path, info.offset, info.length))
        self._queue = deque(r for ranges in per_file.values() for r in ranges)
        try:
            self._submit_more()
            return super().read_data(plan, planner)
        finally:
            for pending in self._fetched.values():
                pending.cancel()
            self._fetched.clear()
            self._readers.clear()
            self._in_flight = 0

    def _reader(self, path: str) -> Reader:
        reader = self._readers.get(path)
        if reader is None:
            reader = self._readers[path] = self.fs.open(path)
        return reader

    def _submit_more(self) -> None:
        while self._queue and (not self._fetched or
                               self._in_flight + self._queue[0][2] <= self.max_bytes_in_flight):
            path, offset, length = self._queue.popleft()
            self._fetched[(path, offset, length)] = self._reader(path).submit_range(offset, length)
            self._in_flight += length

    def _slice_file(self, file: Any, sinfo: Any) -> io.BytesIO:
        pending = self._fetched.pop((sinfo.relative_path, sinfo.offset, sinfo.length), None)
        if pending is None:  # an item DCP reads twice: fetch it again
            pending = self._reader(sinfo.relative_path).submit_range(sinfo.offset, sinfo.length)
        else:
            self._in_flight -= sinfo.length
        self._submit_more()
        return io.BytesIO(pending.result())

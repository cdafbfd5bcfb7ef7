"""A ``torch.distributed.checkpoint`` storage reader that reads every item in parallel.

DCP's ``FileSystemReader`` (and ``FsspecReader`` on top of it) reads a checkpoint file one
item range at a time, in a loop: over a remote store that is one round trip after another.
This reader keeps DCP's own logic (planning, transforms, tensor placement) and changes
where the bytes come from and how they reach a tensor: before DCP walks its items, every
item's byte range is submitted to the checkpoint reader, stripes of all items in
parallel, with at most ``max_bytes_in_flight`` fetched ahead of the item being loaded;
and a tensor item is copied into its destination (the planner's tensor, on any device)
straight from those bytes, not unpickled into a tensor of its own first. Only this rank's
items are in its plan, so a rank reads only its own bytes.
"""

from __future__ import annotations

import io
import os
import posixpath
from collections import deque
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader
from torch.distributed.checkpoint.planner import LoadItemType

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

    def read_data(self, plan: Any, planner: Any) -> torch.futures.Future[None]:
        """DCP's ``FileSystemReader.read_data`` with two changes: every item's bytes are
        fetched ahead (:meth:`_submit_more`), and a tensor item is copied into its
        destination straight from the fetched bytes (:func:`saved_tensor`) instead of
        being unpickled into a tensor of its own first."""
        # The same order FileSystemReader.read_data walks: grouped by file, then by item.
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path,
                                []).append(item)
        items = [item for reqs in per_file.values() for item in reqs]
        self._queue = deque(self._range(item) for item in items)
        try:
            self._submit_more()
            for req in items:
                info = self.storage_data[req.storage_index]
                data = self._take(self._range(req))
                transforms = getattr(info, "transform_descriptors", None)
                if transforms:  # compressed, say: DCP's extensions undo it
                    data = bytearray(self.transforms.transform_load_stream(
                        req, transforms, io.BytesIO(data)).read())
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(data))
                    continue
                source = narrow_tensor_by_index(saved_tensor(data, info.relative_path),
                                                req.storage_offsets, req.lengths)
                target = planner.resolve_tensor(req).detach()
                if target.size() != source.size():
                    raise ValueError(f"{self.url}/{info.relative_path}: item "
                                     f"{req.storage_index} is {tuple(source.size())}, its "
                                     f"destination {tuple(target.size())}")
                target.copy_(source)
                planner.commit_tensor(req, target)
        finally:
            for pending in self._fetched.values():
                pending.cancel()
            self._fetched.clear()
            self._readers.clear()
            self._in_flight = 0
        done: torch.futures.Future[None] = torch.futures.Future()
        done.set_result(None)
        return done

    def _range(self, req: Any) -> tuple[str, int, int]:
        info = self.storage_data[req.storage_index]
        return info.relative_path, info.offset, info.length

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

    def _take(self, key: tuple[str, int, int]) -> bytearray:
        """The bytes of the item ``key`` names, fetched ahead or now (an item DCP reads
        twice is fetched again)."""
        pending = self._fetched.pop(key, None)
        if pending is None:
            pending = self._reader(key[0]).submit_range(key[1], key[2])
        else:
            self._in_flight -= key[2]
        self._submit_more()
        return pending.result()


def saved_tensor(data: bytearray, where: str) -> torch.Tensor:
    """The tensor ``torch.save`` wrote into ``data``, as a view of ``data``'s bytes.

    ``torch.load`` would copy the tensor's storage out of the bytes before DCP copies it
    into the destination; loaded onto the ``meta`` device it reads only the pickle and
    says where the storage's bytes are, so the destination is filled from the fetched
    bytes directly. A view that does not fit in the bytes is refused by ``as_strided``;
    a torch that does not say where the storage is loads it the ordinary way.
    """
    meta = torch.load(_Unread(data), map_location="meta", weights_only=True)
    if not isinstance(meta, torch.Tensor):
        raise ValueError(f"{where}: a tensor item holds a {type(meta).__name__}")
    storage = meta.untyped_storage()
    offset = getattr(storage, "_checkpoint_offset", None)
    if offset is None or not 0 <= offset <= offset + storage.nbytes() <= len(data):
        return torch.load(_Unread(data), map_location="cpu", weights_only=True)
    if storage.nbytes() == 0:
        return torch.empty(meta.shape, dtype=meta.dtype)
    base = torch.frombuffer(data, dtype=torch.uint8, count=storage.nbytes(), offset=offset)
    return base.view(meta.dtype).as_strided(meta.shape, meta.stride(), meta.storage_offset())


class _Unread(io.RawIOBase):
    """A read-only file over bytes in memory, without the copy ``io.BytesIO`` makes."""

    def __init__(self, data: bytearray) -> None:
        super().__init__()
        self._view, self._pos = memoryview(data), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        piece = self._view[self._pos : self._pos + len(buffer)]
        memoryview(buffer).cast("B")[: len(piece)] = piece
        self._pos += len(piece)
        return len(piece)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

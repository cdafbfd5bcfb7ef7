"""A ``torch.distributed.checkpoint`` storage reader that reads every item in parallel.

DCP's ``FileSystemReader`` (and ``FsspecReader`` on top of it) reads a checkpoint file one
item range at a time, in a loop, and unpickles each item into a tensor of its own before
copying it into its destination: over a remote store that is one round trip after another.
This reader keeps DCP's own logic (planning, transforms, tensor placement) and changes
where the bytes come from and how they reach a tensor (:meth:`StripedStorageReader.read_data`):
a local file's items go straight into their destinations through the tensor loader; a
remote file's items are fetched in parallel, at most ``max_bytes_in_flight`` ahead, and
copied into their destinations from the fetched bytes. Only this rank's items are in its
plan, so a rank reads only its own bytes.
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
from bootseer.stripedfs import tensorload
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.files import CheckpointSource, Reader, striped_file
from bootseer.stripedfs.localfile import LocalFileReader, LocalRange
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
        """DCP's ``FileSystemReader.read_data``, the items in its order (by file, then by
        item), with its bytes read differently:

        * a file on this node (a staged copy, a ``file://`` store): each tensor item whose
          destination can take its bytes as they are (same dtype and shape, both
          contiguous, the whole item wanted) is read straight into the destination by the
          tensor loader, every such item of the file at once (through the pinned pool for
          a GPU); only the item's pickle and zip directory are read to find where its
          bytes lie;
        * any other item is fetched ahead (:meth:`_submit_more`, every item of a remote
          file in parallel) and copied into its destination from the fetched bytes
          (:func:`saved_tensor`), not unpickled into a tensor of its own first.
        """
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path,
                                []).append(item)
        local = {path for path in per_file if isinstance(self._reader(path), LocalFileReader)}
        self._queue = deque(self._range(item) for path, reqs in per_file.items()
                            if path not in local for item in reqs)
        try:
            self._submit_more()
            for path, reqs in per_file.items():
                if path in local:
                    self._load_local(self._reader(path), reqs, planner)
                else:
                    for req in reqs:
                        self._load_fetched(req, planner)
        finally:
            for pending in self._fetched.values():
                pending.cancel()
            self._fetched.clear()
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()
            self._in_flight = 0
        done: torch.futures.Future[None] = torch.futures.Future()
        done.set_result(None)
        return done

    def _load_local(self, reader: LocalFileReader, reqs: list[Any], planner: Any) -> None:
        """One local file's items: those that can, straight into their destinations in one
        batch (committed once all are in); the others from their fetched bytes."""
        direct = []
        for req in reqs:
            info = self.storage_data[req.storage_index]
            target = None
            if req.type != LoadItemType.BYTE_IO and \
                    not getattr(info, "transform_descriptors", None):
                target = planner.resolve_tensor(req).detach()
                start = _whole_item(_ItemFile(reader, info.offset, info.length), req, target)
                if start is not None:
                    direct.append((req, target, info.offset + start))
                    continue
            self._load_fetched(req, planner, target)
        tensorload.read_into([(reader, offset, target) for _, target, offset in direct],
                             self.config)
        for req, target, _ in direct:
            planner.commit_tensor(req, target)

    def _load_fetched(self, req: Any, planner: Any, target: torch.Tensor | None = None) -> None:
        """One item from its fetched bytes (``target``: its destination, if resolved)."""
        info = self.storage_data[req.storage_index]
        data = self._take(self._range(req))
        transforms = getattr(info, "transform_descriptors", None)
        if transforms:  # compressed, say: DCP's extensions undo it
            data = bytearray(self.transforms.transform_load_stream(
                req, transforms, io.BytesIO(data)).read())
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(data))
            return
        source = narrow_tensor_by_index(saved_tensor(data, info.relative_path),
                                        req.storage_offsets, req.lengths)
        if target is None:
            target = planner.resolve_tensor(req).detach()
        if target.size() != source.size():
            raise ValueError(f"{self.url}/{info.relative_path}: item {req.storage_index} is "
                             f"{tuple(source.size())}, its destination {tuple(target.size())}")
        target.copy_(source)
        planner.commit_tensor(req, target)

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


class _ItemFile(_Unread):
    """One item of a local checkpoint file, read on demand (the pickle and the zip
    directory ``torch.load`` onto ``meta`` asks for, not the tensor's bytes)."""

    def __init__(self, reader: LocalFileReader, offset: int, length: int) -> None:
        io.RawIOBase.__init__(self)
        self._reader, self._offset, self.length, self._pos = reader, offset, length, 0

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")[: max(0, self.length - self._pos)]
        n = self._reader.readinto(self._offset + self._pos, view) if len(view) else 0
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.length}[whence]
        self._pos = max(0, base + offset)
        return self._pos


def _whole_item(item: _ItemFile, req: Any, target: torch.Tensor) -> int | None:
    """Where in ``item`` the bytes ``target`` takes as they are start, or None where they
    cannot be read into it directly (a part of the saved tensor wanted, another dtype or
    layout, an empty tensor, a torch that does not say where the storage is)."""
    try:
        meta = torch.load(item, map_location="meta", weights_only=True)
    except Exception:  # the fetched path reports it, with the item's name
        return None
    if not isinstance(meta, torch.Tensor):
        return None
    storage = meta.untyped_storage()
    offset = getattr(storage, "_checkpoint_offset", None)
    nbytes = meta.numel() * meta.element_size()
    if offset is None or nbytes == 0 or not meta.is_contiguous() or \
            not target.is_contiguous() or meta.dtype != target.dtype or \
            tuple(target.shape) != tuple(meta.shape) or \
            tuple(req.storage_offsets) != (0,) * meta.dim() or \
            tuple(req.lengths) != tuple(meta.shape):
        return None
    start = offset + meta.storage_offset() * meta.element_size()
    if not 0 <= start <= start + nbytes <= item.length:
        return None
    return start

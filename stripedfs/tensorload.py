"""Checkpoint bytes straight into the tensors' own memory, on the host or a GPU: a pipeline.

A loader that reads a whole file into one host buffer, then copies it tensor by tensor to
the device, does each step after the other and moves every byte three times. This one does
what the fast hand-written loaders do (Run:ai's model streamer, ServerlessLLM, a careful
user's forty lines of ``preadv`` and ``cudaMemcpyAsync``):

* **Destinations first.** Every tensor's memory is allocated once, up front, where the
  tensor will live: one allocation per *run* (tensors that lie back to back in a file and
  are all wanted), the tensors views of it. Tensors nobody asked for are never read.
* **Chunks in parallel.** A run's bytes are read in the reader's chunks (a remote
  object's stripes, large positional reads of a local file), ``max_concurrent_fetches``
  at once on the process's fetch pool (a local file's: ``max_concurrent_local_reads``,
  one per core); local and remote reads release the GIL.
* **On the host, no buffer between**: a chunk is read straight into its destination.
* **To a device, through a bounded pool of pinned buffers**: a chunk is read into a pinned
  host buffer and copied to its destination asynchronously on a CUDA stream as soon as it
  lands, while the other workers read the next chunks; the buffer goes back to the pool
  once its copy is done. Host memory is the pool (at most ``max_memory``, kept for the
  process's next load; a worker holds one buffer at a time, so at most one per worker
  is ever pinned), whatever the checkpoint's size; device
  memory is the tensors.

The caller describes the tensors (:class:`TensorSlot`: a format's header, already
checked); this module knows no file format.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.localfile import LocalFileReader
from bootseer.stripedfs.memory import StripeMemory, shared_memory
from bootseer.stripedfs.reader import shared_pool

if TYPE_CHECKING:
    import torch

#: CUDA streams the device copies are spread over (a GPU has several copy engines).
COPY_STREAMS = 4


class ChunkReader(Protocol):
    """What the loader needs of a reader: both checkpoint readers are one."""

    name: str

    def chunks(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        """``[start, end)`` cut into the reader's (offset, length) reads."""

    def read_chunk_into(self, offset: int, view: memoryview) -> None:
        """Exactly ``len(view)`` bytes at ``offset``, in the calling thread."""


@dataclass(frozen=True)
class TensorSlot:
    """One tensor of a file: its name and type, and where its bytes lie in the file
    (``nbytes`` = the shape's element count x the dtype's size, checked by the caller)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass
class _Run:
    """Wanted tensors back to back in one file: one destination allocation."""

    start: int
    end: int
    slots: list[TensorSlot] = field(default_factory=list)


@dataclass(frozen=True)
class _Chunk:
    reader: ChunkReader
    offset: int
    dest: torch.Tensor  # uint8, this chunk's bytes of its run's destination


def runs(slots: Sequence[TensorSlot]) -> list[_Run]:
    """``slots`` of one file grouped into runs: a tensor joins the run before it when it
    starts where that run ends and its offset in the run suits its dtype (a view needs
    that); empty tensors are in no run."""
    out: list[_Run] = []
    for slot in sorted(slots, key=lambda s: s.start):
        if slot.nbytes == 0:
            continue
        last = out[-1] if out else None
        if last is not None and slot.start == last.end and \
                (slot.start - last.start) % slot.dtype.itemsize == 0:
            last.end = slot.end
        else:
            last = _Run(slot.start, slot.end)
            out.append(last)
        last.slots.append(slot)
    return out


def load(files: Sequence[tuple[ChunkReader, Sequence[TensorSlot]]], device: str | torch.device,
         config: StripeConfig, *, staged: bool | None = None) -> dict[str, torch.Tensor]:
    """The tensors ``files`` describe, on ``device``: each file's slots read through its
    reader. Names must be unique across files (the caller checks). ``staged``: as for
    :func:`read_into`."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    tensors: dict[str, torch.Tensor] = {}
    pieces: list[tuple[ChunkReader, int, torch.Tensor]] = []
    for reader, slots in files:
        for slot in slots:
            if slot.nbytes == 0:
                tensors[slot.name] = torch.empty(slot.shape, dtype=slot.dtype, device=device)
        for run in runs(slots):
            dest = torch.empty(run.end - run.start, dtype=torch.uint8, device=device)
            for slot in run.slots:
                view = dest[slot.start - run.start : slot.end - run.start]
                tensors[slot.name] = view.view(slot.dtype).reshape(slot.shape)
            pieces.append((reader, run.start, dest))
    read_into(pieces, config, staged=staged)
    return tensors


def read_into(pieces: Sequence[tuple[ChunkReader, int, torch.Tensor]], config: StripeConfig,
              *, staged: bool | None = None) -> None:
    """Fill each piece's destination (a contiguous tensor, on any device) with its bytes
    from its reader at its offset, every chunk of every piece on the fetch pool at once.
    ``staged`` says whether chunks go through staging buffers (default: for destinations
    off the host; True on the host runs a device load's steps without a device)."""
    import torch

    chunks: list[_Chunk] = []
    for reader, start, dest in pieces:
        if not dest.is_contiguous():  # reshape would copy: the bytes would land elsewhere
            raise ValueError(f"{reader.name}: a destination must be contiguous")
        flat = dest.reshape(-1).view(torch.uint8)
        chunks.extend(_Chunk(reader, offset, flat[offset - start : offset - start + length])
                      for offset, length in reader.chunks(start, start + flat.numel()))
    by_device: dict[object, list[_Chunk]] = {}
    for chunk in chunks:
        by_device.setdefault(chunk.dest.device, []).append(chunk)
    fills = []
    for device, mine in by_device.items():
        if (device.type != "cpu") if staged is None else staged:
            largest = max(chunk.dest.numel() for chunk in mine)
            fills.append((mine, _Staged(device, config, largest).fill))
        else:
            fills.append((mine, _into_host))
    local = all(isinstance(reader, LocalFileReader) for reader, _, _ in pieces)
    _run_all([(fill, chunk) for mine, fill in fills for chunk in mine],
             config.local_reads if local else config.max_concurrent_fetches)


_PAGE = 4096
_MADV_POPULATE_WRITE = 23  # Linux 5.14


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def _populate(view: memoryview) -> None:
    """Fault in the fresh pages under ``view`` in one call before a read fills them.

    A read into fresh memory otherwise takes one page fault per 4 KiB inside the copy;
    ``MADV_POPULATE_WRITE`` maps them in a loop in the kernel instead. From the page
    cache on two cores that loads 2 GiB in 0.55 s instead of 0.64 s (the library with a
    forced copy: 0.57 s). A hint only: older kernels answer EINVAL and the read faults.
    (Huge pages did better on an idle machine and far worse once memory was fragmented:
    the kernel compacts memory in the faulting thread.)"""
    address = ctypes.addressof(ctypes.c_char.from_buffer(view))
    start = -(-address // _PAGE) * _PAGE
    end = (address + len(view)) // _PAGE * _PAGE
    if end > start:
        _libc().madvise(start, end - start, _MADV_POPULATE_WRITE)


def _run_all(work: list[tuple[Callable[[_Chunk], None], _Chunk]], workers: int) -> None:
    """Every chunk filled on the fetch pool; the first error is raised once no worker
    writes into the tensors any more."""
    pool = shared_pool(workers)
    futures: list[Future] = [pool.submit(fill, chunk) for fill, chunk in work]
    try:
        for future in futures:
            future.result()
    except BaseException:
        for future in futures:
            future.cancel()
        wait(futures)
        raise


def host_view(tensor: torch.Tensor) -> memoryview:
    """A writable view of a contiguous host tensor's bytes (the caller keeps the tensor
    alive while it is used)."""
    nbytes = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_ubyte * nbytes).from_address(tensor.data_ptr())).cast("B")


def _into_host(chunk: _Chunk) -> None:
    view = host_view(chunk.dest)
    _populate(view)
    chunk.reader.read_chunk_into(chunk.offset, view)


class _Staged:
    """Chunks through pooled staging buffers to a device: pinned host memory and async
    copies on CUDA streams (synchronous copies for any other device)."""

    def __init__(self, device: torch.device, config: StripeConfig, largest: int) -> None:
        import torch

        self.device = device
        self.cuda = device.type == "cuda"
        self.memory: StripeMemory = staging_memory(config, largest, pinned=self.cuda)
        self._streams = []
        if self.cuda:
            current = torch.cuda.current_stream(device)
            for _ in range(COPY_STREAMS):
                stream = torch.cuda.Stream(device)
                # Destinations may be memory the caching allocator just took back from
                # work still queued on the current stream: copies go after that work.
                stream.wait_stream(current)
                self._streams.append(stream)
        self._next = itertools.count()
        self._lock = threading.Lock()

    def fill(self, chunk: _Chunk) -> None:
        import torch

        (buffer,) = self.memory.take(1)
        try:
            staged = buffer[: chunk.dest.numel()]
            chunk.reader.read_chunk_into(chunk.offset, host_view(staged))
            if not self.cuda:
                chunk.dest.copy_(staged)
                return
            with self._lock:
                stream = self._streams[next(self._next) % len(self._streams)]
            with torch.cuda.stream(stream):
                chunk.dest.copy_(staged, non_blocking=True)
                done = stream.record_event()
            done.synchronize()  # the buffer is free once its bytes are on the device
        finally:
            self.memory.give(buffer)


def staging_memory(config: StripeConfig, largest: int, *, pinned: bool) -> StripeMemory:
    """The process's staging buffers for chunks of up to ``largest`` bytes: a power of two
    of at least 1 MiB each (so that loads of any file share a few pools), ``max_memory``
    in all, pinned for CUDA. Kept for the process's next load: pinning costs more than
    reading from the page cache."""
    import torch

    size = max(1 << 20, 1 << (largest - 1).bit_length())
    return shared_memory(
        size, config.max_memory, kind="pinned" if pinned else "staging",
        allocate=lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=pinned))

"""Ways to load a local safetensors checkpoint, shared by ``bench-ckpt`` (its uncapped
page-cache case, into host memory) and ``bench-ckpt-gpu`` (onto a GPU).

Each loader takes the checkpoint's shard paths and a device and returns the tensors:

* ``bootseer``: ``bootseer.checkpoint.load_safetensors`` of the index (``file://``);
* ``library``: the safetensors library's ``load_file(path, device=...)``, shard by shard
  (on the host its tensors are views of an mmap that nothing has read yet, so the host
  case forces a copy: ``library_copy``);
* ``best_practice``: what a careful user writes by hand: per shard, the header parsed,
  one destination buffer allocated where the tensors will live, ``THREADS`` workers each
  reading ``CHUNK`` bytes at a time with ``preadv`` into its own slot of one reused pinned
  buffer and copying it asynchronously to the device on its own stream; tensors are views
  of the destination buffer (on the host the reads land in the destination directly);
* ``plain_read``: ``read()`` of every file, the bytes and nothing else;
* for a DCP checkpoint (``write_dcp``; its directory is the one path): ``dcp_bootseer``
  (``dcp.load`` through ``bootseer.checkpoint.StorageReader``) and ``dcp_torch`` (through
  DCP's own ``FileSystemReader``), each into freshly allocated destinations.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

import bootseer.checkpoint as ckpt
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.tensorload import host_view

MIB = 1 << 20
#: The hand-written loader's workers and read size (the issue's: 16 threads of 16 MiB).
THREADS, CHUNK = 16, 16 * MIB
DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
          "I64": torch.int64, "U8": torch.uint8}

Loader = Callable[[list[Path], str], dict[str, torch.Tensor]]


def write_checkpoint(directory: Path, total_bytes: int, shards: int) -> list[Path]:
    """A sharded bf16 checkpoint of about ``total_bytes`` (tensors of 64 MiB and a few
    small ones per shard, as a transformer's layers are) and its index."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    per_shard = max(1, total_bytes // shards // (64 * MIB))
    g = torch.Generator().manual_seed(0)
    weight_map, paths = {}, []
    for k in range(shards):
        tensors = {f"layers.{k}.w{j}": torch.randn(32 * MIB, generator=g).to(torch.bfloat16)
                   for j in range(per_shard)}
        tensors[f"layers.{k}.norm"] = torch.randn(4099, generator=g).to(torch.bfloat16)
        path = directory / f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, path)
        weight_map.update(dict.fromkeys(tensors, path.name))
        paths.append(path)
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return paths


def write_dcp(directory: Path, total_bytes: int) -> dict[str, torch.Tensor]:
    """A DCP checkpoint of about ``total_bytes`` of bf16 tensors of 64 MiB (what it saved
    is returned, to check loads against)."""
    import torch.distributed.checkpoint as dcp

    g = torch.Generator().manual_seed(3)
    state = {f"layers.{i}.w": torch.randn(32 * MIB, generator=g).to(torch.bfloat16)
             for i in range(max(1, total_bytes // (64 * MIB)))}
    dcp.save(state, checkpoint_id=directory, no_dist=True)
    return state


def _dcp_targets(directory: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(directory).read_metadata().state_dict_metadata
    return {name: torch.empty(md.size, dtype=md.properties.dtype)
            for name, md in metadata.items()}


def dcp_bootseer(paths: list[Path], device: str) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp

    target = _dcp_targets(paths[0])
    dcp.load(target, storage_reader=ckpt.StorageReader(paths[0].as_uri()), no_dist=True)
    return target


def dcp_torch(paths: list[Path], device: str) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp

    target = _dcp_targets(paths[0])
    dcp.load(target, storage_reader=dcp.FileSystemReader(paths[0]), no_dist=True)
    return target


def bootseer(config: StripeConfig | None = None) -> Loader:
    def load(paths: list[Path], device: str) -> dict[str, torch.Tensor]:
        if len(paths) == 1:
            return ckpt.load_safetensors(paths[0].as_uri(), device, config=config)
        index = paths[0].parent / "model.safetensors.index.json"
        return ckpt.load_safetensors(index.as_uri(), device, config=config)
    return load


def library(paths: list[Path], device: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for path in paths:
        out.update(load_file(path, device=device))
    return out


def library_copy(paths: list[Path], device: str) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in library(paths, device).items()}


def plain_read(paths: list[Path], device: str) -> dict[str, torch.Tensor]:
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            f.read()
    return {}


def best_practice(paths: list[Path], device: str) -> dict[str, torch.Tensor]:
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    pinned = torch.empty(THREADS * CHUNK, dtype=torch.uint8, pin_memory=True) if cuda else None
    streams = [torch.cuda.Stream(dev) for _ in range(THREADS)] if cuda else []
    out: dict[str, torch.Tensor] = {}
    with ThreadPoolExecutor(THREADS) as pool:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
                header = json.loads(os.pread(fd, n, 8))
                header.pop("__metadata__", None)
                start, size = 8 + n, os.fstat(fd).st_size - 8 - n
                dest = torch.empty(size, dtype=torch.uint8, device=dev)

                def worker(slot: int, fd: int = fd, start: int = start, size: int = size,
                           dest: torch.Tensor = dest) -> None:
                    buf = pinned[slot * CHUNK : (slot + 1) * CHUNK] if cuda else None
                    for offset in range(slot * CHUNK, size, THREADS * CHUNK):
                        length = min(CHUNK, size - offset)
                        target = buf[:length] if cuda else dest[offset : offset + length]
                        view = host_view(target)
                        done = 0
                        while done < length:
                            done += os.preadv(fd, [view[done:]], start + offset + done)
                        if cuda:
                            with torch.cuda.stream(streams[slot]):
                                dest[offset : offset + length].copy_(target, non_blocking=True)
                            streams[slot].synchronize()

                list(pool.map(worker, range(THREADS)))
            finally:
                os.close(fd)
            for name, spec in header.items():
                begin, end = spec["data_offsets"]
                out[name] = dest[begin:end].view(DTYPES[spec["dtype"]]).reshape(spec["shape"])
    return out


def same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    """Every tensor byte-exact (compared on the host, one at a time)."""
    if set(got) != set(want):
        return False
    return all(got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and
               torch.equal(got[k].cpu().reshape(-1).view(torch.uint8),
                           want[k].cpu().reshape(-1).view(torch.uint8)) for k in want)

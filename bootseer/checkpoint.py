"""The checkpoint-load API for training scripts: fast reads of remote checkpoints.

Everything reads through the striped reader (``stripedfs``): parallel ranged reads over
the DataNodes holding the file, with read-ahead, straight into memory — no FUSE, never an
mmap of a remote file. A file ``bootseer warm --checkpoint`` staged on this node is read
from that local copy instead, as long as the store's object is still the one copied (its
size and mtime; :mod:`bootseer.stripedfs.checkpoint_cache`)::

    import bootseer.checkpoint as ckpt
    state = ckpt.load("hdfs://namenode:8020/ckpt/step100/model.pt", map_location="cpu")
    tensors = ckpt.load_safetensors("hdfs://namenode:8020/ckpt/step100/model.safetensors")
    tensors = ckpt.load_safetensors("hdfs://namenode:8020/llm/model.safetensors.index.json")
    dcp.load(state_dict, storage_reader=ckpt.StorageReader("hdfs://namenode:8020/ckpt/step100"))

URLs are store URLs (``file://``, ``hdfs://``, ``webhdfs://``, or a plain path). Stores are
opened with the configured ``hdfs.*`` options and the staged copies are looked for where
the configuration puts the node's cache (``BOOTSEER_*`` and the config files; loaded once
per process). The first bytes a reader hands out mark the start's
``checkpoint_first_byte`` (:class:`bootseer.ready.CheckpointMilestones`). torch is needed
only by ``load``, ``load_safetensors`` and ``StorageReader`` (``pip install
bootseer[torch]``).
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, BinaryIO

from bootseer.config import load_config
from bootseer.ready import CheckpointMilestones
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.files import CheckpointSource, striped_file

if TYPE_CHECKING:
    from bootseer.stripedfs.dcp import StripedStorageReader

__all__ = ["StorageReader", "StripeConfig", "load", "load_safetensors", "open"]


@functools.cache
def source() -> CheckpointSource:
    """This process's checkpoint source: its configuration, the start's timeline."""
    return CheckpointSource(load_config().config, observer=CheckpointMilestones())


def open(url: str, *, config: StripeConfig | None = None) -> BinaryIO:  # noqa: A001
    """A read-only, seekable binary file over the checkpoint at ``url`` (or its staged copy)."""
    return striped_file(source().open_url(url, config=config))


def load(url: str, map_location: Any = None, *, config: StripeConfig | None = None,
         **torch_load_kwargs: Any) -> Any:
    """``torch.load`` of the checkpoint at ``url``, read through the striped reader."""
    import torch

    with open(url, config=config) as f:
        return torch.load(f, map_location=map_location, **torch_load_kwargs)


#: Shards of a sharded safetensors checkpoint loaded at once (each reads all its stripes
#: in parallel already; two keep the links busy across a shard's end).
SHARDS_AT_ONCE = 2


def load_safetensors(url: str, device: str = "cpu", *,
                     config: StripeConfig | None = None) -> dict[str, Any]:
    """Every tensor of a safetensors file: header first, then all tensor bytes in parallel.

    ``url`` may also be a sharded checkpoint's index (``*.safetensors.index.json``, as a
    model hub publishes it): its shards are loaded :data:`SHARDS_AT_ONCE` at a time, so
    the last stripes of one overlap the first of the next instead of leaving links idle.
    """
    from bootseer.stripedfs import safetensors

    def load_file(url: str) -> dict[str, Any]:
        with source().open_url(url, config=config) as reader:
            return safetensors.load(reader, device=device)

    if not url.endswith(".index.json"):
        return load_file(url)
    with open(url, config=config) as f:
        shards = safetensors.shard_names(f.read(safetensors.MAX_INDEX_BYTES + 1), url)
    base = url.rpartition("/")[0]
    with ThreadPoolExecutor(SHARDS_AT_ONCE, thread_name_prefix="safetensors") as pool:
        loaded = list(pool.map(lambda name: load_file(f"{base}/{name}"), shards))
    tensors: dict[str, Any] = {}
    for name, part in zip(shards, loaded):
        for key in part.keys() & tensors.keys():
            raise safetensors.SafetensorsFormatError(f"{url}: tensor {key} is in {name} and "
                                                     "in another shard")
        tensors.update(part)
    return tensors


def StorageReader(url: str, **kwargs: Any) -> StripedStorageReader:  # noqa: N802
    """A ``torch.distributed.checkpoint`` storage reader for the checkpoint dir at ``url``."""
    from bootseer.stripedfs.dcp import StripedStorageReader

    return StripedStorageReader(url, source=source(), **kwargs)

"""The checkpoint-load API for training scripts: fast reads of remote checkpoints.

Everything reads through the striped reader (``stripedfs``): parallel ranged reads over
the DataNodes holding the file, with read-ahead, straight into memory — no FUSE, never an
mmap of a remote file. A file ``bootseer warm --checkpoint`` staged on this node is read
from that local copy instead, as long as the store's object is still the one copied (its
size and mtime; :mod:`bootseer.stripedfs.checkpoint_cache`)::

    import bootseer.checkpoint as ckpt
    state = ckpt.load("hdfs://namenode:8020/ckpt/step100/model.pt", map_location="cpu")
    tensors = ckpt.load_safetensors("hdfs://namenode:8020/ckpt/step100/model.safetensors")
    tensors = ckpt.load_safetensors("hdfs://namenode:8020/llm/model.safetensors.index.json",
                                    device="cuda", tensors=lambda name: ".layers.3." in name)
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

import contextlib
import functools
from collections.abc import Callable, Collection
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


#: Shard headers read at once (two small reads each; a remote store's round trips overlap).
HEADERS_AT_ONCE = 8

#: Which tensors to load: their names, or a predicate on a name; None for all.
Selection = Collection[str] | Callable[[str], bool] | None


def load_safetensors(url: str, device: str | Any = "cpu", *, tensors: Selection = None,
                     config: StripeConfig | None = None) -> dict[str, Any]:
    """The tensors of a safetensors checkpoint, loaded straight onto ``device``.

    ``url`` is a safetensors file or a sharded checkpoint's index
    (``*.safetensors.index.json``, as a model hub publishes it), whose shards are read
    together. Every header is read and checked first; then every tensor's memory is
    allocated on ``device`` and the tensors' bytes stream into it, many reads at once
    (onto a GPU through a bounded pool of pinned buffers, ``max_memory`` of the stripe
    config; :mod:`bootseer.stripedfs.tensorload`).

    ``tensors`` loads a subset, by names or by a predicate on a name, so that each rank
    of a tensor-parallel job reads only its own bytes: the others are never fetched, and
    shards holding none of them are not opened. A name asked for that the checkpoint does
    not hold is an error.
    """
    from bootseer.stripedfs import safetensors, tensorload

    config = config or source().stripes
    select = _selector(tensors)
    if url.endswith(".index.json"):
        with open(url, config=config) as f:
            weight_map = safetensors.weight_map(f.read(safetensors.MAX_INDEX_BYTES + 1), url)
        base = url.rpartition("/")[0]
        urls = [f"{base}/{name}" for name in dict.fromkeys(
            shard for name, shard in weight_map.items() if select is None or select(name))]
    else:
        urls = [url]
    with contextlib.ExitStack() as readers:
        def header(url: str) -> tuple[Any, list[Any]]:
            reader = readers.enter_context(source().open_url(url, config=config))
            slots = safetensors.read_header(reader)
            return reader, [slot for slot in slots if select is None or select(slot.name)]

        with ThreadPoolExecutor(HEADERS_AT_ONCE, thread_name_prefix="safetensors") as pool:
            files = list(pool.map(header, urls))
        where: dict[str, str] = {}
        for (_, slots), shard in zip(files, urls):
            for slot in slots:
                if where.setdefault(slot.name, shard) != shard:
                    raise safetensors.SafetensorsFormatError(
                        f"{url}: tensor {slot.name} is in {shard} and in {where[slot.name]}")
        if tensors is not None and not callable(tensors):
            missing = sorted(set(tensors) - where.keys())
            if missing:
                raise KeyError(f"{url} holds no tensor named {', '.join(missing[:5])}"
                               + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""))
        return tensorload.load(files, device, config)


def _selector(tensors: Selection) -> Callable[[str], bool] | None:
    if tensors is None or callable(tensors):
        return tensors
    if isinstance(tensors, str):
        raise TypeError("tensors: a collection of names or a predicate, not one string")
    return frozenset(tensors).__contains__


def StorageReader(url: str, **kwargs: Any) -> StripedStorageReader:  # noqa: N802
    """A ``torch.distributed.checkpoint`` storage reader for the checkpoint dir at ``url``."""
    from bootseer.stripedfs.dcp import StripedStorageReader

    return StripedStorageReader(url, source=source(), **kwargs)

"""safetensors without mmap: the header, checked, then the tensors through the loader.

safetensors' own loader mmaps the file, which over a network file system turns every
page fault into a small synchronous remote read (the known 30-50x trap), and onto a GPU
serialises those faults before each copy. The format is simple: an 8-byte little-endian
header length, a JSON header giving each tensor's dtype, shape and byte range in the
data section, then the data. The header becomes :class:`TensorSlot` s, and the tensor
loader (:mod:`bootseer.stripedfs.tensorload`) reads the bytes straight into the tensors,
or through pinned buffers onto a GPU.
"""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING, Any

from bootseer import boundedjson
from bootseer.errors import BootseerError
from bootseer.stripedfs.tensorload import TensorSlot

if TYPE_CHECKING:
    from bootseer.stripedfs.files import Reader

_MAX_HEADER = 100 << 20
#: A sharded checkpoint's index names each tensor's shard: megabytes for the largest models.
MAX_INDEX_BYTES = 64 << 20


class SafetensorsFormatError(BootseerError):
    """The file is not a valid safetensors file."""


def _dtypes() -> dict[str, Any]:
    import torch

    table = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
             "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
             "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
    for name, attr in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")):
        if hasattr(torch, attr):
            table[name] = getattr(torch, attr)
    return table


def weight_map(index: bytes, where: str) -> dict[str, str]:
    """A ``model.safetensors.index.json``'s map of tensor name to shard, whose shards are
    plain file names beside the index (a name with a path in it could read anything the
    caller can)."""
    try:
        weights = boundedjson.loads(index, limit=MAX_INDEX_BYTES,
                                    what=f"{where}: index")["weight_map"]
        if not isinstance(weights, dict):
            raise TypeError("weight_map is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        raise SafetensorsFormatError(f"{where}: not a safetensors index: {exc}") from exc
    for name in set(weights.values()):
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise SafetensorsFormatError(f"{where}: shard {name!r} is not a file name "
                                         "beside the index")
    return weights


def read_header(reader: Reader) -> list[TensorSlot]:
    """Every tensor the safetensors file behind ``reader`` holds, checked before anything
    is allocated: a known dtype, a shape whose size is the tensor's byte count, a byte
    range inside the file that overlaps no other tensor's. A truncated file, or a header
    that lies about any of these, is refused here (so a header cannot make the loader
    allocate more than the file holds, nor alias two tensors)."""
    if reader.size < 8:
        raise SafetensorsFormatError(f"{reader.name}: too short to be safetensors")
    (header_len,) = struct.unpack("<Q", reader.fetch(0, 8))
    if header_len > min(_MAX_HEADER, reader.size - 8):
        raise SafetensorsFormatError(f"{reader.name}: header length {header_len} is invalid")
    try:
        header = boundedjson.loads(reader.fetch(8, header_len), limit=_MAX_HEADER,
                                   what=f"{reader.name}: header")
        if not isinstance(header, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise SafetensorsFormatError(f"{reader.name}: header is not JSON: {exc}") from exc
    header.pop("__metadata__", None)
    data_start = 8 + header_len
    data_len = reader.size - data_start
    dtypes = _dtypes()
    slots = []
    for name, spec in header.items():
        try:
            slots.append(_slot(name, spec, dtypes, data_start, data_len))
        except (KeyError, TypeError, ValueError) as exc:
            raise SafetensorsFormatError(f"{reader.name}: tensor {name!r}: {exc}") from exc
    ordered = sorted(slots, key=lambda slot: (slot.start, slot.end))
    for before, after in zip(ordered, ordered[1:]):
        if after.start < before.end:
            raise SafetensorsFormatError(f"{reader.name}: tensors {before.name!r} and "
                                         f"{after.name!r} overlap")
    return slots


def _slot(name: str, spec: Any, dtypes: dict[str, Any], data_start: int,
          data_len: int) -> TensorSlot:
    if not isinstance(spec, dict):
        raise TypeError("not an object")
    dtype = dtypes.get(spec["dtype"]) if isinstance(spec["dtype"], str) else None
    if dtype is None:
        raise ValueError(f"dtype {spec['dtype']!r} unknown")
    shape, offsets = spec["shape"], spec["data_offsets"]
    if not (isinstance(shape, list) and all(_count(n) for n in shape)):
        raise ValueError(f"shape {shape!r} is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_count, offsets))):
        raise ValueError(f"data_offsets {offsets!r} are not two offsets")
    begin, end = offsets
    if not begin <= end <= data_len:
        raise ValueError(f"bytes {begin}-{end} are outside the data ({data_len} bytes)")
    if math.prod(shape) * dtype.itemsize != end - begin:
        raise ValueError(f"shape {shape} of {spec['dtype']} is not its {end - begin} bytes")
    return TensorSlot(name, dtype, tuple(shape), data_start + begin, data_start + end)


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0

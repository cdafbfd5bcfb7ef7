"""safetensors without mmap: read the header, then every tensor's bytes in parallel.

safetensors' own loader mmaps the file, which over a network file system turns every
page fault into a small synchronous remote read (the known 30-50x trap). The format is
simple: an 8-byte little-endian header length, a JSON header giving each tensor's dtype,
shape and byte range in the data section, then the data. We fetch the data section with
all stripes in parallel into one buffer and build tensors as views of it.
"""

from __future__ import annotations

import struct
from typing import Any

from bootseer import boundedjson
from bootseer.errors import BootseerError
from bootseer.stripedfs.reader import StripedReader

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


def shard_names(index: bytes, where: str) -> list[str]:
    """The shards a ``model.safetensors.index.json`` names, in order of first mention:
    plain file names beside the index (a name with a path in it could read anything the
    caller can)."""
    try:
        weight_map = boundedjson.loads(index, limit=MAX_INDEX_BYTES,
                                       what=f"{where}: index")["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        raise SafetensorsFormatError(f"{where}: not a safetensors index: {exc}") from exc
    names = list(dict.fromkeys(weight_map.values()))
    for name in names:
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise SafetensorsFormatError(f"{where}: shard {name!r} is not a file name "
                                         "beside the index")
    return names


def load(reader: StripedReader, device: str = "cpu") -> dict[str, Any]:
    """All tensors of the safetensors file behind ``reader``, on ``device``."""
    import torch

    if reader.size < 8:
        raise SafetensorsFormatError(f"{reader.name}: too short to be safetensors")
    (header_len,) = struct.unpack("<Q", reader.fetch(0, 8))
    if header_len > min(_MAX_HEADER, reader.size - 8):
        raise SafetensorsFormatError(f"{reader.name}: header length {header_len} is invalid")
    try:
        header = boundedjson.loads(reader.fetch(8, header_len), limit=_MAX_HEADER,
                                   what=f"{reader.name}: header")
    except ValueError as exc:
        raise SafetensorsFormatError(f"{reader.name}: header is not JSON: {exc}") from exc
    header.pop("__metadata__", None)
    data_start = 8 + header_len
    data = reader.fetch(data_start, reader.size - data_start)
    dtypes = _dtypes()
    tensors = {}
    for name, spec in header.items():
        begin, end = spec["data_offsets"]
        dtype = dtypes.get(spec["dtype"])
        if dtype is None:
            raise SafetensorsFormatError(f"{reader.name}: {name}: dtype {spec['dtype']} unknown")
        if not 0 <= begin <= end <= len(data):
            raise SafetensorsFormatError(f"{reader.name}: {name}: byte range outside the file")
        if begin == end:
            tensor = torch.empty(spec["shape"], dtype=dtype)
        else:
            tensor = torch.frombuffer(data, dtype=dtype, count=(end - begin) // dtype.itemsize,
                                      offset=begin).reshape(spec["shape"])
        tensors[name] = tensor.to(device) if device != "cpu" else tensor
    return tensors

"""Decompression of store data: the frame declares its size, and it is checked first."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import zstandard

from bootseer.errors import IntegrityError, SizeLimitError
from bootseer.limits import decompress
from bootseer.nodecache import NodeCache


def frame_declaring(size: int) -> bytes:
    """A zstd frame header declaring ``size`` bytes of content, holding none."""
    return (struct.pack("<I", 0xFD2FB528) + bytes([0xE0]) + struct.pack("<Q", size)
            + bytes([0x01, 0x00, 0x00]))


def test_a_frame_within_its_limit_decompresses() -> None:
    assert decompress(zstandard.ZstdCompressor().compress(b"abc" * 100), 300, "x") == \
        b"abc" * 100


def test_a_frame_declaring_more_than_the_limit_is_refused_from_its_header() -> None:
    with pytest.raises(SizeLimitError, match="is 2147483648 bytes, over the 1024"):
        decompress(frame_declaring(2 << 30), 1024, "a manifest")


def test_a_frame_that_does_not_declare_its_size_is_refused() -> None:
    undeclared = zstandard.ZstdCompressor(write_content_size=False).compress(b"{}")
    with pytest.raises(IntegrityError, match="does not declare its size"):
        decompress(undeclared, 1 << 20, "a manifest")


def test_a_frame_holding_other_than_it_declares_is_refused() -> None:
    with pytest.raises(IntegrityError):
        decompress(frame_declaring(10), 1 << 20, "a manifest")  # declares 10, holds 0
    with pytest.raises(IntegrityError, match="not a zstd frame"):
        decompress(b"garbage", 1 << 20, "a manifest")


def test_streamed_cache_entries_are_verified_at_their_end(tmp_path: Path) -> None:
    import hashlib

    cache = NodeCache(tmp_path, 1 << 30)
    data = b"shard" * 100_000
    digest = hashlib.sha256(data).hexdigest()
    with pytest.raises(IntegrityError):
        cache.put_stream(digest, [data[:10], b"not it"])
    assert digest not in cache and not list((tmp_path / "tmp").iterdir())
    cache.put_stream(digest, [data[:1000], data[1000:]])
    with cache.open(digest) as stream:
        assert stream.read() == data
    path = tmp_path / "entries" / digest[:2] / digest
    path.write_bytes(data[:-1] + b"!")  # damaged on disk after it was cached
    with pytest.raises(IntegrityError, match="damaged"), cache.open(digest) as stream:
        stream.read()
    assert cache.open(digest) is None  # dropped

"""The image manifest's format 2 (binary columns, decoded lazily): it describes an image
exactly as format 1 did, format 1 is still read, and a hostile blob is refused with a
clear error before anything is built from it."""

from __future__ import annotations

import json

import pytest
import zstandard
from support.layers import multi_layer_image
from support.oci import OCI_LAYER_GZIP, write_image, write_layout

from bootseer.prefetch.blockformat import (
    FORMAT,
    BlockLocation,
    FileEntry,
    ImageManifestError,
    Manifest,
    encode_v1,
)
from bootseer.prefetch.convert import convert
from bootseer.prefetch.image_source import open_image
from bootseer.prefetch.rootfs import Kind
from bootseer.store import BlobStore, open_store

MAGIC = b"bootseer-image/2\n"


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    """The multi-layer test image (hard links, symlinks, xattrs, devices), converted."""
    root = tmp_path_factory.mktemp("image")
    layout = write_layout(root, [write_image(root, multi_layer_image(), [OCI_LAYER_GZIP] * 3)])
    blobs = BlobStore(open_store(str(root / "store")))
    result = convert(open_image(layout), blobs, name="multi", block_size=1 << 16)
    return Manifest.decode(blobs.get(result.image_id))


def described(m: Manifest) -> tuple:
    return (m.block_size, m.config, m.source, m.packs, list(m.entries), list(m.blocks),
            dict(m.children), m.node_indexes(), m.has_xattrs, m.content_bytes, m.block_index)


def test_format_2_round_trips_and_describes_what_format_1_did(manifest: Manifest) -> None:
    assert zstandard.ZstdDecompressor().decompress(manifest.encode()).startswith(MAGIC)
    kinds = {e.kind for e in manifest.entries}
    assert {Kind.FILE, Kind.DIR, Kind.SYMLINK, Kind.HARDLINK} <= kinds
    assert manifest.has_xattrs and any(e.blocks for e in manifest.entries)
    again = Manifest.decode(manifest.encode())
    old = Manifest.decode(encode_v1(manifest))
    assert described(again) == described(manifest) == described(old)
    path = next(e.path for e in manifest.entries if e.blocks)
    assert again.by_path[path] == old.by_path[path] and path in again.by_path
    assert again.by_path.get("/no/such") is None and len(again.by_path) == len(old.entries)
    assert again.entries[-1] == old.entries[-1] and again.blocks[-1] == old.blocks[-1]


def test_an_empty_image_round_trips() -> None:
    root = FileEntry("/", Kind.DIR, 0o755, 0, 0, 0, 0.0, None, {}, 0, 0, 1, 2)
    m = Manifest(1 << 20, {}, {}, [root], [], [])
    assert described(Manifest.decode(m.encode())) == described(m)


def tables(manifest: Manifest) -> tuple[dict, dict[str, bytes]]:
    """The blob's header and columns, to be tampered with."""
    raw = zstandard.ZstdDecompressor().decompress(manifest.encode())[len(MAGIC):]
    size = int.from_bytes(raw[:4], "little")
    header = json.loads(raw[4 : 4 + size])
    columns, at = {}, 4 + size
    for name, length in header["columns"]:
        columns[name] = raw[at : at + length]
        at += length
    return header, columns


def blob(header: dict, columns: dict[str, bytes]) -> bytes:
    header = {**header, "columns": [[n, len(c)] for n, c in columns.items()]}
    head = json.dumps(header).encode()
    return zstandard.ZstdCompressor().compress(
        MAGIC + len(head).to_bytes(4, "little") + head + b"".join(columns.values()))


def u32(values: list[int]) -> bytes:
    return b"".join(v.to_bytes(4, "little") for v in values)


@pytest.mark.parametrize("tamper, message", [
    (lambda h, c: c.update(refs=u32([10**6] * (len(c["refs"]) // 4))), "a block the manifest"),
    (lambda h, c: c.update(pack=u32([99] * (len(c["pack"]) // 4))), "impossible pack or size"),
    (lambda h, c: c.update(size_b=(1 << 40).to_bytes(8, "little") * (len(c["size_b"]) // 8)),
     "impossible pack or size"),
    (lambda h, c: c.update(kind=b"\x63" * len(c["kind"])), "kind, link target or xattr"),
    (lambda h, c: c.update(mode=c["mode"][:-4]), "column 'mode' has"),
    (lambda h, c: c.update(extra=b"x"), "do not add up"),
    (lambda h, c: c.update(paths=c["paths"] + b"\0/more"), "paths for"),
    (lambda h, c: h.update(block_size=1 << 40), "block size"),
    (lambda h, c: h.update(entries=-1), "counts"),
    (lambda h, c: h.update(format="bootseer-image/9"), "not supported"),
])
def test_a_tampered_manifest_is_refused_before_anything_is_built(
        manifest: Manifest, tamper, message: str) -> None:
    header, columns = tables(manifest)
    tamper(header, columns)
    with pytest.raises(ImageManifestError, match=message):
        Manifest.decode(blob(header, columns))


def test_first_refs_out_of_order_are_refused(manifest: Manifest) -> None:
    header, columns = tables(manifest)
    firsts = columns["first_ref"]
    columns["first_ref"] = firsts[8:] + firsts[:8]  # the first entry's refs start last
    with pytest.raises(ImageManifestError, match="out of order"):
        Manifest.decode(blob(header, columns))


def test_an_unknown_format_says_which_ones_are_read() -> None:
    data = zstandard.ZstdCompressor().compress(json.dumps({"format": "x"}).encode())
    with pytest.raises(ImageManifestError, match=f"reads {FORMAT}"):
        Manifest.decode(data)
    with pytest.raises(ImageManifestError, match="not valid"):
        Manifest.decode(zstandard.ZstdCompressor().compress(b"\x00garbage"))


def test_entries_and_blocks_are_built_on_first_use(manifest: Manifest) -> None:
    m = Manifest.decode(manifest.encode())
    built = m.entries._built  # type: ignore[attr-defined]
    assert built.count(None) == len(built)  # decoding built none
    first = m.entries[3]
    assert m.entries[3] is first and built.count(None) == len(built) - 1
    assert isinstance(m.blocks[0], BlockLocation) and m.blocks[-1] == m.blocks[len(m.blocks) - 1]


def test_the_block_index_is_built_without_building_a_block(manifest: Manifest) -> None:
    m = Manifest.decode(manifest.encode())
    index = m.block_index
    built = m.blocks._built  # type: ignore[attr-defined]
    assert built.count(None) == len(built)
    assert index == {b.digest: i for i, b in reversed(list(enumerate(manifest.blocks)))}
    assert len(index) == len({b.digest for b in manifest.blocks}) > 0

"""Convert an OCI image into the lazy block format (see :mod:`bootseer.prefetch.blockformat`).

One streaming pass over the layers: :func:`bootseer.prefetch.rootfs.merge_layers` applies the OCI
rules and hands every regular file's bytes to us as they go by; we cut them into blocks,
skip blocks the store already has (from this image or any converted before), compress the
rest with zstd and append them to packs. Content of files that a later layer overrides is
packed too (a streaming pass cannot know the future); it costs store space, never reads.
A conversion that dies leaves at most unpublished pack temporaries: packs are published
before the manifest that points at them, and the manifest is published last. Each pack's
torrent (for reads served by peers: :mod:`bootseer.p2p`) is hashed as the pack is
written and published right after it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import zstandard

from bootseer.p2p.publish import leaf_hasher, publish_layer, publish_torrent
from bootseer.prefetch.blockformat import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_PACK_TARGET,
    IMAGE_REF_PREFIX,
    MAX_MANIFEST_BYTES,
    PACK_PREFIX,
    BlockLocation,
    FileEntry,
    Manifest,
)
from bootseer.prefetch.image_source import ImageSource
from bootseer.prefetch.rootfs import Kind, merge_layers
from bootseer.store import BlobStore, ObjectWriter, Store

if TYPE_CHECKING:
    from bootseer.p2p.torrents import LeafHasher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConvertResult:
    image_id: str  # digest of the manifest blob
    name: str | None
    files: int
    content_bytes: int  # bytes of file content in the merged rootfs
    blocks: int  # distinct blocks the image uses
    new_blocks: int  # blocks this conversion stored (the rest were in the store already)
    stored_bytes: int  # compressed bytes this conversion added to packs
    layer_bytes: int  # compressed size of the source layers
    blocks_seen: int  # blocks read from the layers, duplicates included

    @property
    def dedup_ratio(self) -> float:
        """Blocks read from the layers per distinct block the image uses."""
        return self.blocks_seen / max(1, self.blocks)


@dataclass
class _Known:
    pack_key: str
    offset: int
    length: int
    size: int


class _PackWriter:
    """Appends compressed blocks to pack objects, publishing each when it is full."""

    def __init__(self, store: Store, target: int, known: dict[str, _Known]) -> None:
        self.store, self.target = store, target
        self.known = known  # every block in the store; a pack's blocks join it when published
        self._writer: ObjectWriter | None = None
        self._hash = hashlib.sha256()
        self._leaves: LeafHasher | None = None  # the pack's torrent, for peer reads
        self._offset = 0
        self._pending: list[tuple[str, _Known]] = []  # blocks of the open pack
        self.staged: set[str] = set()  # every block appended by this conversion
        self.stored_bytes = 0

    def append(self, digest: str, compressed: bytes, size: int) -> None:
        if self._writer is None:
            self._writer = self.store.open_writer()
            self._hash, self._offset = hashlib.sha256(), 0
            self._leaves = leaf_hasher()
        self._writer.write(compressed)
        self._hash.update(compressed)
        if self._leaves is not None:
            self._leaves.update(compressed)
        self._pending.append((digest, _Known("", self._offset, len(compressed), size)))
        self.staged.add(digest)
        self._offset += len(compressed)
        self.stored_bytes += len(compressed)
        if self._offset >= self.target:
            self.flush()

    def flush(self) -> None:
        if self._writer is None:
            return
        key = PACK_PREFIX + self._hash.hexdigest()
        try:
            self._writer.commit(key, overwrite=False)
        except FileExistsError:  # the same blocks in the same order: the same pack
            pass
        if self._leaves is not None:  # after the pack: a torrent never names a missing one
            publish_layer(self.store, "sha256:" + self._hash.hexdigest(), self._leaves)
        for digest, location in self._pending:
            location.pack_key = key
            self.known[digest] = location
        self._writer, self._pending = None, []

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()


def known_blocks(blobs: BlobStore) -> dict[str, _Known]:
    """Blocks already in the store, from the manifests of the images converted before."""
    known: dict[str, _Known] = {}
    for name in blobs.list_refs(IMAGE_REF_PREFIX):
        try:
            manifest = Manifest.decode(blobs.get(blobs.get_ref(name).digest,
                                                  MAX_MANIFEST_BYTES))
        except Exception as exc:  # a broken image must not stop a new conversion
            log.warning("skipping image %s while looking for known blocks: %s", name, exc)
            continue
        for block in manifest.blocks:
            known.setdefault(block.digest, _Known(manifest.packs[block.pack], block.offset,
                                                  block.length, block.size))
    return known


def convert(
    source: ImageSource,
    blobs: BlobStore,
    *,
    name: str | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    pack_target: int = DEFAULT_PACK_TARGET,
    on_progress: Callable[[int], None] | None = None,
    origin: str | None = None,
) -> ConvertResult:
    """Convert ``source`` into the store behind ``blobs``; returns the image id and a summary.

    ``origin`` is what the user named as the source (a registry reference, say) when
    ``source`` is a temporary copy of it.
    """
    known = known_blocks(blobs)
    packs = _PackWriter(blobs.store, pack_target, known)
    compressor = zstandard.ZstdCompressor(level=3)
    blocks_seen = 0

    def store_content(path: str, fileobj: BinaryIO, size: int) -> tuple[str, ...]:
        nonlocal blocks_seen
        digests = []
        while chunk := fileobj.read(block_size):
            digest = hashlib.sha256(chunk).hexdigest()
            blocks_seen += 1
            if digest not in known and digest not in packs.staged:
                packs.append(digest, compressor.compress(chunk), len(chunk))
            digests.append(digest)
            if on_progress:
                on_progress(len(chunk))
        return tuple(digests)

    streams = _layer_streams(source)
    try:
        index = merge_layers(streams, store_content)
        packs.flush()
    except BaseException:
        packs.abort()
        raise
    finally:
        streams.close()

    pack_keys: list[str] = []
    pack_index: dict[str, int] = {}
    block_table: list[BlockLocation] = []
    block_index: dict[str, int] = {}
    entries: list[FileEntry] = []
    for entry in index:
        refs: list[int] = []
        for digest in entry.content or ():
            if digest not in block_index:
                location = known[digest]
                if location.pack_key not in pack_index:
                    pack_index[location.pack_key] = len(pack_keys)
                    pack_keys.append(location.pack_key)
                block_index[digest] = len(block_table)
                block_table.append(BlockLocation(digest, pack_index[location.pack_key],
                                                 location.offset, location.length,
                                                 location.size))
            refs.append(block_index[digest])
        entries.append(FileEntry(entry.path, entry.kind, entry.mode, entry.uid, entry.gid,
                                 entry.size, entry.mtime, entry.link_target, dict(entry.xattrs),
                                 entry.devmajor, entry.devminor, entry.ino, entry.nlink,
                                 tuple(refs)))
    manifest = Manifest(block_size, source.config,
                        {"location": origin or source.location,
                         "manifest_digest": source.manifest_digest,
                         "config_digest": source.config_digest},
                        entries, block_table, pack_keys)
    data = manifest.encode()
    info = blobs.put(data)
    publish_torrent(blobs.store, info.digest, data)  # a job's nodes share it too
    if name:
        blobs.set_ref(IMAGE_REF_PREFIX + name, info.digest, {"source": origin or source.location})
    return ConvertResult(
        image_id=info.digest, name=name,
        files=sum(1 for e in entries if e.kind == Kind.FILE),
        content_bytes=manifest.content_bytes, blocks=len(block_table),
        new_blocks=len(packs.staged), stored_bytes=packs.stored_bytes,
        layer_bytes=sum(layer.size for layer in source.layers), blocks_seen=blocks_seen,
    )


def _layer_streams(source: ImageSource) -> Iterator[tuple[str, BinaryIO]]:
    """Each layer's decompressed stream in turn; leaving it verifies the layer's digest."""
    for layer in source.layers:
        with layer.open() as stream:
            yield layer.digest, stream

"""The block source on its own, over a real LocalStore holding a converted image: runs of
neighbours, one ranged read each, every block verified, one refetch from its home pack."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.images import BIG, MIB, big_image

from bootseer.prefetch.blockformat import Manifest
from bootseer.prefetch.blocksource import (
    BlockIntegrityError,
    BlockSource,
    FetchCounts,
    Piece,
    Run,
    adjacent_runs,
    runs,
)
from bootseer.prefetch.convert import convert
from bootseer.prefetch.image_source import open_image
from bootseer.store import BlobStore
from bootseer.store.local import LocalStore


class CountingStore(LocalStore):
    """A LocalStore that notes its ranged reads."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reads: list[tuple[str, int, int]] = []

    def _read_range(self, key: str, offset: int, length: int) -> bytes:
        self.reads.append((key, offset, length))
        return super()._read_range(key, offset, length)


@pytest.fixture
def image(tmp_path: Path) -> tuple[CountingStore, Manifest, list[int]]:
    """The store, the manifest and the block indexes of /data/big.bin (six 1 MiB blocks)."""
    store = CountingStore(str(tmp_path / "store"))
    result = convert(open_image(big_image(tmp_path / "image")), BlobStore(store), name="big",
                     block_size=MIB)
    manifest = Manifest.decode(BlobStore(store).get(result.image_id))
    store.reads.clear()
    return store, manifest, list(manifest.by_path["/data/big.bin"].blocks)


def corrupt(store: LocalStore, manifest: Manifest, index: int) -> None:
    location = manifest.blocks[index]
    path = store.root / manifest.packs[location.pack]
    data = bytearray(path.read_bytes())
    data[location.offset + 100] ^= 0xFF
    path.write_bytes(bytes(data))


def test_adjacent_runs_cut_where_a_piece_does_not_follow() -> None:
    pieces = [Piece(0, 0, 10), Piece(1, 10, 5), Piece(7, 20, 5), Piece(2, 25, 1)]
    assert adjacent_runs(pieces) == [pieces[:2], pieces[2:]]
    assert adjacent_runs([]) == []


def test_neighbours_are_one_run_and_a_gap_cuts_it(image) -> None:
    _, manifest, blocks = image
    (run,) = runs(manifest, reversed(blocks + blocks))  # any order, duplicates: one run
    assert [p.index for p in run.pieces] == blocks
    assert run.pack == manifest.packs[manifest.blocks[blocks[0]].pack]
    assert (run.start, run.end) == (run.pieces[0].offset,
                                    sum(p.length for p in run.pieces) + run.pieces[0].offset)
    cut = runs(manifest, [blocks[0], blocks[1], blocks[4]])
    assert [[p.index for p in r.pieces] for r in cut] == [blocks[:2], [blocks[4]]]


def test_a_run_is_one_ranged_read_and_every_block_is_verified(image) -> None:
    store, manifest, blocks = image
    source = BlockSource(store, manifest, "sha256:x")
    stats = FetchCounts()
    (run,) = runs(manifest, blocks)
    got = dict(source.fetch(run, stats))
    assert b"".join(got[i] for i in blocks) == BIG
    length = sum(p.length for p in run.pieces)
    assert store.reads == [(run.pack, run.pieces[0].offset, length)]
    assert stats == FetchCounts(blocks_fetched=6, bytes_fetched=length, fetch_requests=1)


def test_a_corrupt_block_is_fetched_once_more_then_fails_alone(image, caplog) -> None:
    store, manifest, blocks = image
    corrupt(store, manifest, blocks[2])
    source = BlockSource(store, manifest, "sha256:x")
    stats = FetchCounts()
    (run,) = runs(manifest, blocks)
    got = dict(source.fetch(run, stats))
    assert isinstance(got[blocks[2]], BlockIntegrityError)
    assert manifest.blocks[blocks[2]].digest in str(got[blocks[2]])
    assert [got[i] for i in blocks[3:]] == [BIG[n * MIB : (n + 1) * MIB] for n in (3, 4, 5)]
    assert (stats.fetch_requests, stats.refetches, stats.failed_blocks,
            stats.blocks_fetched) == (2, 1, 1, 5)
    assert "fetching it from packs/" in caplog.text


def test_a_foreign_pack_that_fails_falls_back_to_the_home_packs(image, tmp_path) -> None:
    """A hot pack that is missing, or holds wrong bytes, costs refetches, not data."""
    store, manifest, blocks = image
    source = BlockSource(store, manifest, "sha256:x")
    (home,) = runs(manifest, blocks[:2])
    missing = Run("packs/" + "0" * 64, home.pieces)
    stats = FetchCounts()
    assert [d for _, d in source.fetch(missing, stats)] == [BIG[:MIB], BIG[MIB : 2 * MIB]]
    assert (stats.refetches, stats.failed_blocks, stats.fetch_requests) == (2, 0, 2)
    # The right offsets in a pack with other bytes (the image's other file, say).
    (store.root / "packs" / ("1" * 64)).write_bytes(b"\0" * (2 * MIB + 100))
    wrong = Run("packs/" + "1" * 64, home.pieces)
    assert [d for _, d in source.fetch(wrong, FetchCounts())] == [BIG[:MIB], BIG[MIB : 2 * MIB]]


def test_an_unreadable_home_pack_fails_every_block_of_the_run(image) -> None:
    store, manifest, blocks = image
    source = BlockSource(store, manifest, "sha256:x")
    (run,) = runs(manifest, blocks)
    (store.root / run.pack).unlink()
    stats = FetchCounts()
    got = list(source.fetch(run, stats))
    assert [i for i, _ in got] == blocks
    assert all(isinstance(e, FileNotFoundError) for _, e in got)
    assert (stats.failed_blocks, stats.refetches, stats.fetch_requests) == (6, 0, 0)


def test_a_run_is_asked_of_peers_first_and_their_bytes_are_verified_too(image) -> None:
    store, manifest, blocks = image
    (run,) = runs(manifest, blocks)
    pack_bytes = store.get(run.pack)
    store.reads.clear()
    asked: list[tuple[str, int, int]] = []

    def peers(pack: str, offset: int, length: int) -> bytes | None:
        asked.append((pack, offset, length))
        return pack_bytes[offset:offset + length]

    source = BlockSource(store, manifest, "sha256:x")
    source.peer_read = peers
    stats = FetchCounts()
    got = dict(source.fetch(run, stats))
    assert b"".join(got[i] for i in blocks) == BIG and asked == [(run.pack, run.start, run.size)]
    assert (stats.peer_reads, stats.peer_bytes, stats.fetch_requests) == (1, run.size, 0)
    assert store.reads == []

    # Peers that cannot (None), fail or send bad bytes cost a store read, never a block.
    def flipped(pack: str, offset: int, length: int) -> bytes:
        return bytes(b ^ 0xFF for b in pack_bytes[offset:offset + length])

    def failing(pack: str, offset: int, length: int) -> bytes:
        raise OSError("the agent went away")

    for bad in (lambda *_: None, failing, lambda p, o, n: pack_bytes[o:o + n - 1]):
        source.peer_read = bad
        store.reads.clear()
        got = dict(source.fetch(run, FetchCounts()))
        assert b"".join(got[i] for i in blocks) == BIG
        assert store.reads == [(run.pack, run.start, run.size)]
    source.peer_read = flipped
    store.reads.clear()
    stats = FetchCounts()
    got = dict(source.fetch(run, stats))
    assert b"".join(got[i] for i in blocks) == BIG
    assert stats.refetches == len(blocks) and len(store.reads) == len(blocks)

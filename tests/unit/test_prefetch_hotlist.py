"""Hot lists: recorded from real lazy reads, merged across recordings, stored and reloaded;
stale and corrupt lists are ignored with a warning."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.images import MIB, big_image

from bootseer.nodecache import NodeCache
from bootseer.prefetch import hotlist
from bootseer.prefetch.convert import convert
from bootseer.prefetch.hotlist import HotBlock, HotList, Recorder, merge
from bootseer.prefetch.image_source import open_image
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.store import BlobStore, open_store


@pytest.fixture
def image(tmp_path: Path) -> LazyImage:
    blobs = BlobStore(open_store(str(tmp_path / "store")))
    convert(open_image(big_image(tmp_path / "image")), blobs, name="big", block_size=MIB)
    return LazyImage(blobs, "big", NodeCache(tmp_path / "cache", 1 << 30))


def test_recording_notes_first_accesses_in_order(image: LazyImage) -> None:
    image.recorder = Recorder(image.image_id, "train")
    big, small = image.lookup("/data/big.bin"), image.lookup("/data/small.txt")
    image.read(big, 3 * MIB, 10)
    image.read(small, 0, 6)
    image.read(big, 3 * MIB + 100, 10)  # same block again: not a new entry
    image.read(big, 0, 2 * MIB)  # blocks 0 and 1
    hot = image.recorder.stop()
    table = image.manifest.blocks
    assert [b.digest for b in hot.blocks] == [table[i].digest for i in
                                              (big.blocks[3], small.blocks[0], big.blocks[0],
                                               big.blocks[1])]
    assert [b.path for b in hot.blocks][:2] == ["/data/big.bin", "/data/small.txt"]
    image.read(big, 5 * MIB, 10)  # after stop: not recorded
    assert len(image.recorder.stop().blocks) == 4


def test_merge_is_a_union_ordered_by_median_first_access() -> None:
    def rec(*blocks: tuple[str, float]) -> HotList:
        return HotList("sha256:" + "a" * 64, "w", tuple(HotBlock(d, "/f", t) for d, t in blocks),
                       1, {d: [t] for d, t in blocks})

    merged = merge([rec(("x", 0.1), ("y", 0.5)), rec(("y", 0.2), ("z", 0.3)),
                    rec(("x", 0.9), ("y", 0.25))])
    assert [b.digest for b in merged.blocks] == ["y", "z", "x"]  # medians .25, .3, .5
    assert merged.recordings == 3
    assert merge([merged]).blocks == merged.blocks
    assert HotList.decode(merged.encode()).blocks == merged.blocks
    with pytest.raises(ValueError):
        merge([rec(("x", 0.1)), HotList("sha256:" + "b" * 64, "w", ())])


def test_saved_recordings_merge_in_the_store(image: LazyImage) -> None:
    for offset in (0, 4 * MIB):
        image.recorder = Recorder(image.image_id, "train")
        image.read(image.lookup("/data/big.bin"), offset, 10)
        hotlist.save(image.blobs, image.recorder.stop())
    stored = hotlist.load(image.blobs, image.image_id, "train", image.manifest)
    assert stored is not None and stored.recordings == 2 and len(stored.blocks) == 2
    assert hotlist.load(image.blobs, image.image_id, "other") is None


def test_concurrent_saves_lose_no_recording(image: LazyImage) -> None:
    """A job's nodes end their recordings at once: each save merges into the newest
    generation, and one that finds its next generation taken merges that one and tries
    again, so the last list holds every recording (the store used to keep the last
    writer's merge only)."""
    digests = [block.digest for block in image.manifest.blocks]
    savers = hotlist.SAVE_ATTEMPTS  # each loses at most once to every other saver
    recordings = [HotList(image.image_id, "w", (HotBlock(digests[i % len(digests)], "/f",
                                                         0.1 * i),), 1, {})
                  for i in range(savers)]
    start = threading.Barrier(savers)

    def save(recording: HotList) -> HotList:
        start.wait()
        return hotlist.save(image.blobs, recording, image.manifest)

    with ThreadPoolExecutor(savers) as pool:
        saved = list(pool.map(save, recordings))
    stored = hotlist.load(image.blobs, image.image_id, "w", image.manifest)
    assert stored is not None and stored.recordings == savers
    assert {b.digest for b in stored.blocks} == {r.blocks[0].digest for r in recordings}
    assert max(hot.recordings for hot in saved) == savers
    assert stored.layout is not None and set(stored.layout.pieces) == \
        {b.digest for b in stored.blocks}
    found = hotlist.generations(image.blobs, image.image_id, "w")
    assert found == [savers - 1, savers]  # older generations pruned


def test_a_store_with_too_many_generations_is_refused_and_a_start_goes_on(
        image: LazyImage, caplog) -> None:
    """More refs under a list's prefix than saves ever leave: neither a start (no advice,
    a warning) nor a save (its caller warns) reads them all."""
    caplog.set_level(logging.WARNING)
    junk = image.blobs.put(b"{}")
    for n in range(hotlist.MAX_GENERATIONS + 1):
        image.blobs.set_ref(hotlist.ref_name(image.image_id, "w", n), junk.digest)
    assert hotlist.load(image.blobs, image.image_id, "w") is None
    assert "more than 64 refs" in caplog.text
    with pytest.raises(ValueError, match="more than 64 refs"):
        hotlist.save(image.blobs, HotList(image.image_id, "w", (), 1, {}))


def test_stale_and_corrupt_lists_are_ignored_with_a_warning(image: LazyImage, caplog) -> None:
    caplog.set_level(logging.WARNING)
    stale = HotList(image.image_id, "w",
                    (HotBlock("0" * 64, "/gone", 0.1),
                     HotBlock(image.manifest.blocks[0].digest, "/data/big.bin", 0.2)),
                    1, {})
    hotlist.save(image.blobs, stale)
    kept = hotlist.load(image.blobs, image.image_id, "w", image.manifest)
    assert kept is not None and [b.path for b in kept.blocks] == ["/data/big.bin"]
    assert "not in the image" in caplog.text
    junk = image.blobs.put(b"not json")
    image.blobs.set_ref(hotlist.ref_name(image.image_id, "w", 2), junk.digest)
    assert hotlist.load(image.blobs, image.image_id, "w") is None
    assert "ignoring the hot list" in caplog.text

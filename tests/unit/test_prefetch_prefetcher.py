"""Hot re-layout and prefetch: the hot pack, the order of requests, reads during a
prefetch (correct bytes, nothing fetched twice, reads first), fallbacks, recordings."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import uuid
from pathlib import Path

import pytest
from support.images import BIG, MIB, big_image

from bootseer.errors import IntegrityError
from bootseer.nodecache import NodeCache
from bootseer.prefetch import hotlist
from bootseer.prefetch.config import PrefetchConfig
from bootseer.prefetch.convert import convert
from bootseer.prefetch.hotlist import HotBlock, HotList
from bootseer.prefetch.hotpack import write_hot_pack
from bootseer.prefetch.image_source import open_image
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.prefetcher import Prefetcher
from bootseer.prefetch.recording import ReadyWhen, Recording
from bootseer.ready import READY_FILE_ENV, mark_ready
from bootseer.store import BlobStore
from bootseer.store.local import LocalStore


class LoggingStore(LocalStore):
    """Logs every ranged read (thread, key, offset, length, start, end); optionally slow."""

    def __init__(self, url: str, delay: float = 0.0) -> None:
        super().__init__(url)
        self.delay = delay
        self.slow: dict[tuple[str, int], float] = {}  # (key, offset) -> delay for that read
        self.log: list[tuple[str, str, int, int, float, float]] = []
        self.lock = threading.Lock()

    def _read_range(self, key: str, offset: int, length: int) -> bytes:
        start = time.monotonic()
        time.sleep(self.slow.get((key, offset), self.delay))
        data = super()._read_range(key, offset, length)
        with self.lock:
            self.log.append((threading.current_thread().name, key, offset, length, start,
                             time.monotonic()))
        return data

    def reads_of(self, key: str) -> list[tuple[int, int]]:
        return [(off, n) for _, k, off, n, _, _ in self.log if k == key]


@pytest.fixture
def setup(tmp_path: Path):
    store = LoggingStore(str(tmp_path / "store"))
    blobs = BlobStore(store)
    convert(open_image(big_image(tmp_path / "image")), blobs, name="big", block_size=MIB)

    def fresh_image(**kwargs) -> LazyImage:
        cache = NodeCache(tmp_path / f"cache-{uuid.uuid4().hex[:6]}", 1 << 30)
        return LazyImage(blobs, "big", cache, **kwargs)

    return store, blobs, fresh_image


def record(image: LazyImage, order: list[int], workload: str = "w") -> HotList:
    """Record a start that reads the blocks of /data/big.bin in ``order``; save it."""
    entry = image.lookup("/data/big.bin")
    image.recorder = hotlist.Recorder(image.image_id, workload)
    for n in order:
        image.read(entry, n * MIB, 10)
    return hotlist.save(image.blobs, image.recorder.stop(), image.manifest)


def block_digests(image: LazyImage, order: list[int]) -> list[str]:
    entry = image.lookup("/data/big.bin")
    return [image.manifest.blocks[entry.blocks[n]].digest for n in order]


def test_saving_lays_the_hot_blocks_out_in_access_order(setup) -> None:
    store, blobs, fresh_image = setup
    order = [4, 1, 5, 0]
    hot = record(fresh_image(readahead_blocks=0), order)
    assert hot.layout is not None and hot.layout.pack.startswith("packs/")
    digests = block_digests(fresh_image(), order)
    assert [b.digest for b in hot.blocks] == digests
    offsets = [hot.layout.pieces[d][0] for d in digests]
    assert offsets == sorted(offsets) and offsets[0] == 0  # contiguous, in access order
    assert store.stat(hot.layout.pack).size == hot.layout.size
    # Stored and loaded back: the same list and layout.
    loaded = hotlist.load(blobs, hot.image_id, "w")
    assert loaded.layout == hot.layout and loaded.blocks == hot.blocks
    # A second recording of the same blocks keeps the pack; a new block re-lays it out.
    again = record(fresh_image(readahead_blocks=0), [0, 4, 1, 5])
    assert again.recordings == 2 and again.layout.pack == hot.layout.pack
    grown = record(fresh_image(readahead_blocks=0), [2])
    assert len(grown.blocks) == 5 and grown.layout.pack != hot.layout.pack


def test_a_hot_pack_holds_the_packs_bytes_in_hot_order_and_no_corrupt_block(setup) -> None:
    store, blobs, fresh_image = setup
    image = fresh_image()
    order = [5, 0, 3]
    digests = block_digests(image, order)
    layout = write_hot_pack(blobs, image.manifest, digests + digests[:1])  # twice: once
    table = {b.digest: b for b in image.manifest.blocks}
    expected = b"".join(store.read_range(image.manifest.packs[table[d].pack], table[d].offset,
                                         table[d].length) for d in digests)
    assert store.get(layout.pack) == expected and list(layout.pieces) == digests
    location = table[digests[1]]
    path = store.root / image.manifest.packs[location.pack]
    data = bytearray(path.read_bytes())
    data[location.offset + 100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=f"block {location.digest} in packs/"):
        write_hot_pack(blobs, image.manifest, digests)


@pytest.mark.parametrize("with_hot_pack", [True, False])
def test_prefetch_fills_the_cache_in_recorded_order(setup, with_hot_pack: bool) -> None:
    store, blobs, fresh_image = setup
    order = [4, 1, 5, 0]
    hot = record(fresh_image(readahead_blocks=0), order)
    if not with_hot_pack:
        hot = HotList(hot.image_id, hot.workload, hot.blocks, hot.recordings, hot.samples)
    image = fresh_image()
    store.log.clear()
    prefetcher = Prefetcher(image, hot,
                            config=PrefetchConfig(concurrency=1, request_size=1)).start()
    assert prefetcher.wait(10)
    digests = block_digests(image, order)
    assert all(d in image.cache for d in digests)
    assert not any(d in image.cache for d in block_digests(image, [2, 3]))
    table = {b.digest: b for b in image.manifest.blocks}
    if with_hot_pack:
        expected = [(hot.layout.pack, hot.layout.pieces[d][0]) for d in digests]
    else:
        expected = [(image.manifest.packs[table[d].pack], table[d].offset) for d in digests]
    assert [(key, off) for _, key, off, _, _, _ in store.log] == expected
    stats = prefetcher.stats
    assert (stats.hot_blocks, stats.blocks_fetched, stats.fetch_requests) == (4, 4, 4)
    assert stats.hot_pack is with_hot_pack and stats.done
    # With the default sizes, the hot pack is read in requests of growing size: 1 MiB,
    # then at most 2, then 4 (blocks 4, 1 and 0 are incompressible MiBs, block 5 is small).
    if with_hot_pack:
        image, before = fresh_image(), len(store.log)
        prefetcher = Prefetcher(image, hot).start()
        prefetcher.wait(10)
        assert [len(r.pieces) for r in prefetcher.requests] == [1, 2, 1]
        # (issued in this order; with 4 in flight they may complete in any order)
        assert sorted(off for _, _, off, _, _, _ in store.log[before:]) == \
            [hot.layout.pieces[d][0] for d in (digests[0], digests[1], digests[3])]


def test_reads_during_a_prefetch_get_the_right_bytes_and_fetch_nothing_twice(setup) -> None:
    store, blobs, fresh_image = setup
    order = [5, 4, 3, 2, 1, 0]
    hot = record(fresh_image(readahead_blocks=0), order)
    image = fresh_image()
    store.delay = 0.1
    store.log.clear()
    prefetcher = Prefetcher(image, hot,
                            config=PrefetchConfig(concurrency=2, request_size=1)).start()
    entry = image.lookup("/data/big.bin")
    rng = random.Random(3)
    spans = [(off, rng.randrange(1, 2 * MIB)) for off in
             (rng.randrange(0, len(BIG)) for _ in range(24))]
    results: dict[int, bytes] = {}

    def reader(n: int) -> None:
        for k in range(n, len(spans), 6):
            off, size = spans[k]
            results[k] = image.read(entry, off, size)

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert prefetcher.wait(10)
    for k, (off, size) in enumerate(spans):
        assert results[k] == BIG[off : off + size], k
    # Every block of the file came from the store exactly once, by a read or the prefetch.
    fetched: list[str] = []
    table = image.manifest.blocks
    by_place = {(image.manifest.packs[b.pack], b.offset): b for b in table}
    by_place |= {(hot.layout.pack, off): next(b for b in table if b.digest == d)
                 for d, (off, _) in hot.layout.pieces.items()}
    for _, key, off, length, _, _ in store.log:
        first = by_place[(key, off)]
        end, here = off + length, off
        while here < end:
            block = by_place[(key, here)]
            fetched.append(block.digest)
            here += (hot.layout.pieces[block.digest][1] if key == hot.layout.pack
                     else block.length)
    assert sorted(fetched) == sorted(set(fetched)), "a block was fetched twice"
    assert first is not None
    used = image.stats.prefetch_hits + image.stats.prefetch_waits
    assert used > 0 and prefetcher.stats.blocks_fetched + image.stats.blocks_fetched == 6


def test_reads_go_ahead_of_the_prefetch(setup) -> None:
    """While a read fetches from the store, at most one prefetch request is in flight."""
    store, blobs, fresh_image = setup
    hot = record(fresh_image(readahead_blocks=0), [0, 1, 2, 3, 4])
    image = fresh_image(readahead_blocks=0)
    small = image.lookup("/data/small.txt")  # not in the hot list
    location = image.manifest.blocks[small.blocks[0]]
    store.slow[(image.manifest.packs[location.pack], location.offset)] = 0.35
    store.delay = 0.1
    store.log.clear()
    reader = threading.Thread(target=image.read, args=(small, 0, 6))
    reader.start()
    time.sleep(0.1)
    prefetcher = Prefetcher(image, hot,
                            config=PrefetchConfig(concurrency=4, request_size=1)).start()
    reader.join()
    assert prefetcher.wait(10)
    demand_end = next(end for name, *_, end in store.log if not name.startswith("prefetch"))
    prefetch = [(start, end) for name, _, _, _, start, end in store.log
                if name.startswith("prefetch")]

    def overlapping(t: float) -> int:
        return sum(1 for start, end in prefetch if start <= t < end)

    during = [overlapping(start) for start, _ in prefetch if start < demand_end - 0.05]
    after = [overlapping(start) for start, _ in prefetch if start >= demand_end]
    assert during and max(during) == 1
    assert after and max(after) > 1  # and it opens up again afterwards


def test_a_missing_or_damaged_hot_pack_falls_back_to_the_image_packs(setup, tmp_path,
                                                                    caplog) -> None:
    caplog.set_level(logging.WARNING)
    store, blobs, fresh_image = setup
    hot = record(fresh_image(readahead_blocks=0), [3, 0, 5])
    pack = tmp_path / "store" / hot.layout.pack
    data = bytearray(pack.read_bytes())
    data[hot.layout.pieces[hot.blocks[1].digest][0] + 50] ^= 0xFF
    pack.write_bytes(bytes(data))
    image = fresh_image(readahead_blocks=0)
    prefetcher = Prefetcher(image, hot).start()
    assert prefetcher.wait(10)
    assert prefetcher.stats.refetches == 1 and prefetcher.stats.failed_blocks == 0
    entry = image.lookup("/data/big.bin")
    assert image.read(entry, 0, MIB) == BIG[:MIB]
    assert image.stats.blocks_fetched == 0  # the repaired block is in the cache too
    pack.unlink()
    image = fresh_image()
    prefetcher = Prefetcher(image, hot).start()
    assert prefetcher.wait(10) and prefetcher.stats.blocks_fetched == 3
    assert image.read(entry, 3 * MIB, MIB) == BIG[3 * MIB : 4 * MIB]
    assert "using the image's packs" in caplog.text


def test_a_store_that_fails_fails_the_blocks_not_the_mount(setup, tmp_path) -> None:
    store, blobs, fresh_image = setup
    hot = record(fresh_image(readahead_blocks=0), [1, 2])
    image = fresh_image()
    for pack in image.manifest.packs + [hot.layout.pack]:
        (tmp_path / "store" / pack).unlink()
    prefetcher = Prefetcher(image, hot).start()
    assert prefetcher.wait(10)
    assert prefetcher.stats.failed_blocks == 2 and prefetcher.stats.done
    with pytest.raises(FileNotFoundError):  # a read then fails on its own (EIO via FUSE)
        image.read(image.lookup("/data/big.bin"), MIB, 10)


def test_recording_ends_on_the_ready_file_marker_timeout_or_exit(setup, tmp_path) -> None:
    _, blobs, fresh_image = setup
    ready, marker = tmp_path / "ready", tmp_path / "marker"
    cases = {"ready": ReadyWhen(ready_file=ready), "marker": ReadyWhen(marker=marker),
             "timeout": ReadyWhen(timeout=0.3), "exit": ReadyWhen()}
    for reason, when in cases.items():
        image = fresh_image(readahead_blocks=0)
        entry = image.lookup("/data/big.bin")
        recording = Recording(image, reason, when).start()
        image.read(entry, 0, 10)
        if reason == "ready":
            ready.write_text("1")
        elif reason == "marker":
            marker.write_text("1")
        elif reason == "exit":
            recording.finish("exit")
        deadline = time.monotonic() + 5
        while recording.reason is None and time.monotonic() < deadline:
            time.sleep(0.02)
        image.read(entry, 4 * MIB, 10)  # after the end: not part of the start
        assert recording.reason == reason
        assert recording.finish() is recording.result  # ending twice changes nothing
        stored = hotlist.load(blobs, image.image_id, reason)
        assert [b.digest for b in stored.blocks] == block_digests(image, [0]), reason
    # Nothing read: nothing stored.
    image = fresh_image()
    assert Recording(image, "idle", ReadyWhen()).start().finish() is None
    assert hotlist.load(blobs, image.image_id, "idle") is None


def test_mark_ready_writes_the_ready_file_when_recorded(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(READY_FILE_ENV, raising=False)
    assert mark_ready() is False
    monkeypatch.setenv(READY_FILE_ENV, str(tmp_path / "ready"))
    assert mark_ready() is True and (tmp_path / "ready").exists()
    assert mark_ready() is True  # again: fine
    import bootseer

    assert bootseer.mark_ready is mark_ready


def test_merge_of_many_recordings_keeps_the_list_small(setup) -> None:
    """The union grows only by what starts really read; order follows the median."""
    _, blobs, fresh_image = setup
    for order in ([0, 1, 2], [1, 0, 2], [0, 2, 1], [0, 1]):
        hot = record(fresh_image(readahead_blocks=0), order, workload="m")
    assert hot.recordings == 4 and len(hot.blocks) == 3
    assert [b.digest for b in hot.blocks][0] == block_digests(fresh_image(), [0])[0]


def test_a_stale_hot_list_prefetches_what_still_exists(setup, caplog) -> None:
    caplog.set_level(logging.WARNING)
    _, blobs, fresh_image = setup
    image = fresh_image()
    real = block_digests(image, [2])[0]
    stale = HotList(image.image_id, "s", (HotBlock("f" * 64, "/gone", 0.1),
                                          HotBlock(real, "/data/big.bin", 0.2)), 1, {})
    hotlist.save(blobs, stale, image.manifest)
    loaded = hotlist.load(blobs, image.image_id, "s", image.manifest)
    prefetcher = Prefetcher(image, loaded).start()
    assert prefetcher.wait(10) and prefetcher.stats.hot_blocks == 1
    assert real in image.cache and "not in the image" in caplog.text


def test_blocks_of_files_the_kernel_reads_whole_are_not_fetched(setup) -> None:
    """Under a root named by the image's metadata image, the kernel reads a file kept
    whole on the node itself: its hot blocks are skipped (each path asked about once),
    the other files' are fetched as before."""
    from bootseer.prefetch.wholefiles import WholeFiles

    store, blobs, fresh_image = setup
    recorder = fresh_image(readahead_blocks=0)
    recorder.recorder = hotlist.Recorder(recorder.image_id, "w")
    for n in (4, 1):
        recorder.read(recorder.lookup("/data/big.bin"), n * MIB, 10)
    recorder.read(recorder.lookup("/data/small.txt"), 0, 6)
    hot = hotlist.save(blobs, recorder.recorder.stop(), recorder.manifest)
    image = fresh_image()
    asked: list[str] = []

    def read_whole(path: str) -> bool:
        asked.append(path)
        return path == "/data/big.bin"

    prefetcher = Prefetcher(image, hot, config=PrefetchConfig(concurrency=1, request_size=1),
                            read_whole=read_whole).start()
    assert prefetcher.wait(10)
    stats = prefetcher.stats
    assert (stats.hot_blocks, stats.in_whole_files, stats.blocks_fetched) == (3, 2, 1)
    assert sorted(asked) == ["/data/big.bin", "/data/small.txt"]
    small = image.manifest.blocks[image.lookup("/data/small.txt").blocks[0]].digest
    assert small in image.cache and not any(d in image.cache
                                            for d in block_digests(image, [4, 1]))
    # What the server asks of the node: a file made whole is, one that is not is not.
    whole = WholeFiles(image)
    assert not whole.has("/data/big.bin")
    assert whole.make_whole([image.lookup("/data/big.bin")]) == 1
    assert whole.has("/data/big.bin") and not whole.has("/data/small.txt")
    assert not whole.has("/data") and not whole.has("/no/such/file")
    # A file found whole is taken as whole for the mount's life (the prefetch and the
    # read-ahead both ask): one evicted since is found missing when it is opened.
    big = image.lookup("/data/big.bin")
    whole.cache.drop(whole.key(big))
    assert whole.has("/data/big.bin") and not WholeFiles(image).has("/data/big.bin")
    assert whole.open(big) is None and whole.read_ahead(big, [(0, MIB)]) is False


class HeldCache(NodeCache):
    """A disk cache whose adds wait until ``go`` is set (a slow disk); notes the thread."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.go = threading.Event()
        self.go.set()  # the image's manifest goes in first
        self.writers: list[threading.Thread] = []

    def put_many(self, entries) -> None:
        self.writers.append(threading.current_thread())
        assert self.go.wait(10)
        super().put_many(entries)


def test_fetched_blocks_are_read_while_the_disk_cache_writes_them(setup, tmp_path) -> None:
    """A read does not wait for the disk cache to add the blocks it fetched: another
    thread does, at a lower priority, and until then a block is read from memory (even
    once out of the memory tier), never fetched again. ``flush`` waits for the writes."""
    from bootseer.prefetch import lazyimage

    store, blobs, _ = setup
    cache = HeldCache(tmp_path / "held", 1 << 30)
    image = LazyImage(blobs, "big", cache, readahead_blocks=0, recent_blocks=1)
    entry = image.lookup("/data/big.bin")
    cache.go.clear()
    cache.writers.clear()
    store.log.clear()
    first = image.read(entry, 0, 10)
    image.read(entry, MIB, 10)  # pushes block 0 out of the memory tier
    assert image.read(entry, 0, 10) == first == BIG[:10]
    assert len(store.log) == 2  # each block fetched once
    digests = block_digests(image, [0, 1])
    assert all(image.is_local(d) and d not in cache for d in digests)
    assert not image.flush(0.2)
    (writer,) = set(cache.writers)
    assert writer is not threading.current_thread()
    assert os.getpriority(os.PRIO_PROCESS, writer.native_id) >= lazyimage.WRITER_NICE
    cache.go.set()
    assert image.flush(10) and all(d in cache for d in digests)
    assert image.read(entry, 0, 10) == first and len(store.log) == 2


def test_a_warm_returns_once_what_it_fetched_is_on_disk(setup, tmp_path) -> None:
    """Keeping files whole fetches the blocks they lack, which the disk cache's writer adds
    behind the fetch: the warm waits for those writes, so that the start it prepared does
    not run beside them."""
    from bootseer.prefetch.warm import warm_image
    from bootseer.warming import NO_HOOKS

    store, blobs, fresh_image = setup
    recorder = fresh_image(readahead_blocks=0)
    recorder.recorder = hotlist.Recorder(recorder.image_id, "w")
    recorder.read(recorder.lookup("/data/big.bin"), MIB, 10)
    hotlist.save(blobs, recorder.recorder.stop(), recorder.manifest)
    cache = HeldCache(tmp_path / "held", 1 << 30)
    image = LazyImage(blobs, "big", cache, readahead_blocks=0)
    cache.go.clear()
    threading.Timer(0.5, cache.go.set).start()  # a slow disk
    result = warm_image(blobs, cache, "big", "w", lazy=image, whole_files=True)
    assert "whole_files" not in result.detail and result.later is not None  # for later
    result.finish(NO_HOOKS)
    assert result.detail["whole_files"] == 1 and result.later is None
    digests = block_digests(image, list(range(len(image.lookup("/data/big.bin").blocks))))
    assert cache.go.is_set() and all(d in cache for d in digests)


def test_past_its_bound_a_fetch_writes_its_own_blocks(setup, tmp_path, monkeypatch) -> None:
    """Memory waiting for the writer is bounded: beyond it, the fetching thread adds the
    blocks to the disk cache itself before it goes on."""
    from bootseer.prefetch import lazyimage

    store, blobs, _ = setup
    monkeypatch.setattr(lazyimage, "WRITE_BEHIND_BYTES", MIB // 2)
    cache = HeldCache(tmp_path / "held", 1 << 30)
    image = LazyImage(blobs, "big", cache, readahead_blocks=0)
    cache.writers.clear()
    image.read(image.lookup("/data/big.bin"), 0, 10)
    assert cache.writers == [threading.current_thread()]
    assert block_digests(image, [0])[0] in cache

"""The striped reader over a local store: byte-exact reads, stripes, retries, failures."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.store_contract import ramp
from support.wait import wait_until

from bootseer.store import Store, open_store
from bootseer.store.local import LocalStore
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.layout import Stripe, StripeLayout
from bootseer.stripedfs.memory import shared_memory
from bootseer.stripedfs.reader import StripedReader, StripeReadError

KIB = 1024
SMALL = StripeConfig(stripe_size=64 * KIB, initial_read_window=128 * KIB,
                     max_read_window=1024 * KIB, max_forward_seek_distance=256 * KIB,
                     max_backward_seek_distance=64 * KIB, max_memory=2048 * KIB,
                     max_concurrent_fetches=4, retry_initial_delay=0.001)
SIZE = 3 * 1024 * KIB + 12345  # several stripes and a short last one


class FlakyStore(LocalStore):
    """A store whose ranged reads fail: the first ``fail_first`` calls, or from a countdown."""

    def __init__(self, url: str, fail_first: int = 0, fail_after: int | None = None) -> None:
        super().__init__(url)
        self.calls, self.fail_first, self.fail_after = 0, fail_first, fail_after

    def _maybe_fail(self) -> None:
        self.calls += 1
        if self.calls <= self.fail_first or (
            self.fail_after is not None and self.calls > self.fail_after
        ):
            raise ConnectionResetError("injected: DataNode went away")

    def _read_range(self, key: str, offset: int, length: int) -> bytes:
        self._maybe_fail()
        return super()._read_range(key, offset, length)

    def read_range_into(self, key: str, offset: int, buffer: memoryview, *,
                        progress=None) -> None:
        self._maybe_fail()
        super().read_range_into(key, offset, buffer, progress=progress)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    store = open_store(str(tmp_path_factory.mktemp("ckpt")))
    store.put("ckpt.bin", ramp(0, SIZE))
    store.put("tiny.bin", b"tiny")
    store.put("empty.bin", b"")
    return store


def test_layout_never_crosses_a_block() -> None:
    layout = StripeLayout(size=10_000, stripe_size=3000, block_size=4096)
    stripes = list(layout.stripes(0, 10_000))
    assert stripes[:3] == [Stripe(0, 3000), Stripe(3000, 1096), Stripe(4096, 3000)]
    assert sum(s.length for s in stripes) == 10_000
    for s in stripes:
        assert s.start // 4096 == (s.end - 1) // 4096
    assert list(StripeLayout(5, 3).stripes(0, 100)) == [Stripe(0, 3), Stripe(3, 2)]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, SIZE + 100), st.integers(0, 400 * KIB)), min_size=1,
                max_size=12))
def test_random_reads_are_byte_exact(store: Store, reads: list[tuple[int, int]]) -> None:
    with StripedReader(store, "ckpt.bin", config=SMALL, block_size=96 * KIB) as reader:
        for offset, length in reads:
            expected = ramp(offset, max(0, min(length, SIZE - offset)))
            assert reader.read(offset, length) == expected


def test_sequential_read_to_the_end(store: Store) -> None:
    with StripedReader(store, "ckpt.bin", config=SMALL) as reader:
        out = bytearray()
        while chunk := reader.read(len(out), 128 * KIB):
            out += chunk
        assert bytes(out) == ramp(0, SIZE)
        assert reader.stats.seeks == 0
        assert reader.stats.stripe_hits > 0  # read-ahead was there before the reads
        assert reader.read(SIZE, 10) == b""  # EOF: empty, not an error


def test_small_and_empty_files(store: Store) -> None:
    with StripedReader(store, "tiny.bin", config=SMALL) as reader:
        assert reader.read(0, 100) == b"tiny"
        assert reader.read(2, 100) == b"ny"
    with StripedReader(store, "empty.bin", config=SMALL) as reader:
        assert reader.read(0, 10) == b""


def test_fetch_reads_exactly_the_range_in_parallel(store: Store) -> None:
    with StripedReader(store, "ckpt.bin", config=SMALL) as reader:
        assert reader.fetch(100, 300 * KIB) == ramp(100, 300 * KIB)
        assert reader.stats.stripes_fetched == 5  # the stripes it touches, no read-ahead


def test_transient_errors_are_retried(tmp_path: Path) -> None:
    flaky = FlakyStore(str(tmp_path), fail_first=2)
    flaky.put("f", ramp(0, 200 * KIB))
    with StripedReader(flaky, "f", config=SMALL, size=200 * KIB, block_size=None) as reader:
        assert reader.read(0, 200 * KIB) == ramp(0, 200 * KIB)
        assert reader.stats.retries >= 2


def test_a_read_that_keeps_failing_names_file_and_offset(tmp_path: Path) -> None:
    flaky = FlakyStore(str(tmp_path), fail_after=0)
    LocalStore(str(tmp_path)).put("f", ramp(0, 200 * KIB))
    with StripedReader(flaky, "f", config=SMALL, size=200 * KIB, block_size=None) as reader:
        with pytest.raises(StripeReadError, match=r"/f: reading bytes 65536-131072 failed after 4"):
            reader.read(70 * KIB, 10)
    flaky.fail_after = None  # the store recovers: a new read succeeds
    with StripedReader(flaky, "f", config=SMALL, size=200 * KIB) as reader:
        assert reader.read(70 * KIB, 10) == ramp(70 * KIB, 10)


def test_reads_slightly_out_of_order_fetch_each_stripe_once(store: Store) -> None:
    """FUSE answers a file's requests on several threads: a read can come just behind the
    one before it. Its stripe is still there, not fetched again (a page-cache mount read
    the file 3 times over from the DataNodes before)."""
    chunk = 16 * KIB
    with StripedReader(store, "ckpt.bin", config=SMALL) as reader:
        for base in range(0, SIZE, 4 * chunk):
            for k in (1, 0, 3, 2):  # each pair swapped: 16 KiB behind the read before
                offset = base + k * chunk
                assert reader.read(offset, chunk) == ramp(offset, min(chunk, SIZE - offset))
        assert reader.stats.bytes_fetched <= SIZE + 2 * SMALL.stripe_size, reader.stats


def test_stripes_are_asked_of_peers_first_and_read_from_the_store_when_they_fail(
        tmp_path: Path) -> None:
    """A peer answer fills its stripe; no answer, a failure or a short answer costs a
    store read of that stripe, never a wrong or a failed read."""
    flaky = FlakyStore(str(tmp_path))
    flaky.put("f", ramp(0, 256 * KIB))
    asked: list[int] = []

    def peer_read(offset: int, length: int) -> bytes | None:
        asked.append(offset)
        stripe = offset // (64 * KIB)
        if stripe == 1:
            return None  # no peer has it
        if stripe == 2:
            raise ConnectionResetError("the agent went away")
        if stripe == 3:
            return ramp(offset, length - 1)  # short
        return ramp(offset, length)

    with StripedReader(flaky, "f", config=SMALL, size=256 * KIB, block_size=None,
                       peer_read=peer_read) as reader:
        assert reader.fetch(0, 256 * KIB) == ramp(0, 256 * KIB)
        assert sorted(asked) == [0, 64 * KIB, 128 * KIB, 192 * KIB]
        assert (reader.stats.peer_stripes, reader.stats.peer_bytes) == (1, 64 * KIB)
        assert flaky.calls == 3 and reader.stats.stripes_fetched == 4


def _capped(limit_stripes: int, salt: int) -> StripeConfig:
    """A config whose process-wide pool is this test's own (pools are per stripe size and
    cap, so ``salt`` bytes over the cap keep tests apart)."""
    return StripeConfig(stripe_size=64 * KIB, initial_read_window=64 * KIB,
                        max_read_window=8192 * KIB, max_concurrent_fetches=4,
                        max_memory=limit_stripes * 64 * KIB + salt)


def test_a_hundred_readers_share_one_memory_cap(store: Store) -> None:
    """Each open file has its own read-ahead window; together they stay under the cap,
    and a reader whose read needs memory takes it back from the others' idle read-ahead
    (one thread reading round-robin: a per-file cap, or reads waiting on each other,
    would hang here)."""
    cfg = _capped(8, 1)
    readers = [StripedReader(store, "ckpt.bin", config=cfg) for _ in range(100)]
    memory = readers[0].memory
    for offset in range(0, 1024 * KIB, 32 * KIB):
        for reader in readers:
            assert reader.read(offset, 32 * KIB) == ramp(offset, 32 * KIB)
    assert memory.peak <= memory.capacity == 8
    assert memory.shed_buffers > 0  # reads took memory back from read-ahead
    for reader in readers:
        reader.close()
    # Every buffer comes back, a read-ahead still in flight at close as soon as it ends.
    wait_until(lambda: len(memory._free) == memory.allocated, seconds=10)


def test_readers_on_threads_stay_under_the_cap_and_read_right(store: Store) -> None:
    import random
    from concurrent.futures import ThreadPoolExecutor

    cfg = _capped(6, 2)

    def work(seed: int) -> None:
        rng = random.Random(seed)
        readers = [StripedReader(store, "ckpt.bin", config=cfg) for _ in range(4)]
        for _ in range(60):
            reader = rng.choice(readers)
            offset, length = rng.randrange(SIZE), rng.randrange(1, 200 * KIB)
            want = ramp(offset, max(0, min(length, SIZE - offset)))
            assert reader.read(offset, length) == want
        for reader in readers:
            reader.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    memory = shared_memory(cfg.stripe_size, cfg.max_memory)
    assert memory.peak <= memory.capacity
    assert len(memory._free) == memory.allocated


def test_reads_larger_than_the_cap_stream_through_it(store: Store) -> None:
    cfg = _capped(4, 3)
    with StripedReader(store, "ckpt.bin", config=cfg) as reader:
        assert reader.read(0, SIZE) == ramp(0, SIZE)  # 50 stripes through 4 buffers
    memory = reader.memory
    deadline = time.monotonic() + 10
    while len(memory._free) != memory.allocated:
        assert time.monotonic() < deadline, "buffers of a finished read never came back"
        time.sleep(0.01)
    assert memory.peak <= memory.capacity


def test_ranges_land_in_their_own_buffer_and_take_no_stripe_memory(store: Store) -> None:
    cfg = _capped(4, 3)
    with StripedReader(store, "ckpt.bin", config=cfg) as reader:
        memory = reader.memory
        before = memory.allocated
        assert reader.fetch(100, SIZE - 200) == ramp(100, SIZE - 200)  # past the cap
        first, second = reader.submit_range(0, SIZE), reader.submit_range(7, 5 * KIB)
        assert second.result() == ramp(7, 5 * KIB)
        assert first.result() == ramp(0, SIZE)
        reader.submit_range(0, SIZE).cancel()  # abandoned: nothing to give back
        assert memory.allocated == before
        # exactly the ranges: a range's edge stripes are cut to it
        assert reader.stats.bytes_fetched >= (SIZE - 200) + 5 * KIB + SIZE

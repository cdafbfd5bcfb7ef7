"""The store contract: one suite every backend must pass (the fsspec abstract-tests pattern).

A backend opts in with a two-line subclass that provides the ``store_url`` fixture::

    class TestLocalStore(StoreContract):
        @pytest.fixture
        def store_url(self, tmp_path): return f"file://{tmp_path}/store"

Test data is a *ramp*: the byte at offset ``i`` is a function of ``i``, so any range read
from anywhere can be checked without keeping the source around.
"""

from __future__ import annotations

import functools
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bootseer.errors import IntegrityError, InvalidRangeError
from bootseer.store import BlobStore, Store, open_store
from bootseer.store.base import HANDOFF, RangedFile
from bootseer.store.blobs import CHUNK_SIZE, STREAM_READ, STREAM_START, ChunkTable

GIB = 1 << 30
MIB = 1 << 20


def ramp(offset: int, length: int) -> bytes:
    """Bytes whose value depends on their absolute offset (period 251, a prime)."""
    pattern = bytes(range(251)) * ((length // 251) + 2)
    start = offset % 251
    return pattern[start : start + length]


def make_sparse_file(path: Path, size: int, islands: list[int], island_len: int = 4096) -> None:
    """A sparse file of ``size`` bytes with ramp data at each offset in ``islands``."""
    with open(path, "wb") as f:
        f.truncate(size)
        for offset in islands:
            f.seek(offset)
            f.write(ramp(offset, min(island_len, size - offset)))


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


class StoreContract:
    """Mixin of contract tests; subclasses supply ``store_url`` (and may override sizes)."""

    #: Size of the multi-GB sparse round trip; above 2 GiB to catch 32-bit offset bugs.
    large_object_size = 2 * GIB + 256 * MIB

    @pytest.fixture
    def store_url(self) -> str:
        raise NotImplementedError("a backend's test class must provide the store_url fixture")

    @pytest.fixture
    def store(self, store_url: str) -> Store:
        return open_store(store_url)

    @pytest.fixture
    def blobs(self, store: Store) -> BlobStore:
        return BlobStore(store)

    # -- round trips --------------------------------------------------------------------------

    def test_empty_object_round_trip(self, blobs: BlobStore) -> None:
        info = blobs.put(b"")
        assert info.digest == "sha256:" + hashlib.sha256(b"").hexdigest()
        assert info.size == 0
        assert blobs.get(info.digest) == b""
        assert blobs.read_range(info.digest, 0, 0) == b""
        with pytest.raises(InvalidRangeError):
            blobs.read_range(info.digest, 0, 1)

    def test_small_object_round_trip(self, blobs: BlobStore) -> None:
        data = b"hello, bootseer"
        info = blobs.put(data)
        assert info == blobs.stat(info.digest)
        assert blobs.get(info.digest) == data
        assert blobs.read_range(info.digest, 7, 8) == b"bootseer"

    def test_put_of_existing_content_is_a_no_op(self, blobs: BlobStore) -> None:
        first = blobs.put(b"same")
        assert blobs.put([b"sa", b"me"]) == first
        assert [b.digest for b in blobs.list()] == [first.digest]

    def test_multi_gb_sparse_round_trip(self, blobs: BlobStore, tmp_path: Path) -> None:
        size = self.large_object_size
        islands = [0, CHUNK_SIZE - 100, 2 * GIB - 2048, size - 4096]
        source = tmp_path / "sparse.bin"
        make_sparse_file(source, size, islands)
        with open(source, "rb") as f:
            info = blobs.put(f)
        assert info.size == size
        assert info.digest == sha256_file(source)
        for offset in islands:  # each island, and the zeros just before it
            start = max(0, offset - 10)
            expected = bytes(offset - start) + ramp(offset, 4096)
            assert blobs.read_range(info.digest, start, len(expected)) == expected[: size - start]
        whole = hashlib.sha256()
        for chunk in blobs.iter_chunks(info.digest):
            whole.update(chunk)
        assert "sha256:" + whole.hexdigest() == info.digest

    # -- ranged reads -------------------------------------------------------------------------

    def test_ranged_reads(self, blobs: BlobStore, store: Store) -> None:
        size = 3 * CHUNK_SIZE + 12345
        info = blobs.put(ramp(0, size))
        key = BlobStore.blob_key(info.digest)
        for read in (lambda o, n: blobs.read_range(info.digest, o, n),
                     lambda o, n: store.read_range(key, o, n)):
            assert read(0, 100) == ramp(0, 100)  # at 0
            assert read(size - 100, 100) == ramp(size - 100, 100)  # at the end
            assert read(size, 0) == b""  # empty read at the end
            assert read(CHUNK_SIZE - 7, 14) == ramp(CHUNK_SIZE - 7, 14)  # across a chunk
            span = (CHUNK_SIZE // 2, 2 * CHUNK_SIZE + 3)  # across two internal boundaries
            assert read(*span) == ramp(*span)
            assert read(0, size) == ramp(0, size)
            with pytest.raises(InvalidRangeError, match="past the end|outside"):
                read(size - 1, 2)  # past the end: an error, never a short read
            with pytest.raises(InvalidRangeError):
                read(size + 1, 0)
            with pytest.raises(InvalidRangeError):
                read(-1, 10)

    def test_ranged_reads_into_a_buffer(self, store: Store) -> None:
        """What the striped reader uses: the exact range, straight into its buffer."""
        size = 3 * CHUNK_SIZE + 12345
        store.put("into.bin", ramp(0, size))
        buffer = bytearray(2 * CHUNK_SIZE + 10)
        for offset, length in ((0, 100), (CHUNK_SIZE - 7, 14), (size - 100, 100),
                               (CHUNK_SIZE // 2, 2 * CHUNK_SIZE + 3)):
            view = memoryview(buffer)[5:5 + length]
            store.read_range_into("into.bin", offset, view)
            assert bytes(view) == ramp(offset, length)
        assert buffer[:5] == bytes(5)  # nothing written before the view
        with pytest.raises(InvalidRangeError):
            store.read_range_into("into.bin", size - 1, memoryview(buffer)[:2])
        with pytest.raises(FileNotFoundError):
            store.read_range_into("no/such/key", 0, memoryview(buffer)[:2])

    def test_a_local_descriptor_reads_the_object_or_there_is_none(self, store: Store) -> None:
        """``open_local``: the object's own file (file://), or None (a remote store); a
        missing key is FileNotFoundError either way where a descriptor exists."""
        store.put("local.bin", ramp(3, 5000))
        fd = store.open_local("local.bin")
        if fd is None:
            return
        try:
            assert os.pread(fd, 6000, 0) == ramp(3, 5000)
        finally:
            os.close(fd)
        with pytest.raises(FileNotFoundError):
            store.open_local("no/such/key")

    def test_blob_ranges_read_into_a_buffer(self, blobs: BlobStore) -> None:
        """Whole chunks go straight into the buffer; any other range is copied in."""
        size = 3 * CHUNK_SIZE + 5
        info = blobs.put(ramp(0, size))
        for offset, length in ((0, 2 * CHUNK_SIZE), (CHUNK_SIZE, size - CHUNK_SIZE),
                               (7, CHUNK_SIZE), (size - 3, 3)):
            buffer = bytearray(length)
            blobs.read_range_into(info.digest, offset, memoryview(buffer))
            assert buffer == ramp(offset, length)
        past_end = memoryview(bytearray(2 * CHUNK_SIZE))
        with pytest.raises(InvalidRangeError):
            blobs.read_range_into(info.digest, 2 * CHUNK_SIZE, past_end)

    def test_open_streams_the_blob(self, blobs: BlobStore) -> None:
        size = 2 * STREAM_READ + 5
        info = blobs.put(ramp(0, size))
        with blobs.open(info.digest) as f:
            assert f.read(10) == ramp(0, 10)
            assert f.read(STREAM_READ) == ramp(10, STREAM_READ)
            assert f.read() == ramp(10 + STREAM_READ, size - 10 - STREAM_READ)
            assert f.read(1) == b""

    # -- races and crashes --------------------------------------------------------------------

    def test_concurrent_writers_of_the_same_blob(self, blobs: BlobStore) -> None:
        """Both writers stream in lockstep, so both publish at the same moment."""
        chunks = [ramp(i * MIB, MIB) for i in range(8)]
        barrier = threading.Barrier(2)
        results, errors = [], []

        def writer() -> None:
            def stream():
                for chunk in chunks:
                    barrier.wait(timeout=60)
                    yield chunk
                barrier.wait(timeout=60)

            try:
                results.append(BlobStore(blobs.store).put(stream()))
            except Exception as exc:  # surfaced by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=writer) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        assert len(results) == 2 and results[0] == results[1]
        digest = results[0].digest
        BlobStore(blobs.store).verify(digest)
        assert [b.digest for b in blobs.list()] == [digest]

    def test_writer_killed_mid_put_leaves_nothing_visible(
        self, store_url: str, blobs: BlobStore
    ) -> None:
        script = textwrap.dedent(f"""
            import sys, time
            from bootseer.store import BlobStore, open_store
            def stream():
                for i in range(10**6):
                    yield bytes([i % 256]) * (1 << 20)
                    if i == 3:
                        print("writing", flush=True)
                    time.sleep(0.01)
            BlobStore(open_store({store_url!r})).put(stream())
        """)
        child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                 text=True, env=os.environ.copy())
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "writing"
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=60)
        assert list(blobs.list()) == []
        assert list(blobs.store.list()) == []
        blobs.store.sweep_temporaries(older_than=0)
        assert list(blobs.store.list()) == []
        info = blobs.put(b"after the crash")
        assert blobs.get(info.digest) == b"after the crash"

    # -- integrity ----------------------------------------------------------------------------

    def test_corrupted_blob_is_detected_on_read(self, blobs: BlobStore, store: Store) -> None:
        data = ramp(0, 3 * CHUNK_SIZE)
        info = blobs.put(data)
        bad = bytearray(data)
        bad[CHUNK_SIZE + 10] ^= 0xFF  # one bit pattern flipped in the second chunk
        store.put(BlobStore.blob_key(info.digest), bytes(bad))
        fresh = BlobStore(store)  # nothing cached from the put
        with pytest.raises(IntegrityError, match=info.digest):
            fresh.get(info.digest)
        with pytest.raises(IntegrityError, match="chunk 1"):
            fresh.read_range(info.digest, CHUNK_SIZE, 100)
        assert fresh.read_range(info.digest, 0, 100) == data[:100]  # other chunks still serve
        with pytest.raises(IntegrityError):
            fresh.verify(info.digest)
        # Whole chunks read straight into a buffer are checked there; a stream at its end.
        with pytest.raises(IntegrityError, match="chunk 1"):
            fresh.read_range_into(info.digest, 0, memoryview(bytearray(2 * CHUNK_SIZE)))
        with pytest.raises(IntegrityError, match=info.digest), fresh.open(info.digest) as f:
            f.read()

    def test_a_stream_reads_ahead_and_is_checked_as_a_whole_at_its_end(
            self, blobs: BlobStore, store: Store) -> None:
        """A stream fetches its next run while the reader works through this one: the
        bytes are the blob's. Replaced bytes, and a chunk table forged to fit them (a
        table is checked for damage, not against the blob), fail the read that reaches
        the end; the reads before return what is stored."""
        data = ramp(0, 3 * STREAM_READ + 7)
        info = blobs.put(data)
        with blobs.open(info.digest) as f:
            got = b"".join(iter(lambda: f.read(CHUNK_SIZE // 3), b""))
        assert got == data
        bad = bytearray(data)
        bad[2 * STREAM_READ + 5] ^= 0xFF
        store.put(BlobStore.blob_key(info.digest), bytes(bad))
        store.put(BlobStore.table_key(info.digest), ChunkTable(
            info.digest, len(bad), CHUNK_SIZE,
            tuple(hashlib.sha256(bad[i : i + CHUNK_SIZE]).digest()
                  for i in range(0, len(bad), CHUNK_SIZE))).encode())
        fresh = BlobStore(store)
        assert fresh.read_range(info.digest, 2 * STREAM_READ, 10) == bad[2 * STREAM_READ:][:10]
        with fresh.open(info.digest) as f:
            assert f.read(3 * STREAM_READ) == bad[: 3 * STREAM_READ]
            with pytest.raises(IntegrityError, match=f"{info.digest} is corrupt or was "
                                                     f"replaced"):
                f.read()

    @pytest.mark.parametrize("size", [0, 1000, STREAM_READ, 2 * STREAM_READ + 3])
    def test_a_stream_started_before_its_first_read_has_the_same_bytes(
            self, blobs: BlobStore, size: int) -> None:
        """``open(start=True)`` fetches the first run before anyone reads: the reads that
        follow take it and go on as any stream's."""
        data = ramp(0, size)
        info = blobs.put(data)
        with blobs.open(info.digest, start=True) as f:
            assert b"".join(iter(lambda: f.read(CHUNK_SIZE // 3), b"")) == data

    def test_a_started_stream_fetches_its_first_run_before_it_is_read(
            self, blobs: BlobStore, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        """The first run is STREAM_START bytes, fetched before the first read; the runs
        after it are STREAM_READ bytes each (the last: what is left)."""
        data = ramp(0, STREAM_START + STREAM_READ + 5)
        info = blobs.put(data)
        fetched, first = [], threading.Event()
        read_range_into = store.read_range_into

        def spy(key: str, offset: int, buffer: memoryview, *, progress=None) -> None:
            fetched.append((offset, len(buffer)))
            read_range_into(key, offset, buffer, progress=progress)
            first.set()

        monkeypatch.setattr(store, "read_range_into", spy)
        with blobs.open(info.digest, start=True) as f:
            assert first.wait(60), "the first run was not fetched before the first read"
            assert b"".join(iter(lambda: f.read(CHUNK_SIZE // 3), b"")) == data
        assert fetched == [(0, STREAM_START), (STREAM_START, STREAM_READ),
                           (STREAM_START + STREAM_READ, 5)]

    def test_a_stream_hands_over_a_run_as_its_bytes_arrive(
            self, blobs: BlobStore, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        """A reader takes the bytes of a run that are in place while the rest is still on
        its way (a restore's worker starts on a shard's first packets), and the stream is
        still checked as a whole at its end."""
        data = ramp(0, STREAM_START)
        info = blobs.put(data)
        half, rest_may_come = STREAM_START // 2, threading.Event()
        read_range_into = store.read_range_into

        def arriving_in_two(key: str, offset: int, buffer: memoryview, *,
                            progress=None) -> None:
            read_range_into(key, offset, buffer)
            assert progress is not None, "a stream reads ahead with progress"
            progress(half)
            assert rest_may_come.wait(60), "the reader waited for the whole run"
            progress(len(buffer))

        monkeypatch.setattr(store, "read_range_into", arriving_in_two)
        with blobs.open(info.digest, start=True) as f:
            got = f.read1(STREAM_START)
            assert got == data[:half]
            rest_may_come.set()
            assert got + f.read() == data

    def test_a_run_arriving_packet_by_packet_is_taken_in_handoffs_not_packets(
            self, blobs: BlobStore, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        """A reader waits for HANDOFF bytes of a run (or its end) before it takes a piece:
        a run told packet by packet (64 KiB) is read in a few large pieces."""
        data = ramp(0, STREAM_START)
        info = blobs.put(data)
        read_range_into = store.read_range_into

        def packet_by_packet(key: str, offset: int, buffer: memoryview, *,
                             progress=None) -> None:
            read_range_into(key, offset, buffer)
            for done in range(64 << 10, len(buffer), 64 << 10):
                progress(done)
                time.sleep(0.002)  # the next packet is on its way
            progress(len(buffer))

        monkeypatch.setattr(store, "read_range_into", packet_by_packet)
        pieces = []
        with blobs.open(info.digest, start=True) as f:
            while piece := f.read1(STREAM_READ):
                pieces.append(piece)
        assert b"".join(pieces) == data
        assert len(pieces) <= STREAM_START // HANDOFF, [len(p) for p in pieces]

    def test_a_stream_read_whole_from_a_run_still_arriving_has_every_byte(
            self, blobs: BlobStore, store: Store) -> None:
        """``RangedFile.readall`` goes on past a short read of a run read ahead."""
        data = ramp(0, STREAM_START + 3)
        info = blobs.put(data)
        raw = RangedFile(functools.partial(store.read_range_into, BlobStore.blob_key(
            info.digest)), len(data), "whole", read_ahead=STREAM_READ)
        raw.start(STREAM_START)
        assert raw.readall() == data

    def test_read_range_into_tells_its_progress(self, store: Store) -> None:
        """``progress`` hears how much of the buffer is in place, never less than before,
        the last time all of it."""
        data = ramp(0, 3 * CHUNK_SIZE + 11)
        store.put("progress.bin", data)
        buffer, heard = bytearray(len(data) - 100), []
        store.read_range_into("progress.bin", 100, memoryview(buffer), progress=heard.append)
        assert bytes(buffer) == data[100:]
        assert heard and heard[-1] == len(buffer) and heard == sorted(heard)

    def test_truncated_blob_is_detected(self, blobs: BlobStore, store: Store) -> None:
        info = blobs.put(ramp(0, 2 * CHUNK_SIZE))
        store.put(BlobStore.blob_key(info.digest), ramp(0, CHUNK_SIZE))
        with pytest.raises(IntegrityError, match=info.digest):
            BlobStore(store).read_range(info.digest, 0, 10)

    def test_corrupted_chunk_table_is_detected(self, blobs: BlobStore, store: Store) -> None:
        info = blobs.put(ramp(0, CHUNK_SIZE + 1))
        table_key = BlobStore.table_key(info.digest)
        table = bytearray(store.get(table_key))
        table[60] ^= 0x01
        store.put(table_key, bytes(table))
        with pytest.raises(IntegrityError, match="chunk table"):
            BlobStore(store).read_range(info.digest, 0, 10)

    def test_missing_chunk_table_is_rebuilt(self, blobs: BlobStore, store: Store) -> None:
        info = blobs.put(ramp(0, CHUNK_SIZE + 1))
        store.delete(BlobStore.table_key(info.digest))
        assert BlobStore(store).read_range(info.digest, CHUNK_SIZE, 1) == ramp(CHUNK_SIZE, 1)
        assert store.exists(BlobStore.table_key(info.digest))

    def test_expected_digest_mismatch_stores_nothing(self, blobs: BlobStore) -> None:
        wrong = "sha256:" + "0" * 64
        with pytest.raises(IntegrityError, match="expected digest"):
            blobs.put(b"payload", expect=wrong)
        assert list(blobs.store.list()) == []

    # -- keys, listing, deleting, references --------------------------------------------------

    def test_missing_objects_raise_file_not_found(self, blobs: BlobStore, store: Store) -> None:
        missing = "sha256:" + "a" * 64
        with pytest.raises(FileNotFoundError):
            blobs.get(missing)
        with pytest.raises(FileNotFoundError):
            blobs.stat(missing)
        with pytest.raises(FileNotFoundError):
            store.stat("no/such/key")
        with pytest.raises(FileNotFoundError):
            store.delete("no/such/key")
        assert not store.exists("no/such/key")

    def test_replication_is_set_where_the_store_has_it(self, store: Store) -> None:
        with pytest.raises(FileNotFoundError):
            store.replication("no/such")
        with pytest.raises(FileNotFoundError):
            store.set_replication("no/such", 2)
        store.put("replicated", b"x" * 1000)
        if store.replication("replicated") is None:  # one local copy: nothing to spread
            assert store.set_replication("replicated", 3) is False
            return
        assert store.set_replication("replicated", 2) is True
        assert store.replication("replicated") == 2
        assert store.set_replication("replicated", 1) and store.replication("replicated") == 1
        with pytest.raises(ValueError):
            store.set_replication("replicated", 0)

    def test_create_only_publish(self, store: Store) -> None:
        store.put("a/b", b"first", overwrite=False)
        with pytest.raises(FileExistsError):
            store.put("a/b", b"second", overwrite=False)
        assert store.get("a/b") == b"first"
        assert [i.key for i in store.list()] == ["a/b"]  # the loser left no temporary
        store.put("a/b", b"third")
        assert store.get("a/b") == b"third"

    def test_invalid_keys_are_refused(self, store: Store) -> None:
        for key in ("../escape", "/absolute", "a/../b", ".tmp/x", "a//b", "", "a/"):
            with pytest.raises(ValueError):
                store.put(key, b"x")

    def test_listing_and_deleting_objects(self, store: Store) -> None:
        for key in ("x/1", "x/2", "x/sub/3", "xy/4", "z"):
            store.put(key, key.encode())
        assert [i.key for i in store.list("x/")] == ["x/1", "x/2", "x/sub/3"]
        assert [i.key for i in store.list("x")] == ["x/1", "x/2", "x/sub/3", "xy/4"]
        assert [i.key for i in store.list()] == ["x/1", "x/2", "x/sub/3", "xy/4", "z"]
        assert list(store.list("nothing/")) == []
        info = store.stat("x/sub/3")
        assert (info.key, info.size) == ("x/sub/3", 7)
        store.delete("x/2")
        assert [i.key for i in store.list("x/")] == ["x/1", "x/sub/3"]

    def test_references(self, blobs: BlobStore) -> None:
        a, b = blobs.put(b"a"), blobs.put(b"bb")
        blobs.set_ref("images/one/hot", a.digest, {"workload": "train"})
        blobs.set_ref("images/two/hot", b.digest)
        blobs.set_ref("snapshots/k1", b.digest)
        ref = blobs.get_ref("images/one/hot")
        assert (ref.digest, ref.size, ref.meta) == (a.digest, 1, {"workload": "train"})
        assert blobs.resolve("images/one/hot") == a.digest
        assert blobs.resolve(a.digest) == a.digest
        assert sorted(blobs.list_refs()) == ["images/one/hot", "images/two/hot", "snapshots/k1"]
        assert sorted(blobs.list_refs("images/")) == ["images/one/hot", "images/two/hot"]
        with pytest.raises(FileExistsError):
            blobs.set_ref("snapshots/k1", a.digest, overwrite=False)
        blobs.set_ref("snapshots/k1", a.digest)  # overwrite moves it
        assert blobs.get_ref("snapshots/k1").digest == a.digest
        blobs.delete_ref("images/two/hot")
        assert sorted(blobs.list_refs()) == ["images/one/hot", "snapshots/k1"]
        with pytest.raises(FileNotFoundError, match="images/two/hot"):
            blobs.get_ref("images/two/hot")
        with pytest.raises(FileNotFoundError):
            blobs.delete_ref("images/two/hot")
        with pytest.raises(FileNotFoundError):
            blobs.set_ref("dangling", "sha256:" + "b" * 64)

    def test_deleting_a_blob(self, blobs: BlobStore) -> None:
        info = blobs.put(b"short-lived")
        blobs.delete(info.digest)
        assert not blobs.exists(info.digest)
        assert list(blobs.store.list()) == []
        with pytest.raises(FileNotFoundError):
            blobs.delete(info.digest)

    def test_access_never_grants_more_than_reading(self, store: Store) -> None:
        """Who may read an object (for staged copies and mounts): read bits only, and an
        owner or group only where this node has an account of that name."""
        import pwd

        store.put("acl/object", b"x")
        access = store.access("acl/object")
        if access is None:  # the backend cannot say: only root will read its copies
            return
        assert access.mode & ~0o444 == 0
        if access.uid is not None:
            pwd.getpwuid(access.uid)  # a real local account
        elif access.mode & 0o400:
            raise AssertionError("an owner bit for an owner with no account here")
        with pytest.raises(FileNotFoundError):
            store.access("acl/missing")

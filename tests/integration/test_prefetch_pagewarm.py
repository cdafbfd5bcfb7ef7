"""Hot blocks put into the kernel's page cache ahead of reads: the warmer on its own, and a
real FUSE mount whose reads of hot blocks then never reach its server."""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import threading
import time
from pathlib import Path

from support.images import BIG, MIB, bootseer, recorded_big_image
from support.pagecache import io_class

from bootseer.fuse import proto, server
from bootseer.fuse.server import PagePusher, PushCounts
from bootseer.nodecache import NodeCache
from bootseer.prefetch.imagetree import ImageTree
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.metaimage import KeyTree
from bootseer.prefetch.pagewarm import PageWarmer
from bootseer.readahead import IOPRIO_CLASS_IDLE
from bootseer.store import BlobStore, open_store


class Pushes:
    """What a tree pushed, as the server's pusher would have taken it."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, bytes]] = []
        self.changed = threading.Condition()

    def __call__(self, ino: int, offset: int, data: bytes) -> None:
        with self.changed:
            self.seen.append((ino, offset, data))
            self.changed.notify_all()

    def wait_for(self, n: int) -> list[tuple[int, int, bytes]]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.seen) >= n, timeout=10), self.seen
            return list(self.seen)


def test_the_pusher_never_blocks_its_caller_and_holds_a_bounded_queue(monkeypatch) -> None:
    """A connection that takes nothing (a pipe nobody reads, once full): pushes past the
    queue's bytes are dropped, at once; what was queued goes out in order, as one
    FUSE_NOTIFY_STORE message each, once the connection takes it."""
    monkeypatch.setattr(server, "PUSH_QUEUE_BYTES", 3 * MIB)
    read_end, write_end = os.pipe()
    counts = PushCounts()
    pusher = PagePusher(write_end, counts)
    started = time.monotonic()
    for n in range(8):
        pusher.push(7, n * MIB, bytes([n]) * MIB)
    # Three fit (the first counts until it is written), five are dropped, none waited.
    assert time.monotonic() - started < 1 and counts.dropped == 5
    messages = []
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        def message() -> tuple[int, int, bytes]:
            header = pipe.read(proto.OUT_HEADER.size + proto.NOTIFY_STORE_OUT.size)
            length, code, unique = proto.OUT_HEADER.unpack_from(header)
            ino, offset, size, _ = proto.NOTIFY_STORE_OUT.unpack_from(header,
                                                                      proto.OUT_HEADER.size)
            assert (code, unique, length) == (proto.NOTIFY_STORE, 0, len(header) + size)
            data = b""
            while len(data) < size:
                data += pipe.read(size - len(data))
            return ino, offset, data

        while len(messages) < 3:
            messages.append(message())
        pusher.stop()
        os.close(write_end)
    assert messages == [(7, n * MIB, bytes([n]) * MIB) for n in range(3)]
    assert (counts.pushes, counts.bytes, counts.unknown) == (3, 3 * MIB, 0)


def test_a_push_the_kernel_has_no_inode_for_yet_is_tried_again_a_little_later(
        monkeypatch) -> None:
    """A push can reach the kernel just before the lookup's inode exists (ENOENT): node 5
    is refused twice and then taken, node 6 always refused; node 7 goes meanwhile."""
    refusals = {5: 2, 6: 99}
    written: list[tuple[int, float]] = []

    def write(self, ino: int, offset: int, data: bytes) -> int | None:
        if refusals.get(ino, 0) > 0:
            refusals[ino] -= 1
            return errno.ENOENT
        written.append((ino, time.monotonic()))
        return None

    monkeypatch.setattr(PagePusher, "_write", write)
    counts = PushCounts()
    pusher = PagePusher(-1, counts)
    started = time.monotonic()
    for ino in (5, 6, 7):
        pusher.push(ino, 0, b"x" * 10)
    deadline = time.monotonic() + 5
    while counts.pushes + counts.unknown < 3:
        assert time.monotonic() < deadline, counts
        time.sleep(0.01)
    pusher.stop()
    assert [ino for ino, _ in written] == [7, 5]
    assert written[1][1] - started >= server.PUSH_RETRY_S * 3  # after 5 ms, then 10 ms more
    assert (counts.pushes, counts.unknown, counts.bytes) == (2, 1, 20)
    assert refusals[6] == 99 - 1 - server.PUSH_RETRIES


def test_a_looked_up_files_hot_blocks_are_pushed_when_local_and_once_fetched(dirs) -> None:
    recorded_big_image(dirs)
    blobs = BlobStore(open_store(str(dirs["store"])))
    image = LazyImage(blobs, "big", NodeCache(dirs["cache"] / "blocks", 1 << 30),
                      readahead_blocks=0)
    big, small = image.lookup("/data/big.bin"), image.lookup("/data/small.txt")
    digest = [image.manifest.blocks[i].digest for i in big.blocks]
    hot = [digest[1], digest[3], digest[5], image.manifest.blocks[small.blocks[0]].digest]
    image.read(big, 3 * MIB, 1)  # block 3 is local before the kernel knows the file
    pushes = Pushes()
    tree = ImageTree(image, hot=hot)
    tree.use_pusher(pushes)
    for _ in range(2):  # a second lookup of the same file pushes nothing again
        tree.looked_up(big.ino)
    assert pushes.wait_for(1) == [(big.ino, 3 * MIB, BIG[3 * MIB : 4 * MIB])]

    image.read(big, 0, 10)  # not hot: read, never pushed
    image.read(big, 5 * MIB, 10)  # hot: pushed as its fetch verifies; the file's tail only
    image.read(big, MIB + 7, 10)
    assert sorted(pushes.wait_for(3)[1:]) == [(big.ino, MIB, BIG[MIB : 2 * MIB]),
                                             (big.ino, 5 * MIB, BIG[5 * MIB :])]
    time.sleep(0.2)
    assert len(pushes.seen) == 3  # small.txt is hot, but the kernel was never told of it
    tree.looked_up(small.ino)
    time.sleep(0.2)
    assert len(pushes.seen) == 3  # pushing fetches nothing of its own
    assert image.read(small, 0, 100) == b"small\n"
    assert pushes.wait_for(4)[3] == (small.ino, 0, b"small\n")
    assert image.stats.blocks_fetched == 5


def test_only_a_warmer_given_every_file_at_once_reads_behind_the_start(dirs) -> None:
    """A metadata image's mount gives its warmer every whole file as serving begins, well
    ahead of need: those reads queue behind the start's own (idle I/O class). A warmer fed
    by lookups reads what the start reads next, at the start's priority."""
    recorded_big_image(dirs)
    blobs = BlobStore(open_store(str(dirs["store"])))
    image = LazyImage(blobs, "big", NodeCache(dirs["cache"] / "blocks", 1 << 30))

    def warmer_class(behind: bool) -> int:
        before = set(threading.enumerate())
        PageWarmer(image, [], Pushes(), behind=behind)
        (thread,) = [t for t in threading.enumerate()
                     if t not in before and t.name == "page-warmer"]
        assert thread.native_id is not None
        deadline = time.monotonic() + 10
        while (found := io_class(thread.native_id)) != IOPRIO_CLASS_IDLE and behind:
            assert time.monotonic() < deadline, found
            time.sleep(0.01)
        time.sleep(0.2)  # long past the thread's first act
        return io_class(thread.native_id)

    assert warmer_class(behind=True) == IOPRIO_CLASS_IDLE
    assert warmer_class(behind=False) != IOPRIO_CLASS_IDLE
    hot = [image.manifest.blocks[0].digest]
    looked_up, at_once = ImageTree(image, hot=hot), KeyTree(image, hot, hot_files=["/x"])
    for tree in (looked_up, at_once):
        tree.use_pusher(Pushes())
    assert looked_up.warmer is not None and not looked_up.warmer.behind
    assert at_once.warmer is not None and at_once.warmer.behind


def test_a_mounts_reads_of_hot_blocks_are_page_cache_hits(dirs) -> None:
    """The mount prefetches the hot list (blocks 1, 3, 4 of big.bin) and pushes each block
    once the file is looked up: reading them asks the server for nothing."""
    recorded_big_image(dirs)
    bootseer("image", "mount", "big", str(dirs["mnt"]), "--workload", "train",
             store=dirs["store"], cache=dirs["cache"])
    path = dirs["mnt"] / "data" / "big.bin"
    assert path.stat().st_size == len(BIG)  # the lookup

    def stats() -> dict:
        return json.loads(bootseer("image", "stats", str(dirs["mnt"]), store=dirs["store"],
                                   cache=dirs["cache"]).stdout)

    deadline = time.monotonic() + 20
    while (pushed := stats().get("pages_pushed") or {}).get("pushes", 0) < 3:
        assert time.monotonic() < deadline, pushed
        time.sleep(0.2)
    assert pushed.pop("cpu_s") > 0  # what the writes cost the server
    assert pushed == {"pushes": 3, "bytes": 3 * MIB, "dropped": 0, "unknown": 0}
    # A busy machine may reclaim a pushed page before it is read (a clean page cache page,
    # seen once in a full CI run): only the blocks wholly in the page cache must not reach
    # the server, and at least one must be.
    evicted = [n for n in (1, 3, 4) if not _resident(path, n * MIB, MIB)]
    assert len(evicted) < 3
    with open(path, "rb", buffering=0) as f:  # no read past what is asked
        for n in (1, 3, 4):
            f.seek(n * MIB + 10)
            assert f.read(MIB - 10) == BIG[n * MIB + 10 : (n + 1) * MIB]
        time.sleep(0.6)  # a stats refresh
        assert stats()["fuse_requests"].get("read", 0) <= len(evicted)
        f.seek(10)
        assert f.read(100) == BIG[10:110]  # block 0 is not hot: the server reads it
    deadline = time.monotonic() + 5
    while stats()["fuse_requests"].get("read", 0) == 0:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def _resident(path: Path, offset: int, length: int) -> bool:
    """Whether every page of ``path``'s ``[offset, offset+length)`` is in the page cache
    (``mincore`` of a mapping of it: mapping reads nothing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            pages = ctypes.create_string_buffer(-(-length // mmap.PAGESIZE))
            assert libc.mincore(address, length, pages) == 0
            return all(byte & 1 for byte in pages.raw)
        finally:
            libc.munmap(address, length)
    finally:
        os.close(fd)

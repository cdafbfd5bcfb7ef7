"""The node cache shared by processes: one limit for all of them, presence on disk,
temporaries swept only when their writer is dead, entries verified. (A mount server
seeing what a warm staged: ``integration/test_nodecache_mount.py``.)"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bootseer.errors import IntegrityError
from bootseer.nodecache import NodeCache

KIB = 1024

FILL = """
import hashlib, os, sys
from bootseer.nodecache import NodeCache
cache = NodeCache(sys.argv[1], int(sys.argv[2]))
for n in range(int(sys.argv[3])):
    data = os.urandom(64 * 1024)
    cache.put(hashlib.sha256(data).hexdigest(), data)
"""


def _on_disk(directory: Path) -> int:
    return sum(p.stat().st_size for p in (directory / "entries").glob("*/*"))


def test_two_processes_filling_one_cache_stay_under_its_limit(tmp_path: Path) -> None:
    limit = 2048 * KIB
    fillers = [subprocess.Popen([sys.executable, "-c", FILL, str(tmp_path), str(limit), "150"])
               for _ in range(2)]
    for filler in fillers:
        assert filler.wait(120) == 0
    cache = NodeCache(tmp_path, limit)
    assert _on_disk(tmp_path) <= limit  # 300 entries of 64 KiB went in: 19 MiB
    assert cache.usage() == _on_disk(tmp_path)  # the count on disk is the truth
    assert len(list((tmp_path / "entries").glob("*/*"))) >= int(limit * 0.9) // (64 * KIB) - 1


def test_least_recently_used_go_first_and_a_wrong_count_is_mended(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path, 4 * 64 * KIB)
    blobs = [os.urandom(64 * KIB) for _ in range(5)]
    digests = [hashlib.sha256(b).hexdigest() for b in blobs]
    for n, (digest, data) in enumerate(zip(digests[:4], blobs[:4])):
        cache.put(digest, data)
        os.utime(cache.path(digest), (1000 + n, 1000 + n))
    assert cache.get(digests[0]) == blobs[0]  # used now: the newest
    assert cache.usage() == _on_disk(tmp_path) == 4 * 64 * KIB
    cache.put(digests[4], blobs[4])  # over the limit: the oldest go, down to 90%
    assert [d in cache for d in digests] == [True, False, False, True, True]
    assert cache.usage() == _on_disk(tmp_path) == 3 * 64 * KIB
    (tmp_path / "usage").write_text(str(1 << 40))  # as crashes could leave it: too high
    cache.put(hashlib.sha256(b"x").hexdigest(), b"x")  # evicts, and so recounts
    assert cache.usage() == _on_disk(tmp_path) <= int(4 * 64 * KIB * 0.9)
    (tmp_path / "usage").unlink()  # lost: the next add counts what is there
    cache.put(hashlib.sha256(b"y").hexdigest(), b"y")
    assert cache.usage() == _on_disk(tmp_path)


HOLD = """
import sys, time
from bootseer.nodecache import NodeCache
def chunks():
    yield b"first part"
    open(sys.argv[2], "w").close()
    time.sleep(600)
NodeCache(sys.argv[1], 1 << 30).put_stream("0" * 64, chunks())
"""


def test_a_living_writers_temporary_stays_a_dead_ones_goes(tmp_path: Path) -> None:
    cache_dir, started = tmp_path / "cache", tmp_path / "started"
    writer = subprocess.Popen([sys.executable, "-c", HOLD, str(cache_dir), str(started)])
    try:
        deadline = time.monotonic() + 30
        while not started.exists():
            assert time.monotonic() < deadline and writer.poll() is None
            time.sleep(0.05)
        (leftover,) = (cache_dir / "tmp").iterdir()
        assert leftover.name.startswith("0" * 64 + f".{writer.pid}.")
        NodeCache(cache_dir, 1 << 30)  # another process opens the cache: it stays
        assert leftover.exists()
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    NodeCache(cache_dir, 1 << 30)  # the writer is dead: what it left goes
    assert not leftover.exists() and "0" * 64 not in NodeCache(cache_dir, 1 << 30)


def test_entries_are_verified_and_named_only_by_digests(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path, 1 << 30, mode=0o600)
    data = b"block" * 1000
    digest = hashlib.sha256(data).hexdigest()
    with pytest.raises(IntegrityError):
        cache.put_stream(digest, [b"other bytes"])
    cache.put(digest, data)
    assert cache.path(digest).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "entries").stat().st_mode & 0o777 == 0o700
    cache.path(digest).write_bytes(b"damaged")
    assert cache.get(digest) is None and digest not in cache
    assert cache.usage() >= _on_disk(tmp_path) == 0  # never counted low
    for bad in ("../../etc/passwd", "A" * 64, "ab", "sha256:" + digest):
        with pytest.raises(ValueError):
            cache.path(bad)


def test_a_stalled_lock_holder_costs_caching_never_reads(tmp_path: Path, monkeypatch) -> None:
    """A process stopped while it holds the cache's lock: adds give up (CacheBusy) after
    LOCK_TIMEOUT instead of waiting for it, and what is cached still reads."""
    import bootseer.nodecache as nodecache
    from bootseer.nodecache import CacheBusy

    monkeypatch.setattr(nodecache, "LOCK_TIMEOUT", 0.5)
    cache = NodeCache(tmp_path, 1 << 30)
    data = b"cached before"
    cache.put(hashlib.sha256(data).hexdigest(), data)
    holder = subprocess.Popen(["flock", str(tmp_path / "lock"), "sleep", "60"])
    try:
        time.sleep(0.3)
        with pytest.raises(CacheBusy):
            cache.put(hashlib.sha256(b"new").hexdigest(), b"new")
        with pytest.raises(CacheBusy, match="not waiting again"):  # no second wait
            cache.put(hashlib.sha256(b"next").hexdigest(), b"next")
        assert cache.get(hashlib.sha256(data).hexdigest()) == data
        assert not list((tmp_path / "tmp").iterdir())  # the refused add left nothing
    finally:
        holder.kill()
        holder.wait()


def test_a_batch_goes_in_under_one_lock_in_order_while_it_fits(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """put_many: one lock and one count update for the batch; an entry already there is
    only touched; what does not fit is refused (CacheFull) after the rest went in, and no
    temporary is left."""
    from bootseer.nodecache import CacheFull

    cache = NodeCache(tmp_path, 4 * 64 * KIB)
    blobs = [os.urandom(64 * KIB) for _ in range(6)]
    digests = [hashlib.sha256(b).hexdigest() for b in blobs]
    cache.put(digests[0], blobs[0])
    locks = []
    real = NodeCache.locked
    monkeypatch.setattr(NodeCache, "locked", lambda self: locks.append(1) or real(self))
    cache.put_many(list(zip(digests[:3], blobs[:3])))
    assert len(locks) == 1 and all(d in cache for d in digests[:3])
    assert cache.usage() == _on_disk(tmp_path) == 3 * 64 * KIB
    more = [os.urandom(64 * KIB) for _ in range(5)]
    with pytest.raises(CacheFull):  # 5 into a cache of 4: all old ones go, 4 fit
        cache.put_many([(hashlib.sha256(b).hexdigest(), b) for b in more])
    assert [hashlib.sha256(b).hexdigest() in cache for b in more] == [True] * 4 + [False]
    assert cache.usage() == _on_disk(tmp_path) == 4 * 64 * KIB
    assert not list((tmp_path / "tmp").iterdir())


def test_an_add_makes_room_first_and_never_evicts_what_it_keeps(tmp_path: Path) -> None:
    """Room is made before an entry appears (the limit holds at every instant); entries
    the adder keeps are not evicted, and an add that fits only by evicting them is refused
    and leaves nothing."""
    from bootseer.nodecache import CacheFull

    cache = NodeCache(tmp_path, 3 * 64 * KIB)
    blobs = [os.urandom(64 * KIB) for _ in range(5)]
    digests = [hashlib.sha256(b).hexdigest() for b in blobs]

    def add(n: int, keep=()) -> None:
        tmp = cache.new_temporary("t")
        tmp.write_bytes(blobs[n])
        try:
            cache.add_file(tmp, digests[n], keep=keep)
        finally:
            tmp.unlink(missing_ok=True)

    for n in range(3):
        add(n)
        os.utime(cache.path(digests[n]), (1000 + n, 1000 + n))
    add(3, keep=digests[:1])  # the oldest is kept: the next oldest go
    assert [d in cache for d in digests[:4]] == [True, False, False, True]
    add(4, keep=digests[:1])
    with pytest.raises(CacheFull):
        add(1, keep=[digests[0], digests[3], digests[4]])
    assert digests[1] not in cache and cache.usage() == _on_disk(tmp_path) <= 3 * 64 * KIB
    assert not list((tmp_path / "tmp").iterdir())
    with pytest.raises(CacheFull):  # larger than the whole cache
        cache.put(hashlib.sha256(b"x" * (4 * 64 * KIB)).hexdigest(), b"x" * (4 * 64 * KIB))


def _tree(cache: NodeCache, key: str, size: int) -> None:
    tmp = cache.new_temporary(key)
    (tmp / "tree" / "d").mkdir(parents=True)
    (tmp / "tree" / "d" / "f").write_bytes(b"f" * size)
    cache.add_tree(tmp, key, size)


def test_a_tree_entry_is_counted_evicted_unless_in_use_and_never_half_there(
        tmp_path: Path) -> None:
    """A directory entry (an unpacked snapshot) counts the bytes its builder says, is found
    with :meth:`NodeCache.tree`, survives eviction while ``in_use`` says it is read, and
    goes like a file otherwise; a dead builder's half-built tree is swept, never found."""
    reading: set[Path] = set()
    cache = NodeCache(tmp_path, 3 * 64 * KIB, in_use=lambda path: path in reading)
    tree_key, other = "a" * 64, "b" * 64
    _tree(cache, tree_key, 64 * KIB)
    found = cache.tree(tree_key)
    assert found is not None and (found / "d" / "f").stat().st_size == 64 * KIB
    assert cache.usage() == 64 * KIB
    os.utime(cache.path(tree_key), (1000, 1000))  # the least recently used
    reading.add(cache.path(tree_key))
    data = os.urandom(2 * 64 * KIB)
    from bootseer.nodecache import CacheFull

    with pytest.raises(CacheFull):  # room only by evicting the tree being read
        cache.put(hashlib.sha256(data + b"!").hexdigest(), data + b"!")
    assert cache.tree(tree_key) is not None
    os.utime(cache.path(tree_key), (1000, 1000))
    reading.clear()
    cache.put(hashlib.sha256(data + b"?").hexdigest(), data + b"?")
    assert cache.tree(tree_key) is None and cache.usage() == 2 * 64 * KIB + 1
    assert not list((tmp_path / "tmp").iterdir())  # removed by way of a temporary
    _tree(cache, other, 1)
    cache.drop(other)
    assert cache.tree(other) is None and cache.usage() == 2 * 64 * KIB + 1
    dead = tmp_path / "tmp" / f"{tree_key}.999999999.0000"  # no such pid
    (dead / "tree").mkdir(parents=True)
    NodeCache(tmp_path, 3 * 64 * KIB)
    assert not dead.exists() and cache.tree(tree_key) is None


def _dirty_kib() -> int:
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) for line in meminfo if line.startswith("Dirty:"))


def test_an_added_entry_is_already_being_written_back() -> None:
    """Its pages leave the dirty set as it is added, so that nothing that later syncs the
    file system (an overlay's unmount) waits for them. A plain write of the same size
    beside it, on the same disk, stays dirty: the measure works here."""
    data = os.urandom(64 << 20)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as directory:
        os.sync()
        before = _dirty_kib()
        Path(directory, "plain").write_bytes(data)
        assert _dirty_kib() - before > 32 << 10  # KiB
        os.sync()
        before = _dirty_kib()
        NodeCache(Path(directory, "cache"), 1 << 30).put(hashlib.sha256(data).hexdigest(), data)
        assert _dirty_kib() - before < 16 << 10

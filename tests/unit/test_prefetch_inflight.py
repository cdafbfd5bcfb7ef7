"""The in-flight table on its own, with real threads: one fetch per block, every waiter
gets its outcome, failures can be retried, and nothing stays behind."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from bootseer.prefetch.inflight import InFlight


def waiters(table: InFlight, digest: str, n: int) -> tuple[list[threading.Thread], list]:
    """``n`` threads that join the fetch of ``digest`` and note what they get."""
    outcomes: list = []
    joined = threading.Barrier(n + 1)

    def wait() -> None:
        fetch = table.join(digest)
        joined.wait()
        try:
            outcomes.append(fetch.future.result(timeout=10))
        except Exception as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=wait) for _ in range(n)]
    for t in threads:
        t.start()
    joined.wait()  # every waiter has the fetch before it is settled
    return threads, outcomes


def test_waiters_wake_with_the_bytes_and_the_entry_is_gone() -> None:
    table = InFlight()
    assert table.claim("a") is not None
    assert table.claim("a") is None  # one fetcher per block
    threads, outcomes = waiters(table, "a", 8)
    table.complete("a", b"block a")
    for t in threads:
        t.join()
    assert outcomes == [b"block a"] * 8
    assert len(table) == 0 and table.join("a") is None


def test_a_failure_reaches_every_waiter_and_the_block_can_be_claimed_again() -> None:
    table = InFlight()
    first = table.claim("a")
    threads, outcomes = waiters(table, "a", 5)
    error = OSError("the store went away")
    table.fail("a", error)
    for t in threads:
        t.join()
    assert outcomes == [error] * 5
    with pytest.raises(OSError):
        first.future.result()
    assert len(table) == 0
    retry = table.claim("a")  # the retry
    assert retry is not None and retry is not first
    table.complete("a", b"at last")
    assert retry.future.result() == b"at last" and len(table) == 0


def test_local_blocks_are_not_claimed_and_prefetch_claims_say_so() -> None:
    local = {"cached"}
    table = InFlight(lambda digest: digest in local)
    assert table.claim("cached") is None
    fetch = table.claim("b", prefetch=True)
    assert table.join("b") is fetch and fetch.prefetch
    assert not table.claim("c").prefetch
    table.complete("b", b"")
    table.complete("c", b"")


def test_a_claim_is_settled_once_by_its_claimant() -> None:
    table = InFlight()
    with pytest.raises(KeyError, match="not claimed"):
        table.complete("never", b"")
    table.claim("a")
    table.fail("a", OSError())
    with pytest.raises(KeyError):
        table.fail("a", OSError())


def test_wait_returns_when_the_fetches_end_or_the_time_is_up() -> None:
    table = InFlight()
    table.claim("a")
    table.claim("b")
    assert table.wait(["a", "elsewhere"], timeout=0.05) is False
    timer = threading.Timer(0.05, lambda: (table.complete("a", b""), table.fail("b", OSError())))
    timer.start()
    assert table.wait(["a", "b", "elsewhere"], timeout=10) is True
    timer.join()
    assert table.wait([]) is True


def test_many_readers_fetch_each_block_once_and_leave_nothing_behind() -> None:
    """Readers look in their cache, join or claim, the way LazyImage does; a fetcher keeps
    the block before settling. Every block is fetched once unless its fetch failed, every
    read gets bytes or the failure, and the table ends empty."""
    local: dict[str, bytes] = {}
    table = InFlight(lambda digest: digest in local)
    fetches: dict[str, int] = {}
    count_lock = threading.Lock()
    digests = [f"d{n}" for n in range(200)]
    doomed = set(random.Random(3).sample(digests, 20))  # their first fetch fails

    def read(digest: str) -> bytes | Exception:
        while True:
            if digest in local:
                return local[digest]
            fetch = table.join(digest)
            if fetch is None:
                fetch = table.claim(digest)
                if fetch is None:
                    continue  # it became local, or another reader claimed it: look again
                with count_lock:
                    fetches[digest] = fetches.get(digest, 0) + 1
                    first = fetches[digest] == 1
                if digest in doomed and first:
                    table.fail(digest, OSError(f"{digest} failed"))
                else:
                    local[digest] = digest.encode()
                    table.complete(digest, digest.encode())
            try:
                return fetch.future.result(timeout=10)
            except OSError as exc:
                return exc

    work = [d for d in digests for _ in range(6)]
    random.Random(4).shuffle(work)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(read, work))
    assert len(table) == 0
    for digest, result in zip(work, results):
        assert result == digest.encode() or (digest in doomed and isinstance(result, OSError))
    assert all(fetches[d] == 1 for d in digests if d not in doomed)
    assert all(fetches[d] in (1, 2) for d in doomed)  # 2: a reader came after the failure

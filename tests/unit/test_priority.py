"""The agent's fetch priorities: demand reads > containers starting > warm requests."""

from __future__ import annotations

import threading
import time

import pytest
from support.images import recorded_big_image

from bootseer.agents.priority import Priority, PriorityGate
from bootseer.agents.warm import WarmRequest, warm
from bootseer.config import Config
from bootseer.nodecache import NodeCache
from bootseer.store import BlobStore
from bootseer.store.local import LocalStore


def _waiter(gate: PriorityGate, priority: Priority) -> tuple[threading.Thread, threading.Event]:
    """A thread waiting for ``priority``'s turn; the event is set when it gets it."""
    got = threading.Event()
    thread = threading.Thread(target=lambda: gate.wait_turn(priority) and got.set(), daemon=True)
    thread.start()
    return thread, got


def test_warm_waits_while_a_start_is_held_and_goes_when_it_ends() -> None:
    gate = PriorityGate()
    with gate.hold(Priority.STARTING):
        thread, got = _waiter(gate, Priority.WARM)
        assert not got.wait(0.2)
        assert gate.wait_turn(Priority.STARTING, timeout=0)  # equal priority never waits
        assert gate.busy() == {Priority.DEMAND: 0, Priority.STARTING: 1, Priority.WARM: 0}
    assert got.wait(5)
    thread.join(5)
    assert gate.busy()[Priority.STARTING] == 0


def test_demand_blocks_starting_and_warm_but_nothing_blocks_demand() -> None:
    gate = PriorityGate()
    with gate.hold(Priority.DEMAND):
        starting, got_starting = _waiter(gate, Priority.STARTING)
        warming, got_warm = _waiter(gate, Priority.WARM)
        assert gate.wait_turn(Priority.DEMAND, timeout=0)
        assert not got_starting.wait(0.2) and not got_warm.is_set()
    assert got_starting.wait(5) and got_warm.wait(5)
    with gate.hold(Priority.WARM):  # lower priorities never hold up higher ones
        assert gate.wait_turn(Priority.DEMAND, timeout=0)
        assert gate.wait_turn(Priority.STARTING, timeout=0)


def test_nested_and_overlapping_holds_are_counted() -> None:
    gate = PriorityGate()
    outer = gate.hold(Priority.STARTING)
    outer.__enter__()
    with gate.hold(Priority.STARTING):
        with gate.hold(Priority.DEMAND):
            assert gate.busy()[Priority.STARTING] == 2
        assert not gate.wait_turn(Priority.WARM, timeout=0.05)
    assert not gate.wait_turn(Priority.WARM, timeout=0.05)  # the outer hold still counts
    outer.__exit__(None, None, None)
    assert gate.wait_turn(Priority.WARM, timeout=0)


def test_wait_turn_times_out_and_a_failing_holder_still_releases() -> None:
    gate = PriorityGate()
    with gate.hold(Priority.DEMAND):
        started = time.monotonic()
        assert gate.wait_turn(Priority.WARM, timeout=0.2) is False
        assert 0.15 <= time.monotonic() - started < 2
    with pytest.raises(RuntimeError), gate.hold(Priority.STARTING):
        raise RuntimeError("the start failed")
    assert gate.busy()[Priority.STARTING] == 0
    assert gate.wait_turn(Priority.WARM, timeout=0)


class CountingStore(LocalStore):
    """Counts every ranged read, however it is asked for."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reads = 0

    def _read_range(self, key: str, offset: int, length: int) -> bytes:
        self.reads += 1
        return super()._read_range(key, offset, length)

    def read_range_into(self, key: str, offset: int, buffer: memoryview, *,
                        progress=None) -> None:
        self.reads += 1
        super().read_range_into(key, offset, buffer, progress=progress)


def test_warm_fetches_nothing_while_a_container_starts(dirs) -> None:
    recorded_big_image(dirs)
    store = CountingStore(str(dirs["store"]))
    store.put("ckpt/model.pt", b"weights" * 100_000)
    config = Config(store=store.url, cache_dir=dirs["cache"])
    gate = PriorityGate()
    request = WarmRequest("big", "train", checkpoints=(f"{store.url}/ckpt",))
    done: list = []
    with gate.hold(Priority.STARTING):
        thread = threading.Thread(target=lambda: done.append(warm(
            BlobStore(store), config, request,
            image_cache=NodeCache(dirs["cache"] / "blocks", 1 << 30),
            before_fetch=lambda: gate.wait_turn(Priority.WARM))), daemon=True)
        thread.start()
        time.sleep(0.5)
        assert store.reads == 0 and thread.is_alive() and not done
    thread.join(30)
    summary = done[0]
    assert summary.complete and store.reads > 0
    assert summary.image.fetched == 3
    assert summary.checkpoints[0].fetched == 1

"""The read-ahead window on its own: grows on sequential reads, resets on seeks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bootseer.stripedfs.config import MIB, StripeConfig
from bootseer.stripedfs.window import ReadWindow

CFG = StripeConfig(stripe_size=MIB, initial_read_window=2 * MIB, max_read_window=32 * MIB)


def test_grows_while_sequential_up_to_the_cap() -> None:
    window = ReadWindow(CFG)
    sizes = [window.advance(i * 128 * 1024, 128 * 1024) for i in range(10)]
    assert sizes[:5] == [2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB]
    assert set(sizes[5:]) == {32 * MIB}
    assert (window.sequential_reads, window.seeks) == (9, 0)


def test_resets_on_a_seek_and_counts_it() -> None:
    window = ReadWindow(CFG)
    for i in range(4):
        window.advance(i * MIB, MIB)
    assert window.advance(500 * MIB, MIB) == CFG.initial_read_window
    assert window.seeks == 1
    assert window.advance(501 * MIB, MIB) == 2 * CFG.initial_read_window


def test_small_jumps_count_as_sequential() -> None:
    window = ReadWindow(CFG)
    window.advance(0, MIB)
    window.advance(MIB + 4096, MIB)  # a small skip forward
    window.advance(2 * MIB - 128 * 1024, 128 * 1024)  # a late, out-of-order request
    assert window.seeks == 0
    assert window.next_offset == 2 * MIB + 4096


@given(st.lists(st.tuples(st.integers(0, 1 << 34), st.integers(1, 1 << 24)), min_size=1))
def test_window_always_within_bounds(reads: list[tuple[int, int]]) -> None:
    window = ReadWindow(CFG)
    for offset, length in reads:
        size = window.advance(offset, length)
        assert CFG.initial_read_window <= size <= CFG.max_read_window
    assert window.sequential_reads + window.seeks == len(reads) - 1

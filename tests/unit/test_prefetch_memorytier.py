"""The memory tier on its own: both parts stay within their bounds, a read takes a
prefetched block over, and prefetched blocks never push out the ones being read."""

from __future__ import annotations

from bootseer.prefetch.memorytier import MemoryTier


def test_recent_blocks_keep_the_most_recently_used() -> None:
    tier = MemoryTier(recent_blocks=3, prefetch_bytes=0)
    for name in "abc":
        tier.put_read(name, name.encode())
    assert tier.get("a") == b"a"  # now the most recent
    tier.put_read("d", b"d")
    assert "b" not in tier and [n for n in "acd" if n in tier] == ["a", "c", "d"]
    assert tier.get("b") is None


def test_prefetched_blocks_are_bounded_by_bytes_oldest_out() -> None:
    tier = MemoryTier(recent_blocks=2, prefetch_bytes=10)
    for name in "abc":
        tier.put_prefetched(name, name.encode() * 4)  # 4 bytes each: c pushes a out
    assert "a" not in tier and "b" in tier and "c" in tier
    tier.put_prefetched("huge", b"x" * 11)  # larger than the budget: not kept at all
    assert "huge" not in tier and "b" in tier


def test_a_read_moves_a_prefetched_block_to_recent() -> None:
    tier = MemoryTier(recent_blocks=2, prefetch_bytes=8)
    tier.put_prefetched("p", b"pppp")
    assert tier.get("p") == b"pppp"
    tier.put_prefetched("q", b"qqqq")
    tier.put_prefetched("r", b"rrrr")  # the budget holds q and r: p left it when read
    assert all(n in tier for n in "pqr")
    tier.put_read("s", b"s")
    tier.put_read("t", b"t")  # recent holds two: p goes
    assert "p" not in tier and "q" in tier


def test_prefetched_blocks_never_push_out_the_ones_being_read() -> None:
    tier = MemoryTier(recent_blocks=2, prefetch_bytes=100)
    tier.put_read("r1", b"1")
    tier.put_read("r2", b"2")
    for n in range(20):
        tier.put_prefetched(f"p{n}", b"p")
    assert tier.get("r1") == b"1" and tier.get("r2") == b"2"


def test_no_budget_keeps_nothing() -> None:
    tier = MemoryTier(recent_blocks=0, prefetch_bytes=0)
    tier.put_read("a", b"a")
    tier.put_prefetched("b", b"b")
    assert "a" not in tier and "b" not in tier

"""The swarm's rules with known answers (:mod:`bootseer.p2p.policy`): no network, no root,
no libtorrent, every time given."""

from __future__ import annotations

import itertools

import pytest

from bootseer.p2p.peer import Peer
from bootseer.p2p.policy import (
    CONNECT_WAIT,
    MAX_HASHERS,
    Absence,
    DemandPiece,
    FetchPolicy,
    Source,
    Tick,
    View,
    demand_source,
    hash_deadline,
    hashers,
    owned,
    owner,
    owner_index,
)

A, B, C, D, E = (Peer(f"10.0.0.{i}", 7000) for i in range(1, 6))
GRACE = 2.0


# -- the owner rule --------------------------------------------------------------------------

@pytest.mark.parametrize(("piece", "members", "gone", "expected"), [
    # member k of N owns p % N == k
    (0, [A, B, C, D], (), A), (1, [A, B, C, D], (), B), (6, [A, B, C, D], (), C),
    (7, [A, B, C, D], (), D),
    # one member owns everything, gone or not (its heirs are itself)
    (0, [A], (), A), (5, [A], (), A),
    # B gone: its pieces 1, 5, 9 dealt out again among A, C, D; the others stay put
    (1, [A, B, C, D], {B}, C), (5, [A, B, C, D], {B}, D), (9, [A, B, C, D], {B}, A),
    (2, [A, B, C, D], {B}, C), (4, [A, B, C, D], {B}, A),
    # two gone: their pieces among the two left
    (1, [A, B, C, D], {B, D}, C), (3, [A, B, C, D], {B, D}, C), (7, [A, B, C, D], {B, D}, C),
    (5, [A, B, C, D], {B, D}, C), (2, [A, B, C, D], {B, D}, C), (0, [A, B, C, D], {B, D}, A),
])
def test_the_owner_of_a_piece(piece: int, members: list[Peer], gone: set[Peer],
                              expected: Peer) -> None:
    assert owner(piece, members, gone) == expected


def test_a_gone_owners_piece_goes_to_the_heirs_given() -> None:
    """A demand read's or a hasher's heir is the node itself."""
    assert owner(1, [A, B, C], {B}, heirs=(C,)) == C
    assert owner(0, [A, B, C], {B}, heirs=(C,)) == A  # not gone: its owner


@pytest.mark.parametrize(("members", "pieces"), [(1, 5), (3, 10), (4, 4), (5, 3), (7, 0),
                                                 (64, 1000)])
def test_owned_is_the_owner_rule_and_shares_are_a_partition(members: int, pieces: int) -> None:
    shares = [list(owned(k, members, pieces)) for k in range(members)]
    assert sorted(itertools.chain(*shares)) == list(range(pieces))
    for k, share in enumerate(shares):
        assert all(owner_index(p, members) == k for p in share)


def test_more_members_than_pieces_leaves_the_last_members_nothing() -> None:
    assert [owner(p, [A, B, C, D, E]) for p in range(3)] == [A, B, C]
    assert list(owned(3, 5, 3)) == [] and list(owned(4, 5, 3)) == []


def test_every_node_computes_the_same_owners_whatever_order_it_learnt_members_in() -> None:
    answers = set()
    for order in itertools.permutations([D, B, A, C]):
        members = sorted(order)
        answers.add(tuple(owner(p, members, {C}) for p in range(12)))
    assert answers == {(A, B, D, D, A, B, A, D, A, B, B, D)}


# -- a member gone ---------------------------------------------------------------------------

def test_a_member_is_gone_once_missing_for_the_grace_counted_from_first_missed() -> None:
    absence = Absence()
    assert not absence.gone("x", 0.0, GRACE)  # never looked for: not missing
    absence.observe("x", False, 10.0)
    absence.observe("x", False, 11.0)  # still missing: the clock keeps its start
    assert not absence.gone("x", 11.9, GRACE)
    assert absence.gone("x", 12.0, GRACE)
    absence.observe("x", True, 12.5)  # found: forgotten
    assert not absence.gone("x", 100.0, GRACE)
    absence.observe("x", False, 100.0)  # a moment's disconnection moves nothing
    assert not absence.gone("x", 101.0, GRACE)


def test_with_no_grace_every_member_is_gone_at_once() -> None:
    assert Absence().gone("x", 5.0, 0.0)


# -- a whole-blob fetch ----------------------------------------------------------------------

def _tick(now: float, connected: dict[Peer, int], *, gained: tuple[int, int] = (0, 0),
          dialing: tuple[Peer, ...] = (), banned: tuple[Peer, ...] = (),
          ready: bool = True, in_session: tuple[Peer, ...] = ()) -> Tick:
    return Tick(now, ready, {p.address: n for p, n in connected.items()},
                {p.address for p in dialing}, {p.address for p in banned}, gained,
                {p.address for p in in_session})


def _shares(policies: dict[Peer, FetchPolicy], views: dict[Peer, View], pieces: int,
            available: list[int] | None = None) -> dict[Peer, list[int]]:
    available = available or [0] * pieces
    return {me: policies[me].store_share(views[me], [False] * pieces, set(), available)
            for me in views}


def test_the_members_of_a_fetch_read_each_piece_from_the_store_once() -> None:
    members, pieces = [A, B, C], 10
    policies = {me: FetchPolicy(members, me, 0.0, GRACE, pieces) for me in members}
    views = {}
    for me, policy in policies.items():
        everyone = {m: 0 for m in members if m != me}
        assert policy.look(_tick(0.1, everyone)) is None  # not settled: one tick only
        views[me] = policy.look(_tick(0.2, everyone))
        assert views[me] == View((me, *[m for m in members if m != me]), False)
    shares = _shares(policies, views, pieces)
    assert shares == {A: [0, 3, 6, 9], B: [1, 4, 7], C: [2, 5, 8]}


def test_a_piece_a_connected_peer_has_is_not_read_from_the_store() -> None:
    policy = FetchPolicy([A, B], A, 0.0, GRACE, 4)
    view = View((A, B), False)
    assert policy.store_share(view, [False] * 4, set(), [1, 0, 0, 0]) == [2]
    assert policy.store_share(view, [False, False, True, False], {0}, [0] * 4) == []


def test_a_fetch_claims_what_it_has_room_for_and_not_what_a_peer_gained_meanwhile() -> None:
    policy = FetchPolicy([A, B], A, 0.0, GRACE, 8)
    view = View((A, B), False)
    assert policy.store_share(view, [False] * 8, set(), [0] * 8, room=2) == [0, 2]
    # B got piece 4 meanwhile: A's next two are 6 alone
    assert policy.store_share(view, [False] * 8, {0, 2}, [0, 0, 0, 0, 1, 0, 0, 0],
                              room=2) == [6]
    stalled = View((A, B), True)
    assert policy.store_share(stalled, [True] + [False] * 7, {1}, [1] * 8, room=3) == [2, 3, 4]


def test_own_pieces_come_first_and_a_gone_members_from_its_highest() -> None:
    """B is gone: A reads its own (0, 2, 4, 6) lowest first, then B's (7, 5, 3, 1) highest
    first, so that B, back late and reading its own lowest first, meets A once."""
    policy = FetchPolicy([A, B], A, 0.0, GRACE, 8)
    assert policy.store_share(View((A,), False), [False] * 8, set(), [0] * 8) == \
        [0, 2, 4, 6, 7, 5, 3, 1]


def test_one_member_reads_everything_and_zero_pieces_read_nothing() -> None:
    alone = FetchPolicy([A], A, 0.0, GRACE, 3)
    view = alone.look(_tick(0.0, {}))  # every member (none other) connected
    assert view == View((A,), False)
    assert alone.store_share(view, [False] * 3, set(), [0] * 3) == [0, 1, 2]
    empty = FetchPolicy([A, B], A, 0.0, GRACE, 0)
    assert empty.store_share(View((A, B), False), [], set(), []) == []


def test_a_fetch_settles_after_connect_wait_when_no_handshake_is_under_way() -> None:
    policy = FetchPolicy([A, B, C], A, 0.0, GRACE, 6)
    assert policy.look(_tick(CONNECT_WAIT - 0.01, {B: 0})) is None
    assert policy.look(_tick(CONNECT_WAIT, {B: 0}, dialing=(C,))) is None  # C dialing
    assert policy.look(_tick(CONNECT_WAIT + 0.1, {B: 0})) == View((A, B, C), False)


def test_a_fetch_not_ready_does_not_settle_and_settles_at_the_grace_anyway() -> None:
    policy = FetchPolicy([A, B], A, 0.0, GRACE, 6)
    assert policy.look(_tick(1.0, {}, dialing=(B,), ready=False)) is None
    assert policy.look(_tick(1.5, {}, dialing=(B,))) is None
    assert policy.look(_tick(GRACE, {}, dialing=(B,))) == View((A,), False)


def test_a_member_that_never_comes_costs_its_share_once_re_split_among_those_there() -> None:
    """D never connects: after piece_grace its pieces (3, 7) go to A and B (dealt out
    among A, B, C), and every piece is still read once."""
    members, pieces = [A, B, C, D], 8
    policies = {me: FetchPolicy(members, me, 0.0, GRACE, pieces) for me in (A, B, C)}
    views = {}
    for me, policy in policies.items():
        def here(pieces: int, me: Peer = me) -> dict[Peer, int]:
            return {m: pieces for m in (A, B, C) if m != me}  # gaining pieces

        first = policy.look(_tick(CONNECT_WAIT, here(0)))
        assert first is not None and D in first.alive  # not missing long enough yet
        assert policy.look(_tick(GRACE - 0.1, here(1), gained=(1, 1))) is None
        views[me] = policy.look(_tick(GRACE, here(2), gained=(2, 2)))
        assert views[me] is not None and D not in views[me].alive
    shares = _shares(policies, views, pieces)
    assert shares == {A: [0, 4, 3], B: [1, 5, 7], C: [2, 6]}
    assert sorted(itertools.chain(*shares.values())) == list(range(pieces))


LATE = 10.0


def test_a_member_up_on_another_object_is_late_not_gone_until_late_wait() -> None:
    """C is connected to A for another of the job's objects but has not opened this one:
    its share (2, 5) waits for it, and A is not stalled once it has all the rest, until
    late_wait has passed."""
    policy = FetchPolicy([A, B, C], A, 0.0, GRACE, 6, late_wait=LATE)
    policy.look(_tick(0.0, {B: 0}, in_session=(B, C)))
    view = policy.look(_tick(CONNECT_WAIT, {B: 0}, in_session=(B, C)))
    assert view == View((A, B, C), False)
    assert policy.store_share(view, [False] * 6, set(), [0] * 6) == [0, 3]
    # A has its own and B's; nothing more comes, for longer than the grace: still waiting
    assert policy.look(_tick(1.0, {B: 6}, gained=(4, 4), in_session=(B, C))) is None
    assert policy.look(_tick(LATE - 0.1, {B: 6}, gained=(4, 4), in_session=(B, C))) is None
    # late_wait over: A, which gained nothing for longer than the grace, stalls and
    # reads C's share; C is missing from then, gone a grace later
    view = policy.look(_tick(LATE, {B: 6}, gained=(4, 4), in_session=(B, C)))
    assert view == View((A, B, C), True)
    have = [True, True, False, True, True, False]
    assert policy.store_share(view, have, {0, 3}, [0] * 6) == [2, 5]
    assert policy.look(_tick(LATE + GRACE, {B: 6}, gained=(4, 4), in_session=(B, C))) == \
        View((A, B), True)


def test_a_late_member_that_comes_is_timed_like_any_other_and_one_not_up_is_not_waited_for(
) -> None:
    policy = FetchPolicy([A, B, C], A, 0.0, GRACE, 6, late_wait=LATE)
    policy.look(_tick(0.0, {B: 0}, in_session=(B, C)))
    policy.look(_tick(CONNECT_WAIT, {B: 0}, in_session=(B, C)))
    # C arrives at 5.0 and gains nothing for a grace: slow, hence gone
    assert policy.look(_tick(5.0, {B: 1, C: 0}, gained=(1, 1), in_session=(B, C))) is None
    view = policy.look(_tick(5.0 + GRACE, {B: 2, C: 0}, gained=(2, 2), in_session=(B, C)))
    assert view == View((A, B), False)
    # not connected for anything: gone after the grace, as without late_wait
    absent = FetchPolicy([A, B, C], A, 0.0, GRACE, 6, late_wait=LATE)
    absent.look(_tick(0.0, {B: 0}, in_session=(B,)))
    assert absent.look(_tick(CONNECT_WAIT, {B: 0}, in_session=(B,))) == View((A, B, C), False)
    assert absent.look(_tick(GRACE, {B: 1}, gained=(1, 1), in_session=(B,))) == \
        View((A, B), False)


def test_a_member_that_leaves_mid_fetch_is_gone_a_grace_after_it_was_first_missed() -> None:
    """C (done: it never gains) disconnects at 1.0; B keeps gaining."""
    policy = FetchPolicy([A, B, C], A, 0.0, GRACE, 9)
    assert policy.look(_tick(0.0, {B: 0, C: 9})) is None
    assert policy.look(_tick(0.1, {B: 1, C: 9}, gained=(1, 1))) == View((A, B, C), False)
    assert policy.look(_tick(1.0, {B: 2}, gained=(2, 2))) is None  # C missed from 1.0
    assert policy.look(_tick(2.9, {B: 3}, gained=(3, 3))) is None
    view = policy.look(_tick(3.0, {B: 4}, gained=(4, 4)))
    assert view == View((A, B), False)
    # C's 2 and 8 go to A (after its own, highest first), its 5 to B
    assert policy.store_share(view, [False] * 9, set(), [0] * 9) == [0, 3, 6, 8, 2]


def test_a_slow_owner_that_gains_no_piece_for_the_grace_is_gone_unless_it_is_done() -> None:
    policy = FetchPolicy([A, B, C], A, 0.0, GRACE, 4)
    policy.look(_tick(0.0, {B: 0, C: 0}))
    assert policy.look(_tick(0.1, {B: 1, C: 4}, gained=(1, 1))) == View((A, B, C), False)
    assert policy.look(_tick(2.0, {B: 1, C: 4}, gained=(2, 2))) is None
    assert policy.look(_tick(2.1, {B: 1, C: 4}, gained=(3, 3))) == View((A, C), False)


def test_a_banned_member_is_gone_at_once() -> None:
    policy = FetchPolicy([A, B, C], A, 0.0, GRACE, 6)
    policy.look(_tick(0.0, {B: 0, C: 0}))
    assert policy.look(_tick(0.1, {B: 0, C: 0}, banned=(B,))) == View((A, C), False)


def test_a_fetch_that_gains_nothing_for_the_grace_reads_all_it_misses_from_the_store() -> None:
    policy = FetchPolicy([A, B], A, 0.0, GRACE, 6)
    policy.look(_tick(0.0, {B: 6}))
    assert policy.look(_tick(0.1, {B: 6})) == View((A, B), False)  # B is done
    assert policy.look(_tick(2.0, {B: 6})) is None
    stalled = policy.look(_tick(2.1, {B: 6}))
    assert stalled == View((A, B), True)
    assert policy.store_share(stalled, [True, False, False, False, True, False], {2},
                              [1] * 6) == [1, 3, 5]


# -- a demand read ---------------------------------------------------------------------------

def _source(piece: int, members: list[Peer], *, now: float, connected: tuple[Peer, ...] = (),
            available: bool = False, asked_at: float | None = None, began: float = 0.0,
            absence: Absence | None = None, me: Peer = A, wait: float = 0.5) -> Source:
    return demand_source(DemandPiece(piece, available, asked_at), members, me,
                         connected={p.address for p in connected},
                         absence=absence if absence is not None else Absence(), now=now,
                         began=began, wait=wait, grace=GRACE)


@pytest.mark.parametrize(("case", "expected"), [
    # this node's piece: the store at once
    ({"piece": 0, "now": 0.0, "connected": (B,)}, Source.STORE),
    # a connected peer has it: ask for it
    ({"piece": 1, "now": 0.0, "connected": (B,), "available": True}, Source.PEERS),
    # asked of peers: wait for them, up to ``wait``, then the store
    ({"piece": 1, "now": 0.4, "connected": (B,), "asked_at": 0.0}, Source.WAIT),
    ({"piece": 1, "now": 0.5, "connected": (B,), "asked_at": 0.0}, Source.STORE),
    # its owner is connected: it reads it; slow past ``wait``, the store
    ({"piece": 1, "now": 0.4, "connected": (B,)}, Source.WAIT),
    ({"piece": 1, "now": 0.5, "connected": (B,)}, Source.STORE),
    # its owner is not connected (starting?): wait for it
    ({"piece": 1, "now": 1.0}, Source.WAIT),
    # one member (this node): everything from the store
    ({"piece": 1, "now": 0.0, "members": [A]}, Source.STORE),
])
def test_where_a_demand_read_gets_a_piece(case: dict, expected: Source) -> None:
    members = case.pop("members", [A, B])
    assert _source(members=members, **case) == expected


def test_a_demand_reads_absent_owner_leaves_its_piece_to_the_reader_after_the_grace() -> None:
    """The absence counts across reads: a later read finds the owner gone already."""
    absence = Absence()
    assert _source(1, [A, B, C], now=5.0, absence=absence, began=5.0) == Source.WAIT
    assert _source(1, [A, B, C], now=6.9, absence=absence, began=5.0) == Source.WAIT
    assert _source(4, [A, B, C], now=7.0, absence=absence, began=7.0) == Source.STORE
    assert _source(2, [A, B, C], now=7.0, absence=absence, began=7.0,
                   connected=(C,)) == Source.WAIT  # C is there
    # B comes back: forgotten, its pieces are its own again
    assert _source(1, [A, B, C], now=8.0, absence=absence, began=8.0,
                   connected=(B,)) == Source.WAIT
    assert _source(1, [A, B, C], now=8.1, absence=absence, began=8.1) == Source.WAIT


def test_a_reader_that_takes_no_share_waits_for_the_members_that_have_the_object() -> None:
    """``share`` False: the members are those that staged it, not this node."""
    absence = Absence()
    assert _source(0, [B, C], now=0.0, connected=(B, C), absence=absence) == Source.WAIT
    assert _source(1, [B, C], now=0.0, absence=absence) == Source.WAIT
    assert _source(1, [B, C], now=GRACE, absence=absence) == Source.STORE


# -- hashing a shared file -------------------------------------------------------------------

@pytest.mark.parametrize(("members", "pieces", "expected"), [
    (1, 10, 1), (4, 16, 4), (4, 2, 2), (4096, 16, 16), (4096, 10_000, MAX_HASHERS),
    (4, 0, 0)])
def test_how_many_members_hash_a_file(members: int, pieces: int, expected: int) -> None:
    assert hashers(members, pieces) == expected


def test_lost_shares_are_read_after_twice_the_own_read_and_the_grace() -> None:
    assert hash_deadline(10.0, 13.0, GRACE) == 13.0 + 6.0 + GRACE
    assert hash_deadline(10.0, 10.0, GRACE) == 10.0 + GRACE

"""Who reads which piece from the store: the rules of a job's swarm, apart from libtorrent.

Pure: no libtorrent, no I/O, no clock (every time is passed in, monotonic seconds), so
that every rule has known answers in unit tests (``tests/unit/test_p2p_policy.py``) and
every node of a job, given the same member list, computes the same owners.

**The owner rule** (:func:`owner_index`, :func:`owner`): the members of a transfer, sorted
the same way on every node (:meth:`bootseer.p2p.swarm.Swarm.members`), deal out its
pieces: member ``k`` of ``N`` owns the pieces ``p % N == k`` and is the one that reads
them from the store; the others get them from it through the swarm. A whole-blob fetch
(:class:`FetchPolicy`), a demand read (:func:`demand_source`) and the hashing of a shared
file's pieces (:func:`owned`, :mod:`bootseer.p2p.sharedfile`) all use this one rule.

**A member gone** (:class:`Absence`): a member is gone once it has been *missing* for
``piece_grace`` seconds, counted from the first time it was looked for and not found
(not connected; a hasher's record not published), and cleared whenever it is found. This
is the semantics demand reads had: they look at a member only while a read waits for its
piece, so "missing since first missed" is the only clock that does not turn a member
seen long ago, then missing for a moment, into one gone at once. A fetch looked at
"last seen" every TICK, which differs from "first missed" by at most one TICK (0.1 s
against a ``piece_grace`` of seconds): one semantics for both keeps what the tests hold
(a killed node costs about ``piece_grace``, a moment's disconnection moves nobody's share).

A gone member's pieces go to its **heirs**: in a whole-blob fetch every member still
there wants every piece, so the gone members' pieces are dealt out again among them
(sorted), and a dead node costs its share once, not once per node. A demand read and a
hasher's share are wanted only by the nodes reading them now, and none of them can count
on another to read a given piece: their heir is the node itself (it reads the piece from
the store), as before. On top of that, a fetch counts a member gone that is banned or
has gained no piece for ``piece_grace`` (it fetches the whole blob, so it must progress;
a demand read's peers progress only as their own reads ask), and a fetch that gained
nothing for ``piece_grace`` reads all it still misses from the store (:attr:`View.stalled`).

**A member late, not gone**: a member that has not opened this fetch's torrent yet but
is connected to this node for another of the job's objects (``Tick.in_session``) is up
and on its way: a job's nodes reach each object at different times (10 s apart among 16
lab nodes sharing 2 cores; a second or two with a CPU budget each). Its share waits for
it for ``late_wait`` seconds from the fetch's start, and the fetch does not count itself
stalled meanwhile; then it is missing, and gone a ``piece_grace`` later, like any other.
Without that wait, the early members read a late one's share after ``piece_grace`` and
the late one read some of it again.

**Claims as reads free up** (:meth:`FetchPolicy.store_share`'s ``room``): a fetch claims
from its share only as many pieces as it can read at once, and picks the next ones when
those are done, so that a piece a peer has meanwhile comes from that peer. It reads its
own pieces first, lowest first, and a gone member's last, highest first: a member that
was only late reads its own from the lowest, and it and its heirs meet once. Claiming the
whole share at once queued pieces behind the store reads, where they stayed claimed after
a peer had them: four nodes of a LAN, one starting after the grace, 1 MiB pieces read from
the store in 0.3 s, took 1.25x the blob from the store in every run, 1.06-1.19x so (a
member still connecting cannot see what its peers hold; the lab's 16 nodes on 2 cores
showed no difference).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from .peer import Peer

#: How long a fetch waits for its members to connect before it picks its store reads:
#: a late node must first learn that peers already have its share.
CONNECT_WAIT = 0.5
#: Most members that hash a shared file (:mod:`bootseer.p2p.sharedfile`), hence hash
#: records one file has: a job's hundredth node would add a record and a store listing
#: for 1% of the file.
MAX_HASHERS = 64


def owner_index(piece: int, members: int) -> int:
    """The position, among ``members`` sorted members, of the one that owns ``piece``."""
    return piece % members


def owned(k: int, members: int, pieces: int) -> range:
    """The pieces (of ``pieces``) that member ``k`` of ``members`` owns (:func:`owner_index`)."""
    return range(k, pieces, members)


def owner(piece: int, members: Sequence[Peer], gone: Collection[Peer] = (),
          heirs: Sequence[Peer] | None = None) -> Peer:
    """The member that reads ``piece`` from the store: ``members[p % N]``; if that one is
    ``gone``, ``heirs[p % len(heirs)]`` (by default the members not gone, sorted)."""
    first = members[owner_index(piece, len(members))]
    if first not in gone:
        return first
    if heirs is None:
        heirs = sorted(m for m in members if m not in gone)
    return heirs[owner_index(piece, len(heirs))]


@dataclass
class Absence:
    """When each member (by address) was first missed; forgotten once it is found."""

    since: dict[str, float] = field(default_factory=dict)

    def observe(self, address: str, present: bool, now: float) -> None:
        if present:
            self.since.pop(address, None)
        else:
            self.since.setdefault(address, now)

    def gone(self, address: str, now: float, grace: float) -> bool:
        """Missing for ``grace`` seconds (a member never looked for is not missing; with
        a ``grace`` of 0 every member is gone)."""
        return now - self.since.get(address, now) >= grace


# -- a whole-blob fetch ----------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """What a fetch sees of its torrent at one look (the engine's state, as plain data)."""

    now: float
    ready: bool  # the torrent is checked and downloading (or done)
    connected: Mapping[str, int]  # peers past their handshake: address → pieces it has
    dialing: Collection[str]  # addresses still handshaking
    banned: Collection[str]  # addresses banned for bad data
    gained: tuple[int, int]  # this node's (pieces, payload bytes): grows while it gains
    #: Addresses connected to this node for any of its transfers (a member up, if not on
    #: this torrent yet).
    in_session: Collection[str] = frozenset()


@dataclass(frozen=True)
class View:
    """Who reads what: the members still there (this node first), and whether the fetch
    stalled (then this node reads everything it misses)."""

    alive: tuple[Peer, ...]
    stalled: bool


class FetchPolicy:
    """The store reads of one node's whole-blob fetch (see the module docstring).

    The split is picked once the fetch has *settled*: every member connected for a tick
    (so their piece lists arrived), or CONNECT_WAIT passed with no member's handshake
    under way, or ``piece_grace`` passed. From then on :meth:`look` returns a new
    :class:`View` whenever the members still there or the stall change; the pieces this
    node then reads are :meth:`store_share`.
    """

    def __init__(self, members: Sequence[Peer], me: Peer, began: float, grace: float,
                 pieces: int, late_wait: float = 0.0) -> None:
        self.members = list(members)
        self.me = me
        self.began = began
        self.grace = grace
        self.pieces = pieces
        self.late_wait = late_wait
        self.others = [m for m in members if m != me]
        self.absence = Absence({m.address: began for m in self.others})
        #: Per member that has been connected on this torrent: its piece count and when
        #: it last grew (from when it was first connected).
        self.progress: dict[str, tuple[int, float]] = {}
        self._late: frozenset[str] = frozenset()  # up, not on this torrent yet, waited for
        self.settled_at: float | None = None
        self._before: Collection[str] = {}  # connected at the previous look
        self._mark, self._gained_at = (-1, -1), began
        self._view: View | None = None

    @property
    def view(self) -> View | None:
        """Who reads what as of the last look; None until the fetch settled."""
        return self._view

    def look(self, tick: Tick) -> View | None:
        """Take in one look; the new view if who reads what changed, else None."""
        now = tick.now
        if tick.gained != self._mark:
            self._mark, self._gained_at = tick.gained, now
        waiting = now - self.began < self.late_wait
        self._late = frozenset(
            m.address for m in self.others
            if waiting and m.address not in self.progress and m.address in tick.in_session)
        for m in self.others:
            count = tick.connected.get(m.address)
            self.absence.observe(m.address, count is not None or m.address in self._late, now)
            if count is not None and count > self.progress.get(m.address, (-1, now))[0]:
                self.progress[m.address] = (count, now)
        if self.settled_at is None and tick.ready and self._settled(tick):
            self.settled_at = now
        self._before = tick.connected
        if self.settled_at is None:
            return None
        view = View(self.alive(now, tick.banned),
                    not self._late and now - max(self._gained_at, self.settled_at) >= self.grace)
        if view == self._view:
            return None
        self._view = view
        return view

    def _settled(self, tick: Tick) -> bool:
        waited = tick.now - self.began
        return (all(m.address in tick.connected and m.address in self._before
                    for m in self.others)
                or (waited >= CONNECT_WAIT
                    and not any(m.address in tick.dialing for m in self.others))
                or waited >= self.grace)

    def alive(self, now: float, banned: Collection[str]) -> tuple[Peer, ...]:
        """This node and the members not gone: connected within ``piece_grace`` (or late,
        waited for), not banned, and done or gaining pieces within ``piece_grace`` once
        connected."""
        return tuple([self.me] + [
            m for m in self.others
            if not self.absence.gone(m.address, now, self.grace)
            and m.address not in banned
            and self._progressing(m.address, now)])

    def _progressing(self, address: str, now: float) -> bool:
        if address not in self.progress:
            return True  # never connected: its absence decides
        count, grew_at = self.progress[address]
        return count == self.pieces or now - grew_at < self.grace

    def store_share(self, view: View, have: Sequence[bool], claimed: Collection[int],
                    available: Sequence[int], room: int | None = None) -> list[int]:
        """The pieces this node now reads from the store, the first ``room`` of them (all,
        if None): every one it misses (and has not claimed already) after a stall; else
        those no connected peer has (``available``: how many do, per piece) that it owns,
        the gone members' shares dealt out again among those still there."""
        missing = [p for p, had in enumerate(have) if not had and p not in claimed]
        if view.stalled:
            return missing[:room]
        gone = set(self.members) - set(view.alive)
        mine = [p for p in missing
                if not available[p] and owner(p, self.members, gone) == self.me]
        # Its own pieces first, from the lowest; a gone member's from the highest, so
        # that if it comes back (a late start) and reads its share from the lowest,
        # the two meet once, not piece by piece.
        own = [p for p in mine if owner(p, self.members) == self.me]
        inherited = [p for p in reversed(mine) if owner(p, self.members) != self.me]
        return (own + inherited)[:room]


# -- a demand read ---------------------------------------------------------------------------


class Source(enum.Enum):
    """Where a demand read gets a piece it misses, as of now."""

    WAIT = "wait"  # its owner reads it from the store (or a peer sends it): wait
    PEERS = "peers"  # a connected peer has it: ask for it at once
    STORE = "store"  # read it from the store here


@dataclass(frozen=True)
class DemandPiece:
    """What a demand read knows of one piece it misses."""

    piece: int
    available: bool  # a connected peer has it
    asked_at: float | None  # when it was asked of peers, if it was


def demand_source(state: DemandPiece, members: Sequence[Peer], me: Peer, *,
                  connected: Collection[str], absence: Absence, now: float, began: float,
                  wait: float, grace: float) -> Source:
    """Where a waiting read (begun at ``began``) gets ``state.piece`` now: one asked of
    peers comes from the store once they have been slow for ``wait``; one a connected
    peer has is asked of it; else its owner (:func:`owner`) reads it from the store. The
    owner's absence is noted in ``absence`` (so it counts across reads); an owner gone
    leaves the piece to this node, and a connected owner that has not sent it within
    ``wait`` of the read's start is slow: the store, too."""
    first = members[owner_index(state.piece, len(members))]
    if first.address in connected or first != me:
        absence.observe(first.address, first.address in connected, now)
    if state.asked_at is not None:
        return Source.STORE if now - state.asked_at >= wait else Source.WAIT
    if state.available:
        return Source.PEERS
    gone = (first,) if absence.gone(first.address, now, grace) else ()
    reader = owner(state.piece, members, gone, heirs=(me,))
    if reader == me or (reader.address in connected and now - began >= wait):
        return Source.STORE
    return Source.WAIT


# -- hashing a shared file together ----------------------------------------------------------


def hashers(members: int, pieces: int) -> int:
    """How many of a file's members hash it (the first ones): at most MAX_HASHERS, and
    no more than it has pieces, so that no share is empty."""
    return min(members, MAX_HASHERS, pieces)


def hash_deadline(began: float, now: float, grace: float) -> float:
    """When the shares still missing are taken for lost, for a node that began waiting
    (or hashing) at ``began`` and looks at ``now`` (its own share read, or the last share
    that came): twice what this node took, and ``piece_grace``."""
    return now + 2 * (now - began) + grace

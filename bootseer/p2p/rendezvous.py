"""Finding a job's peers with no new infrastructure: a record per node in the store.

Each node of a job announces where its peer session listens, one small object per node,
rewritten on every start (a restarted node may listen on another port)::

    p2p/jobs/<job>/peers/<node>.json      {"node": ..., "address": ..., "port": ..., "time": ...,
                                           "wants": [<interest>, ...], "auth": <tag>}

and reads every other node's (:func:`roster`; :func:`gather` waits until as many as the
scheduler said would start have announced). ``wants`` names what this node fetches that
not every node of the job does (:func:`interest` of each checkpoint URL: a data-parallel
group's shards), so that such an object is shared among the nodes that want it only. A
scheduler that knows the job's nodes can pass their addresses instead
(:func:`bootseer.p2p.peer.parse_peers`); either way the result is a sorted list of
:class:`~bootseer.p2p.peer.Peer`, and the swarm splits store reads by position in it.

The records are hostile input (anyone who can write the store can write one): at most
MAX_MEMBERS are read, each refused above MAX_RECORD_BYTES before it is read, parsed as
bounded JSON with exactly the fields above, its address an IP literal on ``p2p.networks``
(:class:`~bootseer.p2p.trust.Networks`) and its port in range, and its ``auth`` the
cluster key's tag of all of it and the job it is filed under (:mod:`bootseer.p2p.trust`);
a record that fails is skipped with a warning. So only a node's agent names a member,
and only where the operator's networks are.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import logging
import posixpath
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from bootseer.boundedjson import loads
from bootseer.errors import BootseerError
from bootseer.store import Store

from .peer import Peer
from .trust import Trust

log = logging.getLogger(__name__)

PREFIX = "p2p/jobs"
#: A record is under a hundred bytes; anything much larger is not one.
MAX_RECORD_BYTES = 32 << 10
#: Interests one record may name (checkpoint URLs of one warm).
MAX_WANTS = 256
#: Peers read for one job: more than any job's node count, few enough to dial.
MAX_MEMBERS = 4096
#: A job's name, as ``io.bootseer.job`` and ``bootseer report --job`` take it.
JOB = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}")
#: A node's name (``agent.node_name``).
NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_FIELDS = {"node", "address", "port", "time", "wants", "auth"}
_HEX = re.compile(r"[0-9a-f]{64}")
#: Longest :func:`gather` waits for the members a scheduler said would start: the nodes
#: of a restart warm within seconds of each other; one that does not come costs the
#: others this long once, then they go on without it.
GATHER_WAIT = 15.0
GATHER_POLL = 0.2  # the first wait between listings; it doubles up to GATHER_POLL_MAX
GATHER_POLL_MAX = 2.0


@dataclass(frozen=True, order=True)
class Member:
    """A node of the job as its record says: where it listens, what it wants."""

    peer: Peer
    wants: frozenset[str] = frozenset()


def interest(url: str) -> str:
    """The name a record gives an object some nodes of a job fetch: sha256 of its URL."""
    return hashlib.sha256(url.encode()).hexdigest()


def wanting(roster: list[Member], url: str) -> list[Peer]:
    """The members that want ``url``, sorted (the swarm splits by position)."""
    name = interest(url)
    return [m.peer for m in roster if name in m.wants]


def wanting_within(roster: list[Member], url: str) -> list[Peer]:
    """The members that want ``url`` or a directory holding it (a warm names a checkpoint
    directory; a demand read, one of its files), sorted."""
    names, parent = set(), url.rstrip("/")
    while "/" in parent and not parent.endswith(":/"):
        names.add(interest(parent))
        names.add(interest(parent + "/"))
        parent = parent.rsplit("/", 1)[0]
    return [m.peer for m in roster if names & m.wants]


def _name(value: str, what: str, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value) or ".." in value:
        raise BootseerError(f"{what} {value!r} must match {pattern.pattern}")
    return value


def peers_dir(job: str) -> str:
    """The job's peer records: its name quoted (HDFS names cannot hold ``:``)."""
    return posixpath.join(PREFIX, quote(_name(job, "job", JOB), safe="._-"), "peers")


def announce(store: Store, trust: Trust, job: str, node: str, peer: Peer,
             wants: Iterable[str] = ()) -> str:
    """Publish (or replace) this node's record for ``job``, wanting the URLs ``wants``,
    tagged with the cluster's key; returns its key."""
    key = posixpath.join(peers_dir(job), _name(node, "node", NODE) + ".json")
    names = sorted({interest(url) for url in wants})
    if len(names) > MAX_WANTS:
        raise BootseerError(f"a node may want at most {MAX_WANTS} objects of a job")
    record = {"node": node, "address": peer.address, "port": peer.port, "time": time.time(),
              "wants": names}
    record["auth"] = _tag(trust, job, record).hex()
    store.put(key, json.dumps(record).encode())
    return key


def withdraw(store: Store, job: str, node: str) -> None:
    """Remove this node's record (it stops seeding; a missing record is fine)."""
    try:
        store.delete(posixpath.join(peers_dir(job), _name(node, "node", NODE) + ".json"))
    except FileNotFoundError:
        pass


def members(store: Store, trust: Trust, job: str) -> list[Peer]:
    """Every valid peer record of ``job``, as sorted peers (one per address)."""
    return [m.peer for m in roster(store, trust, job)]


def roster(store: Store, trust: Trust, job: str) -> list[Member]:
    """Every valid record of ``job`` (authenticated, on the networks), sorted by peer
    (one per address)."""
    prefix = peers_dir(job) + "/"
    found: dict[str, Member] = {}
    for count, info in enumerate(store.list(prefix)):
        if count >= MAX_MEMBERS:
            log.warning("job %s: over %d peer records; reading the first only", job,
                        MAX_MEMBERS)
            break
        try:
            member = _parse(info.key[len(prefix):], store.get(info.key, MAX_RECORD_BYTES),
                            job, trust)
        except (BootseerError, ValueError) as exc:  # SizeLimitError, JSON, a forgery
            log.warning("job %s: skipping peer record %s: %s", job, info.key, exc)
            continue
        except FileNotFoundError:  # withdrawn while we listed
            continue
        found.setdefault(member.peer.address, member)
    return sorted(found.values())


def gather(store: Store, trust: Trust, job: str, expected: int | None,
           timeout: float = GATHER_WAIT, poll: float = GATHER_POLL) -> list[Member]:
    """The job's members once ``expected`` of them have announced (or ``timeout``
    passed: then those there, with a warning); with ``expected`` None, those there now.

    The swarm splits the store reads by position in this list, so every node must read
    the same one: a node that reads before the last has announced sees fewer members,
    and its share differs from theirs (costing extra store reads, not correctness). A
    scheduler that says how many nodes start lets every node wait for all of them.
    While waiting, a node only lists the records (one metadata call, less often as it
    waits longer: a thousand nodes polling must not load the store); it reads them once.
    """
    deadline = time.monotonic() + timeout
    prefix = peers_dir(job) + "/"
    while expected is not None:
        listed = sum(1 for _ in itertools.islice(store.list(prefix), expected))
        if listed >= expected:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            log.warning("job %s: %d of %d peers announced within %.0f s; going on with "
                        "those", job, listed, expected, timeout)
            break
        time.sleep(min(poll, left))
        poll = min(poll * 2, GATHER_POLL_MAX)
    return roster(store, trust, job)


def _tag(trust: Trust, job: str, record: dict[str, Any]) -> bytes:
    """The key's tag of a record and the job it is filed under."""
    return trust.key.tag("peer-record", job, record["node"], record["address"],
                         record["port"], repr(float(record["time"])),
                         ",".join(record["wants"]))


def _parse(name: str, data: bytes, job: str, trust: Trust) -> Member:
    record: Any = loads(data, limit=MAX_RECORD_BYTES, what="a peer record")
    if not isinstance(record, dict) or set(record) != _FIELDS:
        raise ValueError(f"fields must be exactly {sorted(_FIELDS)}")
    wants = record["wants"]
    if not isinstance(wants, list) or len(wants) > MAX_WANTS or \
            not all(isinstance(w, str) and _HEX.fullmatch(w) for w in wants):
        raise ValueError(f"wants must be at most {MAX_WANTS} sha256 hex names")
    if name != _name(record["node"], "node", NODE) + ".json":
        raise ValueError(f"names node {record['node']!r} but is filed as {name!r}")
    if not isinstance(record["address"], str) or \
            not isinstance(record["time"], (int, float)) or isinstance(record["time"], bool):
        raise ValueError("address must be a string and time a number")
    peer = Peer.of(record["address"], record["port"])
    auth = record["auth"]
    if not isinstance(auth, str) or not _HEX.fullmatch(auth) or \
            not hmac.compare_digest(bytes.fromhex(auth), _tag(trust, job, record)):
        raise ValueError("not authenticated by the cluster's peer key (p2p.key_file)")
    if not trust.networks.allows(peer.address):
        raise ValueError(f"{peer.address} is not on p2p.networks")
    return Member(peer, frozenset(wants))

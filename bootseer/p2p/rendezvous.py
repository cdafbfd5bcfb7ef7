"""Finding a job's peers with no new infrastructure: a record per node in the store.

Each node of a job announces where its peer session listens, one small object per node,
rewritten on every start (a restarted node may listen on another port)::

    p2p/jobs/<job>/peers/<node>.json      {"node": ..., "address": ..., "port": ..., "time": ...}

and reads every other node's (:func:`members`; :func:`gather` waits until as many as the
scheduler said would start have announced). A scheduler that knows the job's nodes
can pass their addresses instead (:func:`bootseer.p2p.peer.parse_peers`); either way the
result is a sorted list of :class:`~bootseer.p2p.peer.Peer`, and the swarm splits store
reads by position in it.

The records are hostile input (anyone who can write the store can write one): at most
MAX_MEMBERS are read, each refused above MAX_RECORD_BYTES before it is read, parsed as
JSON with exactly the fields above, its address an IP literal and its port in range;
a record that fails is skipped with a warning. A peer learned this way can at worst
waste time: everything it sends is checked against the store's torrent.
"""

from __future__ import annotations

import itertools
import json
import logging
import posixpath
import re
import time
from typing import Any
from urllib.parse import quote

from bootseer.errors import BootseerError
from bootseer.store import Store

from .peer import Peer

log = logging.getLogger(__name__)

PREFIX = "p2p/jobs"
#: A record is under a hundred bytes; anything much larger is not one.
MAX_RECORD_BYTES = 1024
#: Peers read for one job: more than any job's node count, few enough to dial.
MAX_MEMBERS = 4096
#: A job's name, as ``io.bootseer.job`` and ``bootseer report --job`` take it.
JOB = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}")
#: A node's name (``agent.node_name``).
NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_FIELDS = {"node", "address", "port", "time"}
#: Longest :func:`gather` waits for the members a scheduler said would start: the nodes
#: of a restart warm within seconds of each other; one that does not come costs the
#: others this long once, then they go on without it.
GATHER_WAIT = 15.0
GATHER_POLL = 0.2  # the first wait between listings; it doubles up to GATHER_POLL_MAX
GATHER_POLL_MAX = 2.0


def _name(value: str, what: str, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value) or ".." in value:
        raise BootseerError(f"{what} {value!r} must match {pattern.pattern}")
    return value


def peers_dir(job: str) -> str:
    """The job's peer records: its name quoted (HDFS names cannot hold ``:``)."""
    return posixpath.join(PREFIX, quote(_name(job, "job", JOB), safe="._-"), "peers")


def announce(store: Store, job: str, node: str, peer: Peer) -> str:
    """Publish (or replace) this node's record for ``job``; returns its key."""
    key = posixpath.join(peers_dir(job), _name(node, "node", NODE) + ".json")
    record = {"node": node, "address": peer.address, "port": peer.port, "time": time.time()}
    store.put(key, json.dumps(record).encode())
    return key


def withdraw(store: Store, job: str, node: str) -> None:
    """Remove this node's record (it stops seeding; a missing record is fine)."""
    try:
        store.delete(posixpath.join(peers_dir(job), _name(node, "node", NODE) + ".json"))
    except FileNotFoundError:
        pass


def members(store: Store, job: str) -> list[Peer]:
    """Every valid peer record of ``job``, as sorted peers (one per address)."""
    prefix = peers_dir(job) + "/"
    found: dict[str, Peer] = {}
    for count, info in enumerate(store.list(prefix)):
        if count >= MAX_MEMBERS:
            log.warning("job %s: over %d peer records; reading the first only", job,
                        MAX_MEMBERS)
            break
        try:
            peer = _parse(info.key[len(prefix):], store.get(info.key, MAX_RECORD_BYTES))
        except (BootseerError, ValueError, RecursionError) as exc:  # SizeLimitError, JSON
            log.warning("job %s: skipping peer record %s: %s", job, info.key, exc)
            continue
        except FileNotFoundError:  # withdrawn while we listed
            continue
        found.setdefault(peer.address, peer)
    return sorted(found.values())


def gather(store: Store, job: str, expected: int | None, timeout: float = GATHER_WAIT,
           poll: float = GATHER_POLL) -> list[Peer]:
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
    return members(store, job)


def _parse(name: str, data: bytes) -> Peer:
    record: Any = json.loads(data)
    if not isinstance(record, dict) or set(record) != _FIELDS:
        raise ValueError(f"fields must be exactly {sorted(_FIELDS)}")
    if name != _name(record["node"], "node", NODE) + ".json":
        raise ValueError(f"names node {record['node']!r} but is filed as {name!r}")
    if not isinstance(record["address"], str) or \
            not isinstance(record["time"], (int, float)) or isinstance(record["time"], bool):
        raise ValueError("address must be a string and time a number")
    return Peer.of(record["address"], record["port"])

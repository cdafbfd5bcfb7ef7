"""The fields of the agent API's bodies, checked: every value is hostile until it passes.

Bodies come from the socket's group, and, through the runtime shim and the OCI hook, from
a container's annotations and its image's ``ENV``. Values end up in command lines of root
processes, in store keys, in SQLite and in file names, so each is checked here, once, for
type and shape, before anything is done: a name never starts with ``-`` (an option to the
server it is passed to), holds no ``/`` where it becomes one path component, and is
short. A body with a field of the wrong type, or a field the API does not know, is
refused (``ValueError``: the agent's 400) rather than coerced.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bootseer.p2p.peer import Peer

#: Container ids as Docker, podman, containerd and runc spell them.
CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
#: A lazy image's name (``images/<name>`` in the store) or its id (``sha256:<hex>``).
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,255}")
#: One path component: a workload (``hot/<image>/<workload>``), a checkpoint mount's name.
COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
#: A job's name (``bootseer report --job``).
JOB = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}")
#: Who asked: "bootseer-runtime", "bootseer-hook", "runc", ...
RUNTIME = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")
#: An environment snapshot's key (``env/<key>``).
SNAPSHOT_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

#: A Kubernetes pod, ``NAMESPACE/NAME``: a DNS label (RFC 1123) and a DNS subdomain.
POD = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")

MAX_URL = 4096
MAX_PEER = 64  # "[IPv6]:port" is at most 47 characters
MAX_ITEMS = 64  # checkpoints of a mount, snapshots or checkpoints of a warm


def only(body: Any, known: set[str], what: str) -> Mapping[str, Any]:
    """``body`` if it is a JSON object with no field outside ``known``."""
    if not isinstance(body, dict):
        raise ValueError(f"a {what} is a JSON object")
    unknown = set(body) - known
    if unknown:
        raise ValueError(f"unknown field(s) in a {what}: {', '.join(sorted(map(str, unknown)))}"
                         f" (known: {', '.join(sorted(known))})")
    return body


def name(value: Any, field: str, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value) or ".." in value:
        raise ValueError(f"{field!r} must match {pattern.pattern} (got {_show(value)})")
    return value


def optional_name(value: Any, field: str, pattern: re.Pattern[str]) -> str | None:
    return None if value is None else name(value, field, pattern)


def url(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_URL or \
            any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError(f"{field!r} must be a URL of at most {MAX_URL} printable "
                         f"characters (got {_show(value)})")
    return value


def names(value: Any, field: str, pattern: re.Pattern[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise ValueError(f"{field!r} must be a list of at most {MAX_ITEMS} items")
    return tuple(name(v, field, pattern) for v in value)


def urls(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise ValueError(f"{field!r} must be a list of at most {MAX_ITEMS} URLs")
    return tuple(url(v, field) for v in value)


def optional_count(value: Any, field: str, most: int) -> int | None:
    """None, or a whole number in 1..``most``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ValueError(f"{field!r} must be a whole number in 1..{most} (got {_show(value)})")
    return value


def peers(value: Any, field: str, most: int) -> tuple[Peer, ...]:
    """A list of at most ``most`` peer addresses (``"IP:PORT"``, IPv6 in brackets; IP
    literals only, never names to resolve), sorted, each once."""
    # Here, not at the top: the OCI hook imports this module on every container create,
    # and bootseer.p2p brings the store's modules along.
    from bootseer.p2p.peer import Peer

    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > most or \
            not all(isinstance(v, str) and len(v) <= MAX_PEER for v in value):
        raise ValueError(f"{field!r} must be a list of at most {most} \"ADDRESS:PORT\" "
                         f"strings")
    return tuple(sorted({Peer.parse(v) for v in value}))  # PeerAddressError: a ValueError


def boolean(value: Any, field: str, default: bool = False) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{field!r} must be true or false (got {_show(value)})")
    return value


def time_value(value: Any, field: str) -> float:
    """A Unix time: a finite, non-negative number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or value < 0:
        raise ValueError(f"{field!r} must be a Unix time (got {_show(value)})")
    return float(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

"""The snapshot manifest: every captured path with its metadata and digest, and the shards.

A snapshot is what one command changed under its target directories: new and modified
entries (with their full metadata and content) and deleted paths. Its manifest is one blob
(zstd-compressed JSON, format :data:`FORMAT`); the ref ``env/<key>`` names it. The entries
are columns, one list per field of :class:`SnapEntry` (a manifest is decoded on every cold
restore's path, and tens of thousands of objects with a key per field took twice as long
to parse and build: 0.066 s against 0.027 for the jupyter preset's 20,650 entries);
format 1's list of objects is still read (:data:`FORMAT_V1`).

An entry's path is relative to its target (``"."`` is the target itself); ``target``
indexes :attr:`Manifest.targets`, the absolute directories the snapshot was captured
under. Files and symlinks name the shard (a tar stream) that carries them; directories
and hard links are metadata only. A hard link names its group's first file (``link``, same target).

Manifests are hostile input once they are in a shared store, so :meth:`Manifest.decode`
refuses, before anything is written: a path that is absolute, holds ``..``, ``.`` or
empty components, or NUL; a path below a symlink or a file of the same snapshot; a hard
link to anything but a file of the same target; unknown types, shards or formats.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import zstandard

from bootseer import boundedjson
from bootseer.errors import BootseerError, IntegrityError
from bootseer.limits import decompress

FORMAT = "bootseer-snapshot/2"
#: The format before entries became columns: still restored, never written.
FORMAT_V1 = "bootseer-snapshot/1"
REF_PREFIX = "env/"
KINDS = ("file", "dir", "symlink", "hardlink")
#: The largest decompressed manifest this format allows (checked before decompressing):
#: the 1.5 GB, 36,800-entry bench environment has a 1.9 MB manifest.
MAX_MANIFEST_BYTES = 1 << 30
#: How many shards a snapshot's reference names in its ``first_shards`` metadata: the first
#: ones in :meth:`Manifest.read_order`, which a restore opens before it decodes the manifest.
FIRST_SHARDS = 8
_CONTENT_KINDS = ("file", "symlink")  # carried by a shard; hard links are made on restore


class UnsafeSnapshotError(BootseerError):
    """A snapshot holds an entry that would write outside its targets; nothing was applied."""


class SnapEntry(NamedTuple):
    """One captured path. A named tuple rather than a frozen dataclass: a manifest holds
    tens of thousands, and decoding one is on every cold restore's path; the jupyter
    preset's 20,650 entries are made in 0.06 s, against 0.13 s as frozen dataclasses
    (fresh processes, medians of 4)."""

    target: int  # index into Manifest.targets
    path: str  # relative to the target, "." for the target itself
    kind: str  # one of KINDS
    mode: int  # permission bits only
    uid: int
    gid: int
    mtime_ns: int
    size: int = 0  # content bytes of files and hard links
    digest: str | None = None  # sha256:<hex> of the content of files and hard links
    link: str | None = None  # symlink: target verbatim; hard link: its group's file path
    shard: int | None = None  # which shard carries it (files and symlinks)

    @property
    def member(self) -> str:
        """The entry's name in the shard tar: ``<target>/<path>``."""
        return f"{self.target}/{self.path}" if self.path != "." else str(self.target)


@dataclass(frozen=True)
class Deletion:
    target: int
    path: str


@dataclass(frozen=True)
class Shard:
    digest: str  # blob of the zstd-compressed tar stream
    size: int  # compressed bytes
    input_bytes: int  # content bytes it carries


@dataclass(frozen=True)
class Manifest:
    key: str
    targets: tuple[str, ...]
    entries: tuple[SnapEntry, ...]  # tree order per target: a directory before its contents
    deleted: tuple[Deletion, ...]
    shards: tuple[Shard, ...]
    created: dict[str, Any] = field(default_factory=dict)  # time, host, argv, key inputs

    @property
    def content_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind == "file")

    def read_order(self) -> list[int]:
        """The shards' numbers in the order a restore reads them: largest first, since one
        huge file (a 400 MB shared library) is a shard of its own, and started last it
        would finish long after all the others."""
        return sorted(range(len(self.shards)), key=lambda n: -self.shards[n].input_bytes)

    def encode(self) -> bytes:
        body = {"format": FORMAT, "key": self.key, "targets": list(self.targets),
                "created": self.created, "shards": [asdict(s) for s in self.shards],
                "deleted": [[d.target, d.path] for d in self.deleted],
                "entries": {name: [e[i] for e in self.entries]
                            for i, name in enumerate(SnapEntry._fields)}}
        return zstandard.ZstdCompressor(level=10).compress(json.dumps(body).encode())

    @classmethod
    def decode(cls, data: bytes, origin: str) -> Manifest:
        try:
            what = f"snapshot manifest {origin}"
            body = boundedjson.loads(decompress(data, MAX_MANIFEST_BYTES, what),
                                     limit=MAX_MANIFEST_BYTES, what=what)
        except ValueError as exc:
            raise IntegrityError(f"snapshot manifest {origin} is unreadable: {exc}") from exc
        fmt = body.get("format") if isinstance(body, dict) else None
        if fmt not in (FORMAT, FORMAT_V1):
            raise BootseerError(f"snapshot manifest {origin} has format {fmt!r}; this "
                                f"Bootseer reads {FORMAT} and {FORMAT_V1}")
        try:
            entries = (_entries_of_columns(body["entries"]) if fmt == FORMAT
                       else tuple(SnapEntry(**e) for e in body["entries"]))
            manifest = cls(
                key=str(body["key"]), targets=tuple(str(t) for t in body["targets"]),
                entries=entries,
                deleted=tuple(Deletion(int(t), str(p)) for t, p in body["deleted"]),
                shards=tuple(Shard(**s) for s in body["shards"]),
                created=dict(body.get("created") or {}))
            manifest.check(origin)
        except (KeyError, TypeError, ValueError) as exc:  # a field of the wrong type, say
            raise IntegrityError(f"snapshot manifest {origin} is malformed: {exc}") from exc
        return manifest

    def check(self, origin: str) -> None:
        """Refuse anything that could write outside the targets (see the module doc).

        Each rule is checked over all entries at once (sets, comprehensions, substring
        searches in the joined paths), and only a rule that fails looks for the entry to
        name: entry by entry, the jupyter preset's 20,650 entries took 0.11 s, now 0.04."""
        def bad(why: str) -> UnsafeSnapshotError:
            return UnsafeSnapshotError(f"snapshot {origin}: {why}; nothing was restored")

        def first(failing: Callable[[SnapEntry], bool]) -> SnapEntry:
            return next(e for e in entries if failing(e))

        for t in self.targets:
            if not t.startswith("/") or check_relpath(t.lstrip("/") or ".") != t.lstrip("/"):
                raise bad(f"target {t!r} is not a normalised absolute path")
        entries = self.entries
        targets, shards = range(len(self.targets)), range(len(self.shards))
        if not _ints_in([e.target for e in entries], targets):
            raise bad(f"entry {first(lambda e: not _ints_in([e.target], targets)).path!r} "
                      f"names no target")
        if not {e.kind for e in entries} <= set(KINDS):
            e = first(lambda e: e.kind not in KINDS)
            raise bad(f"entry {e.path!r} has unknown type {e.kind!r}")
        paths = [e.path for e in entries]
        if not _all_relpaths(paths):
            for path in paths:
                try:
                    check_relpath(path)
                except ValueError as exc:
                    raise bad(str(exc)) from None
        if not _ints_in([e.shard for e in entries if e.kind in _CONTENT_KINDS], shards):
            e = first(lambda e: e.kind in _CONTENT_KINDS and not _ints_in([e.shard], shards))
            raise bad(f"entry {e.path!r} names no shard")
        if any(not e.link for e in entries if e.kind == "symlink"):
            raise bad(f"symlink {first(lambda e: e.kind == 'symlink' and not e.link).path!r} "
                      f"has no target")
        if any(e.kind != "dir" for e in entries if e.path == "."):
            e = first(lambda e: e.path == "." and e.kind != "dir")
            raise bad(f"target {self.targets[e.target]} is captured as a {e.kind}")
        kinds = {(e.target, e.path): e for e in entries}
        if len(kinds) != len(entries):
            seen: set[tuple[int, str]] = set()
            for e in entries:
                if (e.target, e.path) in seen:
                    raise bad(f"entry {e.path!r} appears twice")
                seen.add((e.target, e.path))
        # Nothing may lie below a file, symlink or hard link: in each target's sorted
        # paths, what lies below "p" sorts right after it, before "p0" ("/" < "0").
        for target in targets:
            in_target = sorted(p for t, p in kinds if t == target)
            for p in in_target:
                if p != "." and kinds[(target, p)].kind != "dir":
                    i = bisect.bisect_left(in_target, p + "/")
                    if i < len(in_target) and in_target[i] < p + "0":
                        raise bad(f"entry {in_target[i]!r} lies below the "
                                  f"{kinds[(target, p)].kind} {p!r}")
        for e in entries:
            if e.kind == "hardlink":
                leader = kinds.get((e.target, e.link or ""))
                if leader is None or leader.kind != "file":
                    raise bad(f"hard link {e.path!r} points to {e.link!r}, not a file of the "
                              f"snapshot")
        for d in self.deleted:
            if not _ints_in([d.target], targets):
                raise bad(f"deletion {d.path!r} names no target")
            try:
                check_relpath(d.path)
            except ValueError as exc:
                raise bad(str(exc)) from None
            if d.path == ".":
                raise bad("a deletion names a target itself")


def _entries_of_columns(columns: object) -> tuple[SnapEntry, ...]:
    """Format 2's entries: a list per field of :class:`SnapEntry`, all of one length; a
    field with a default may be left out. What the values are is :meth:`Manifest.check`'s
    to refuse, as for format 1."""
    fields = SnapEntry._fields
    if not isinstance(columns, dict) or not set(columns) <= set(fields):
        raise ValueError("the entries are not columns named after their fields")
    path = columns.get("path")
    count = len(path) if isinstance(path, list) else -1
    lists = []
    for name in fields:
        column = columns.get(name)
        if column is None and name in SnapEntry._field_defaults:
            column = [SnapEntry._field_defaults[name]] * count
        if not isinstance(column, list) or len(column) != count:
            raise ValueError(f"the entries' {name} column is missing or not {count} long")
        lists.append(column)
    return tuple(map(SnapEntry._make, zip(*lists)))


def _ints_in(values: list[object], allowed: range) -> bool:
    """Every value an ``int`` (not a ``bool`` or a ``float``: JSON's ``0.0`` equals ``0``)
    in ``allowed``."""
    return set(map(type, values)) <= {int} and set(values) <= set(allowed)


def _all_relpaths(paths: list[str]) -> bool:
    """Whether every one of ``paths`` is a normalised relative path (or "."), found with
    a few searches in C: joined by "/", they make one path with an empty, "." or ".."
    component, or an absolute one, exactly when one of them is such a path. The one
    rule: :func:`check_relpath` asks it of a single path."""
    if not all(type(p) is str for p in paths):
        return False
    named = [p for p in paths if p != "."]
    joined = "/".join(named)
    return not named or bool(joined) and not (
        "\0" in joined or "//" in joined or "/./" in joined or "/../" in joined
        or joined in (".", "..") or joined.startswith(("/", "./", "../"))
        or joined.endswith(("/", "/.", "/..")))


def check_relpath(path: str) -> str:
    """``path`` if it is a normalised relative path (or "."), else ``ValueError``."""
    if not isinstance(path, str):
        raise ValueError(f"path {path!r} is not a string")
    if path == "." or _all_relpaths([path]):
        return path
    if not path or path.startswith("/") or "\0" in path:
        raise ValueError(f"path {path!r} is absolute, empty or holds NUL")
    raise ValueError(f"path {path!r} holds '..', '.' or an empty component")

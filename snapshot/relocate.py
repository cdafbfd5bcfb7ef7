"""Relocation: restore a snapshot under other directories than it was captured under.

Why this is needed: an installed environment names its own absolute location. pip writes
``#!/old/venv/bin/python`` into every console script, ``venv`` writes the prefix into
``pyvenv.cfg`` (``command =``) and ``bin/activate*`` (``VIRTUAL_ENV=``), and ``.pth``
files, editable finders (``__editable___*_finder.py``), ``*.egg-link``, ``RECORD`` and
``direct_url.json`` may hold absolute paths. Restored byte for byte under ``/new/venv``,
such an environment still runs ``/old/venv/bin/python``, or fails where that is gone.

What is rewritten, and only after a file has been verified against the manifest (the
captured bytes are checked, then changed in the staging directory, before the switch):

* text files with a known name (:func:`is_known_text`) and text scripts (first line
  ``#!``): every occurrence of an old target, as a whole path prefix (``/x/venv`` and
  ``/x/venv/...``, never ``/x/venv2`` nor ``/a/x/venv``), becomes the new target. Distlib's
  ``#!/bin/sh`` + ``'''exec' /old/venv/bin/python`` launcher is covered by the same rule;
* in a script holding NUL bytes (a zipapp behind a shebang) only the shebang line;
* absolute symlink targets inside an old target (a link's text, never a file's content).

Binary files are never changed: a compiled library's RPATH or an embedded path cannot
change length. Those that hold an old target are counted and reported in one warning, as
are other text files holding one (only the known names are edited). Compiled bytecode is
left out of that count: the import system replaces ``co_filename`` with the real source
path when it loads a ``.pyc``. Modes and mtimes of rewritten files are set from the
manifest afterwards, as for every restored file; ``RECORD`` hashes of rewritten scripts
are not updated (pip does not check them).
"""

from __future__ import annotations

import logging
import os
import re
import threading

log = logging.getLogger(__name__)

#: Files larger than this are never rewritten (a RECORD or .pth is far smaller).
MAX_REWRITE = 64 << 20
_KNOWN_NAMES = frozenset({"pyvenv.cfg", "RECORD", "direct_url.json"})
_KNOWN_SUFFIXES = (".pth", ".egg-link")
# Bytes that may continue a file name: a prefix followed or preceded by one is not a match.
_NAME_BYTE = rb"[A-Za-z0-9_.+~@%\-\x80-\xff]"


def is_known_text(rel: str) -> bool:
    """A file venv, pip or setuptools writes absolute paths of the environment into."""
    name = rel.rpartition("/")[2]
    return (name in _KNOWN_NAMES or name.endswith(_KNOWN_SUFFIXES)
            or name.startswith("activate")
            or (name.startswith("__editable__") and name.endswith("_finder.py")))


def prefix_pattern(old: tuple[str, ...]) -> re.Pattern[bytes]:
    """Any of ``old`` as a whole path prefix; the longest wins where several match."""
    choices = b"|".join(re.escape(os.fsencode(p)) for p in sorted(old, key=len, reverse=True))
    return re.compile(rb"(?<!%s)(%s)(?!%s)" % (_NAME_BYTE, choices, _NAME_BYTE))


class Watch:
    """Notes, chunk by chunk as a file is written, what a relocation needs to know of it."""

    def __init__(self, needles: tuple[bytes, ...]) -> None:
        self._needles = needles
        self._tail = b""
        self._keep = max(len(n) for n in needles) - 1
        self.head = b""  # the first bytes
        self.binary = False  # holds a NUL byte
        self.hit = False  # holds an old target, perhaps not as a whole prefix

    def see(self, chunk: bytes | memoryview) -> None:
        chunk = bytes(chunk)
        if not chunk:
            return
        if not self.head:
            self.head = chunk[:2]
        self.binary = self.binary or b"\0" in chunk
        window = self._tail + chunk
        self.hit = self.hit or any(n in window for n in self._needles)
        self._tail = window[-self._keep:] if self._keep else b""


class Relocation:
    """Rewrites the restored entries of a snapshot from its ``old`` to its ``new`` targets."""

    def __init__(self, old: tuple[str, ...], new: tuple[str, ...]) -> None:
        self.old, self.new = old, new
        self._to = {os.fsencode(o): os.fsencode(n) for o, n in zip(old, new)}
        self._pattern = prefix_pattern(old)
        self._needles = tuple(self._to)
        self._lock = threading.Lock()
        self.rewritten = 0
        self.left: dict[str, list[str]] = {"binary": [], "text": []}  # absolute paths

    def replace(self, data: bytes) -> tuple[bytes, int]:
        return self._pattern.subn(lambda m: self._to[m.group(1)], data)

    def link(self, target: str) -> str:
        """A symlink's target, moved when it is an absolute path inside an old target."""
        raw = os.fsencode(target)
        match = self._pattern.match(raw)
        return os.fsdecode(self._to[match.group(1)] + raw[match.end():]) if match else target

    def watch(self) -> Watch:
        return Watch(self._needles)

    def apply(self, path: str, rel: str, where: str, seen: Watch) -> None:
        """Rewrite the verified file ``path`` (``rel`` in its target) as the module says."""
        if not seen.hit:
            return
        script = seen.head == b"#!"
        if (script or is_known_text(rel)) and os.lstat(path).st_size <= MAX_REWRITE:
            with open(path, "rb") as f:
                data = f.read()
            if not seen.binary:
                data, count = self.replace(data)
            elif script:
                line, nl, rest = data.partition(b"\n")
                line, count = self.replace(line)
                data = line + nl + rest
            else:
                count = 0
            if not seen.binary and not count:
                return  # the old path only inside longer names: nothing to do
            if count:
                fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                with self._lock:
                    self.rewritten += 1
                return
        if rel.endswith(".pyc"):
            return
        with self._lock:
            self.left["binary" if seen.binary else "text"].append(where)

    def report(self) -> None:
        """One warning for the files still naming an old target."""
        binary, text = sorted(self.left["binary"]), sorted(self.left["text"])
        if not binary and not text:
            return
        parts = []
        if binary:
            parts.append(f"{len(binary)} binary file(s) (e.g. {binary[0]}), which cannot "
                         f"be rewritten")
        if text:
            parts.append(f"{len(text)} other text file(s) (e.g. {text[0]}), which are not "
                         f"among the files relocation edits")
        log.warning("relocating %s to %s: %s still contain the old path; left as is",
                    ", ".join(self.old), ", ".join(self.new), " and ".join(parts))

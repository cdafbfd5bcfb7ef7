"""JSON from anyone else, parsed within bounds: its size and its nesting, checked first.

Bootseer parses JSON that others wrote: request bodies on the agent's socket, records and
manifests in the store (anyone who can write it), containers' OCI configs. ``json.loads``
bounds neither what it allocates nor how deep it recurses: 100 KB of ``[[[[...`` raise
``RecursionError`` (not a ``ValueError``, so it escapes the handlers that skip bad input
and becomes a traceback or a 500). :func:`loads` refuses, before parsing, data over the
caller's ``limit`` (each format has its own: :mod:`bootseer.limits` and the constants
beside each format) and data nested deeper than ``depth``, with :class:`JSONLimitError`,
a ``ValueError`` too, which every such caller already handles as "not valid".

The nesting is found without parsing, by a scan that runs in C (``bytes`` methods, one
regular expression): escaped backslashes and quotes removed, then everything but quotes
and brackets, then strings; what is left is the brackets outside strings, summed. For
invalid JSON it is an upper bound of what the decoder would reach before failing.
"""

from __future__ import annotations

import json
import os
import re
from itertools import accumulate
from typing import Any, BinaryIO

from bootseer.errors import BootseerError

#: Deepest nesting accepted by default. Real documents nest a few levels: Bootseer's own
#: (start records, manifests, hot lists) and image indexes, manifests and configs at most
#: 5, Docker's runtime configs 7 (``linux.seccomp.syscalls[].args[]``). 32 leaves room for
#: every real one and keeps the decoder, and the code that walks what it returns, far
#: from Python's recursion limit in any thread.
MAX_DEPTH = 32

_QUOTES_AND_BRACKETS = b'"[]{}'
_OTHER_BYTES = bytes(b for b in range(256) if b not in _QUOTES_AND_BRACKETS)
#: A string, once only quotes and brackets are left (to the end, if it is not closed).
_STRING = re.compile(rb'"[^"]*"?')
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


class JSONLimitError(BootseerError, ValueError):
    """JSON refused before parsing: larger or nested deeper than its format allows."""


def loads(data: bytes | str, *, limit: int, what: str, depth: int = MAX_DEPTH) -> Any:
    """``json.loads(data)``, unless ``data`` is over ``limit`` bytes (UTF-8, for a
    ``str``) or nests deeper than ``depth``: then :class:`JSONLimitError` naming ``what``.
    Bytes are decoded as ``json.loads`` decodes them (UTF-8, -16 or -32)."""
    size = _utf8_length(data, limit) if isinstance(data, str) else len(data)
    if size > limit:
        raise JSONLimitError(f"{what}: {size} bytes of JSON, more than the {limit} it may "
                             f"have")
    if isinstance(data, str):
        text, utf8 = data, None
    else:
        encoding = json.detect_encoding(data)
        text = data.decode(encoding, "surrogatepass")
        utf8 = bytes(data) if encoding.startswith("utf-8") else None
    if text.count("[") + text.count("{") > depth:  # else it cannot nest deeper: no scan
        levels = _nesting(utf8 if utf8 is not None else text.encode("utf-8", "surrogatepass"))
        if levels > depth:
            raise JSONLimitError(f"{what}: JSON nested {levels} levels deep, more than the "
                                 f"{depth} it may be")
    return json.loads(text)


def load_file(path: str | os.PathLike[str], *, limit: int, what: str,
              depth: int = MAX_DEPTH) -> Any:
    """:func:`loads` of the file ``path``, of which no more than ``limit`` + 1 bytes are
    read (a larger file is refused as :func:`loads` refuses large data)."""
    with open(path, "rb") as f:
        return loads(read_at_most(f, limit + 1), limit=limit, what=what, depth=depth)


def read_at_most(file: BinaryIO, size: int) -> bytes:
    """The first ``size`` bytes of ``file`` (all, if it has fewer), in reads of 1 MiB at
    most: ``read(size)`` would allocate ``size`` bytes at once, however few there are."""
    chunks, have = [], 0
    while have < size and (chunk := file.read(min(1 << 20, size - have))):
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


def _nesting(utf8: bytes) -> int:
    """How deep arrays and objects nest in the JSON ``utf8``. A run of backslashes pairs
    up from its left as the decoder's escapes do, and dropping two adjacent quotes changes
    no bracket's side of a string: each step keeps every bracket inside or outside."""
    flat = utf8.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _OTHER_BYTES)
    brackets = _STRING.sub(b"", flat.replace(b'""', b""))
    return max(accumulate(map(_STEP.__getitem__, brackets), initial=0))


def _utf8_length(text: str, limit: int) -> int:
    """The UTF-8 length of ``text`` (1 to 4 bytes a character), or its length in
    characters where that settles how it compares with ``limit``: no copy to count."""
    if len(text) > limit or 4 * len(text) <= limit:
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))

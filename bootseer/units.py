"""Byte sizes as people write them ("64k", "1MiB", "2g") and as the CLI prints them."""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Parse a byte size; suffixes are binary (``1m`` = 1 MiB), as in ``dd`` and HDFS."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a byte size: {text!r} (examples: 4096, 64k, 1m, 2GiB)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def format_size(n: float) -> str:
    """Format a byte count with a binary unit, e.g. ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")

"""Parse the link rates the dev-cluster options accept (sizes: :mod:`bootseer.units`).

Kept separate (and pure) so the CLI, the Python API and the tests agree on one meaning of
"1m" or "40MB/s" -- an ambiguous unit silently off by 8x would poison every benchmark.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bootseer.units import parse_size

__all__ = ["LinkCap", "parse_size", "parse_rate", "parse_delay", "parse_link", "format_rate"]

# Rates: "bit" forms are bits/s (decimal, as tc and network people mean them), "B/s" forms
# are bytes/s (decimal for kB/MB/GB, binary for KiB/MiB/GiB). "mbps" is refused on purpose:
# tc reads it as megaBYTES, most people mean megaBITS.
_BIT_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_BYTE_UNITS = {"b/s": 1, "kb/s": 10**3, "mb/s": 10**6, "gb/s": 10**9,
               "kib/s": 2**10, "mib/s": 2**20, "gib/s": 2**30}

_NUM = r"(\d+(?:\.\d+)?)"


def parse_rate(text: str) -> float:
    """Bytes per second from "40mbit", "1gbit", "40MB/s" or "20MiB/s"."""
    m = re.fullmatch(_NUM + r"\s*([a-zA-Z/]+)", text.strip())
    if not m:
        raise ValueError(f"cannot parse rate {text!r} (examples: 40mbit, 40MB/s, 20MiB/s)")
    num, unit = float(m.group(1)), m.group(2).lower()
    if unit in _BIT_UNITS:
        return num * _BIT_UNITS[unit] / 8.0
    if unit in _BYTE_UNITS:
        return num * _BYTE_UNITS[unit]
    raise ValueError(f"unknown rate unit in {text!r}: use bit/kbit/mbit/gbit (bits per second) "
                     "or B/s, kB/s, MB/s, GB/s, KiB/s, MiB/s, GiB/s (bytes per second)")


def parse_delay(text: str) -> float:
    """Seconds from "2ms", "500us", "0.1s"."""
    m = re.fullmatch(_NUM + r"\s*(us|ms|s)", text.strip().lower())
    if not m:
        raise ValueError(f"cannot parse delay {text!r} (examples: 2ms, 500us, 0.1s)")
    return float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]


def format_rate(bytes_per_s: float) -> str:
    """A rate as MB/s (decimal) for logs and status output."""
    return f"{bytes_per_s / 1e6:.3g}MB/s"


@dataclass(frozen=True)
class LinkCap:
    """Per-DataNode egress cap: what one DataNode can send per second, plus optional delay.

    Loopback is faster than any real link, so any benchmark that claims a network effect
    must run under a stated cap (see the design brief, "Remote-store physics").
    """

    rate_bytes_per_s: float
    delay_s: float = 0.0

    def __str__(self) -> str:
        text = format_rate(self.rate_bytes_per_s)
        return f"{text},{self.delay_s * 1e3:g}ms" if self.delay_s else text

    def to_json(self) -> dict:
        return {"rate_bytes_per_s": self.rate_bytes_per_s, "delay_s": self.delay_s}

    @classmethod
    def from_json(cls, data: dict | None) -> LinkCap | None:
        return None if data is None else cls(float(data["rate_bytes_per_s"]),
                                             float(data.get("delay_s", 0.0)))


def parse_link(text: str) -> LinkCap:
    """A LinkCap from "RATE[,DELAY]", e.g. "40mbit" or "40MB/s,2ms"."""
    rate_text, _, delay_text = text.partition(",")
    rate = parse_rate(rate_text)
    if rate <= 0:
        raise ValueError("link rate must be positive")
    return LinkCap(rate, parse_delay(delay_text) if delay_text.strip() else 0.0)

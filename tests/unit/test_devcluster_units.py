"""The dev cluster's spec on its own: sizes, rates and link caps parsed, a bad block size
refused; no cluster is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootseer_dev.cluster import ClusterSpec, LinkCap, SpecError, parse_link, parse_rate, parse_size

MiB = 1 << 20


def test_units_parse_sizes_and_rates():
    assert parse_size("1m") == MiB and parse_size("64k") == 65536 and parse_size("4096") == 4096
    assert parse_rate("40mbit") == 5e6 and parse_rate("40MB/s") == 40e6
    assert parse_rate("20MiB/s") == 20 * MiB
    assert parse_link("40MB/s,2ms") == LinkCap(40e6, 0.002)
    with pytest.raises(ValueError):
        parse_rate("40mbps")  # ambiguous: tc reads megaBYTES, people mean megabits
    with pytest.raises(SpecError):
        ClusterSpec(block_size=1000, state_dir=Path("/nonexistent"))  # not a multiple of 512


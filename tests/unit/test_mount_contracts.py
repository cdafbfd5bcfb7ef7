"""The typed contract between a mount server and whoever started it: info and statistics
files round-trip, and a malformed one is an error rather than a half-read dict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootseer.errors import BootseerError
from bootseer.prefetch.lazyimage import LazyStats, ManifestLoad
from bootseer.prefetch.prefetcher import PrefetchStats
from bootseer.prefetch.session import MountInfo, MountStats, RecordingSummary


def test_statistics_round_trip_and_keep_their_flat_shape(tmp_path: Path) -> None:
    stats = MountStats(LazyStats(blocks_fetched=3, bytes_fetched=7, cache_hits=2),
                       PrefetchStats(hot_blocks=5, done=True),
                       RecordingSummary("train", "ready", 5, 2, 1 << 20), "sha256:ab", 99,
                       ManifestLoad(1000, 12, False, 0.01, 0.002), {"read": 4, "total": 4},
                       None, {"read": 0.25, "total": 0.25}, 1.5)
    stats.save(tmp_path / "s.json")
    body = json.loads((tmp_path / "s.json").read_text())
    assert body["fuse_cpu_s"]["read"] == 0.25 and body["server_cpu_s"] == 1.5
    assert body["blocks_fetched"] == 3 and body["prefetch"]["done"] is True
    assert body["manifest"]["entries"] == 12 and body["fuse_requests"]["read"] == 4
    assert body["recording"]["ended"] == "ready" and body["image_content_bytes"] == 99
    assert MountStats.load(tmp_path / "s.json") == stats
    assert not {"recording", "manifest", "fuse_requests"} & set(MountStats(LazyStats()).to_json())


def test_info_round_trips_and_a_config_that_is_no_object_is_refused(tmp_path: Path) -> None:
    info = MountInfo("sha256:ab", {"config": {"Cmd": ["sh"]}}, 10, True)
    info.save(tmp_path / "i.json")
    assert MountInfo.load(tmp_path / "i.json") == info
    (tmp_path / "bad.json").write_text(json.dumps({**vars(info), "config": ["x"]}))
    with pytest.raises(BootseerError, match="not an object"):
        MountInfo.load(tmp_path / "bad.json")

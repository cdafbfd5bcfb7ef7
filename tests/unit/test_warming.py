"""The warmer protocol's pure parts: one result type for every part, its wire form (the
names agents and CLIs of earlier versions exchange), the hooks, the summary that holds the
parts, the node's caches placed from the config, and the snapshot options built from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootseer.agents.warm import WarmRequest, WarmSummary, warm, warmers
from bootseer.config import Config, SnapshotConfig, default_snapshot_concurrency
from bootseer.nodecache import NodeCaches
from bootseer.prefetch.warm import IMAGE, ImageWarmer
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.stage import SNAPSHOT, SnapshotWarmer
from bootseer.store import BlobStore, open_store
from bootseer.stripedfs.stage import CHECKPOINT, CheckpointWarmer
from bootseer.warming import NO_HOOKS, Hooks, PartKind, PartResult, Warmer

IMAGE_DETAIL = {"image_id": "sha256:" + "a" * 64, "workload": "train", "hot_list": True,
                "recordings": 2, "fetch_requests": 5}


def _image(missing: int = 0) -> PartResult:
    return PartResult(IMAGE, "py", items=10, bytes=1000, already_local=4, fetched=6,
                      store_bytes=400, missing=missing, seconds=1.5, peer_bytes=200,
                      detail=dict(IMAGE_DETAIL))


# The wire form of each kind of part, as agents before the one result type sent it.
LEGACY = [
    (IMAGE, {"image": "py", "image_id": "sha256:" + "a" * 64, "workload": "train",
             "hot_list": True, "recordings": 2, "blocks": 10, "bytes": 1000,
             "already_local": 4, "fetched_blocks": 6, "fetched_bytes": 400,
             "fetch_requests": 5, "missing": 0, "seconds": 1.5, "peer_bytes": 200,
             "complete": True}),
    (SNAPSHOT, {"key": "k1", "shards": 3, "bytes": 300, "already_local": 1,
                "fetched_shards": 1, "fetched_bytes": 100, "missing": 1, "seconds": 0.25,
                "peer_bytes": 0, "complete": False}),
    (CHECKPOINT, {"url": "hdfs://nn:8020/ckpt", "files": 2, "bytes": 64, "already_local": 0,
                  "fetched_files": 2, "fetched_bytes": 64, "missing": 0, "seconds": 0.1,
                  "peer_bytes": 0, "complete": True}),
]


@pytest.mark.parametrize(("kind", "body"), LEGACY, ids=lambda v: getattr(v, "unit", ""))
def test_a_part_reads_and_writes_the_wire_form_earlier_versions_exchange(
        kind: PartKind, body: dict) -> None:
    part = PartResult.from_json(kind, body)
    assert part.kind == kind and part.name == body[kind.name_field]
    assert (part.items, part.fetched) == (body[kind.unit], body[f"fetched_{kind.unit}"])
    assert part.store_bytes == body["fetched_bytes"]
    assert part.complete is body["complete"]
    assert part.to_json() == body


def test_an_old_part_without_peer_bytes_reads_as_none_from_peers() -> None:
    body = {k: v for k, v in LEGACY[1][1].items() if k != "peer_bytes"}
    assert PartResult.from_json(SNAPSHOT, body).peer_bytes == 0


def test_complete_means_nothing_missing() -> None:
    assert _image().complete and not _image(missing=1).complete


def test_the_summary_holds_each_part_in_its_section_and_round_trips() -> None:
    summary = WarmSummary(None, via="agent", members=3)
    env = PartResult.from_json(SNAPSHOT, LEGACY[1][1])
    ckpt = PartResult.from_json(CHECKPOINT, LEGACY[2][1])
    for part in (env, _image(), ckpt):
        summary.add(part)
    assert summary.image == _image() and summary.envs == [env]
    assert summary.checkpoints == [ckpt]
    assert summary.parts == [_image(), env, ckpt]  # the image first, as warmed
    assert not summary.complete  # the snapshot misses a shard
    body = json.loads(json.dumps(summary.to_json()))
    assert body["complete"] is False and body["members"] == 3
    assert body["image"]["fetched_blocks"] == 6 and body["envs"][0]["fetched_shards"] == 1
    assert WarmSummary.from_json(body) == summary


def test_an_empty_summary_is_complete() -> None:
    summary = WarmSummary(None)
    assert summary.complete and summary.parts == []
    assert WarmSummary.from_json(summary.to_json()) == WarmSummary(None, via="standalone")


def test_hooks_turn_waits_only_when_the_caller_makes_it() -> None:
    NO_HOOKS.turn()  # nothing to wait for
    turns: list[None] = []
    Hooks(before_fetch=lambda: turns.append(None)).turn()
    assert len(turns) == 1


def test_every_technique_is_a_warmer_of_its_own_kind(tmp_path: Path) -> None:
    config = Config(store=(tmp_path / "store").as_uri(), cache_dir=tmp_path / "cache")
    blobs = BlobStore(open_store(config.store))
    request = WarmRequest("py", "train", envs=("k1", "k2"), checkpoints=("file:///ck",))
    plan = warmers(blobs, config, request, caches=NodeCaches.for_config(config))
    assert [(type(w), names) for w, names in plan] == [
        (ImageWarmer, ("py",)), (SnapshotWarmer, ("k1", "k2")),
        (CheckpointWarmer, ("file:///ck",))]
    assert [w.kind for w, _ in plan] == [IMAGE, SNAPSHOT, CHECKPOINT]
    assert warmers(blobs, config, WarmRequest(), caches=NodeCaches.for_config(config)) == []


def test_a_request_runs_each_named_part_through_its_warmer_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``warm`` asks each warmer for its names, turn by turn, and files what they say;
    what a part left for later starts runs after every part, on a turn of its own."""
    calls: list[str] = []

    class Fake:
        def __init__(self, kind: PartKind) -> None:
            self.kind = kind

        def warm(self, name: str, hooks: Hooks) -> PartResult:
            calls.append(name)
            result = PartResult(self.kind, name, 1, 1, 0, 1, 1, 0, 0.0)
            if name == "py":  # its work for later starts: after every other part
                result.later = lambda part, hooks: calls.append(f"later {part.name}")
            return result

    fakes: list[tuple[Warmer, tuple[str, ...]]] = [
        (Fake(IMAGE), ("py",)), (Fake(SNAPSHOT), ("k1", "k2")), (Fake(CHECKPOINT), ("u",))]
    monkeypatch.setattr("bootseer.agents.warm.warmers", lambda *a, **k: fakes)
    turns: list[None] = []
    config = Config(store=(tmp_path / "store").as_uri(), cache_dir=tmp_path / "cache")
    summary = warm(BlobStore(open_store(config.store)), config, WarmRequest(),
                   before_fetch=lambda: turns.append(None))
    assert calls == ["py", "k1", "k2", "u", "later py"] and len(turns) == 5
    assert summary.image is not None and summary.image.name == "py"
    assert [e.name for e in summary.envs] == ["k1", "k2"]
    assert [c.name for c in summary.checkpoints] == ["u"] and summary.complete


def test_the_node_caches_are_placed_once_from_the_config(tmp_path: Path) -> None:
    config = Config(cache_dir=tmp_path)
    config.image.cache_size, config.snapshot.cache_size = 1 << 20, 2 << 20
    config.checkpoint.cache_size = 3 << 20
    caches = NodeCaches.for_config(config)
    blocks, shards, copies = caches.blocks(), caches.snapshots(), caches.checkpoint_copies()
    assert (blocks.directory, blocks.max_bytes, blocks.mode) == (tmp_path / "blocks",
                                                                 1 << 20, 0o600)
    assert (shards.directory, shards.max_bytes, shards.mode) == (tmp_path / "snapshots",
                                                                 2 << 20, 0o644)
    assert (copies.directory, copies.max_bytes, copies.mode) == (
        tmp_path / "checkpoints" / "copies", 3 << 20, 0o644)
    assert not any(tmp_path.iterdir())  # opening creates nothing


def test_snapshot_options_come_from_the_snapshot_section_with_one_default() -> None:
    assert SnapshotOptions().concurrency == default_snapshot_concurrency() \
        == SnapshotConfig().concurrency
    section = SnapshotConfig(shard_size=1 << 20, compression_level=3, concurrency=2,
                             bytecode=False)
    assert SnapshotOptions.from_config(section) == SnapshotOptions(1 << 20, 3, 2, False)
    assert SnapshotOptions.from_config(SnapshotConfig()) == SnapshotOptions()


def test_a_checkpoint_through_peers_counts_the_store_bytes_its_fetch_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Peers' bytes include failed and redundant ones, so they may exceed a file's size:
    the part's store bytes are the fetch's own count, never the size less the peers'
    (which went negative, and the agent's metrics refused it: a job's warm failed with an
    internal error in bench-restart)."""
    from bootseer.p2p import FetchResult
    from bootseer.stripedfs import stage
    from bootseer.stripedfs.files import CheckpointSource

    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "shard").write_bytes(b"x" * 1000)
    config = Config(store=(tmp_path / "store").as_uri(), cache_dir=tmp_path / "cache")
    fetched = FetchResult("d", 1000, store_bytes=250, peer_bytes=1100, peers=3, banned=(),
                          seconds=0.1)
    monkeypatch.setattr(stage, "_share", lambda *a, **k: fetched)
    # (pytest's directories are private: the file would never go to peers)
    monkeypatch.setattr(stage.SharedFile, "readable_by_all", property(lambda self: True))
    result = stage.stage_checkpoint(CheckpointSource(config), (tmp_path / "ck").as_uri(),
                                    concurrency=1, fanout=object(),  # type: ignore[arg-type]
                                    records=open_store(config.store))
    assert (result.fetched, result.store_bytes, result.peer_bytes) == (1, 250, 1100)

"""A server's spec is its whole contract with whoever starts it: it round-trips through
JSON with every field, carries the node's configuration, and anything that is not a whole,
well-typed spec is refused before a server acts on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootseer.agents.served import Served
from bootseer.config import Config, load_config
from bootseer.errors import BootseerError, ConfigError
from bootseer.prefetch.config import PrefetchConfig
from bootseer.prefetch.recording import ReadyWhen
from bootseer.prefetch.serverspec import ImageServerSpec, stats_path
from bootseer.serve import MAX_SPEC, command, decode, encode, spawn_server
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.serverspec import CheckpointServerSpec


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config(store=(tmp_path / "store").as_uri(), cache_dir=tmp_path / "cache")


def _image(config: Config, tmp_path: Path, peer_job: str | None = "train-7") -> ImageServerSpec:
    return ImageServerSpec.of(
        config, "img", tmp_path / "lower", workload="w", prefetch=False,
        record=ReadyWhen(tmp_path / "ready", tmp_path / "marker", 12.5), record_auto=True,
        info=tmp_path / "info.json", report=tmp_path / "r.json", fuse_fd=7,
        takeover_state=tmp_path / "f.json", peer_job=peer_job,
        agent_socket=tmp_path / "agent.sock" if peer_job else None)


def _checkpoint(config: Config, tmp_path: Path,
                peer_job: str | None = "train-7") -> CheckpointServerSpec:
    return CheckpointServerSpec.of(
        config, "hdfs://nn/c", tmp_path / "m", mode=0o440, memory=1 << 28,
        metadata_ttl=5.0, direct_io=False, fuse_fd=7, takeover_state=tmp_path / "f.json",
        ready_file=tmp_path / "ready", peer_job=peer_job,
        agent_socket=tmp_path / "agent.sock" if peer_job else None)


@pytest.mark.parametrize("peer_job", [None, "train-7"])
def test_every_spec_round_trips_with_every_field(config: Config, tmp_path: Path,
                                                 peer_job: str | None) -> None:
    config.image.prefetch_concurrency = 2
    config.checkpoint.allowed = ("hdfs://nn/",)
    for spec in (_image(config, tmp_path, peer_job), _checkpoint(config, tmp_path, peer_job)):
        back = decode(encode(spec))
        assert back == spec and type(back) is type(spec)
        assert back.config == config and back.peer_job == peer_job  # nothing read again
    image = _image(config, tmp_path)
    assert image.prefetch_config == PrefetchConfig(concurrency=2)
    assert image.stats == stats_path(config.cache_dir, tmp_path / "lower")
    assert _checkpoint(config, tmp_path).stripes.max_memory == 1 << 28


def test_the_server_command_line_is_built_in_one_place_and_holds_no_options(
        config: Config, tmp_path: Path) -> None:
    argv = command(_image(config, tmp_path))
    assert argv[1:] == ["-m", "bootseer.agents.runserver", "serve", "image", "img",
                        str(tmp_path / "lower")]
    assert command(_checkpoint(config, tmp_path))[4:6] == ["checkpoint", "hdfs://nn/c"]


def test_a_server_that_takes_over_never_records(config: Config, tmp_path: Path) -> None:
    image = _image(config, tmp_path)
    assert image.takeover().record is None and not image.takeover().record_auto
    assert image.takeover().fuse_fd == image.fuse_fd and image.ready_file == image.info
    assert _checkpoint(config, tmp_path).takeover() == _checkpoint(config, tmp_path)


def _body(config: Config, tmp_path: Path) -> dict:
    return json.loads(encode(_checkpoint(config, tmp_path)))


@pytest.mark.parametrize("damage", [
    lambda b: b.update(kind="shell"),
    lambda b: b.update(extra=1),
    lambda b: b.pop("spec"),
    lambda b: b["spec"].update(argv=["sh"]),
    lambda b: b["spec"].pop("url"),
    lambda b: b["spec"].update(fuse_fd=True),
    lambda b: b["spec"].update(fuse_fd="7"),
    lambda b: b["spec"].update(mode=4.5),
    lambda b: b["spec"].update(direct_io=1),
    lambda b: b["spec"].update(mountpoint=7),
    lambda b: b["spec"].update(mountpoint="/m\0/x"),
    lambda b: b["spec"].update(mountpoint=""),
    lambda b: b["spec"].update(metadata_ttl=float("nan")),
    lambda b: b["spec"].update(metadata_ttl=float("inf")),
    lambda b: b["spec"].update(stripes=[1, 2]),
    lambda b: b["spec"]["stripes"].update(stripe_size=0),
    lambda b: b["spec"]["config"].update(store=None),
    lambda b: b["spec"]["config"]["checkpoint"].update(allowed="hdfs://"),
    lambda b: b["spec"]["config"]["checkpoint"].update(allowed=[1]),
    lambda b: b["spec"]["config"].pop("p2p"),
])
def test_a_damaged_spec_is_refused(config: Config, tmp_path: Path, damage) -> None:
    body = _body(config, tmp_path)
    damage(body)
    with pytest.raises(ValueError):
        decode(json.dumps(body).encode())


@pytest.mark.parametrize("data", [b"", b"null", b"[]", b'"image"', b"{", b"\xff\xfe",
                                  b"[" * 100_000, b" " * (MAX_SPEC + 1) + b"{}"])
def test_what_is_no_spec_at_all_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode(data)


def test_a_connection_round_trips_without_the_agents_file(config: Config,
                                                          tmp_path: Path) -> None:
    served = Served(_image(config, tmp_path), tmp_path / "server.log", 123, 9, deaths=2,
                    failed=True, held=5)
    back = Served.from_json(json.loads(json.dumps(served.to_json())))
    assert back == served and back.held is None  # a new agent takes its file back itself
    assert back.status() == {"pid": 123, "serving": False, "server_deaths": 2,
                             "failed": True}


def test_prefetch_and_stripe_knobs_come_from_the_config_file_once(tmp_path: Path) -> None:
    assert PrefetchConfig.from_config(Config()) == PrefetchConfig()
    assert StripeConfig.from_config(Config()) == StripeConfig()
    path = tmp_path / "c.toml"
    path.write_text('[image]\nprefetch_request_size = "2m"\n'
                    '[checkpoint]\nstripe_size = "8m"\nmax_concurrent_fetches = 16\n'
                    'retry_initial_delay = 0.5\nmount_memory = "256m"\n')
    loaded = load_config(files=[path], environ={}).config
    assert PrefetchConfig.from_config(loaded) == PrefetchConfig(request_size=2 << 20)
    stripes = StripeConfig.from_config(loaded)
    assert (stripes.stripe_size, stripes.max_concurrent_fetches,
            stripes.retry_initial_delay) == (8 << 20, 16, 0.5)
    assert stripes.max_read_window == StripeConfig.max_read_window  # unset: the default
    spec = CheckpointServerSpec.of(loaded, "file:///c", tmp_path / "m")
    assert spec.stripes == StripeConfig(stripe_size=8 << 20, max_concurrent_fetches=16,
                                        retry_initial_delay=0.5, max_memory=256 << 20)


@pytest.mark.parametrize("table,key,value", [
    ("image", "prefetch_concurrency", "0"), ("checkpoint", "stripe_size", '"1g"'),
    ("checkpoint", "max_attempts", "0")])
def test_knobs_that_cannot_work_are_a_config_error(tmp_path: Path, table: str, key: str,
                                                   value: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"[{table}]\n{key} = {value}\n")
    loaded = load_config(files=[path], environ={}).config
    with pytest.raises(ConfigError, match=table):
        (PrefetchConfig if table == "image" else StripeConfig).from_config(loaded)


def test_a_server_that_fails_is_reported_with_its_log(config: Config, tmp_path: Path) -> None:
    """The spec reaches the server process on stdin; a server that cannot serve (no such
    image) exits, and the error says why."""
    (tmp_path / "m").mkdir()
    spec = ImageServerSpec.of(config, "no-such-image", tmp_path / "m")
    with pytest.raises(BootseerError, match="image no-such-image failed: .*error: "):
        spawn_server(spec, tmp_path / "server.log", timeout=60)


def test_a_spare_gets_ready_then_serves_the_spec_it_is_handed(config: Config,
                                                              tmp_path: Path) -> None:
    """A spare is started with the node's configuration only; handed a spec, a connection
    and a log, it serves that spec as a server started for it would (here: an image that
    does not exist, so it fails, and says why in the log it was handed)."""
    import os
    import time

    from bootseer.agents.spare import SparePool

    pool = SparePool(config, tmp_path / "spares.log", 1)
    pool.fill()
    pool.size = 0  # no refill: the test owns the one spare
    try:
        deadline = time.monotonic() + 60
        while pool.ready() < 1:
            assert time.monotonic() < deadline, (tmp_path / "spares.log").read_text()
            time.sleep(0.05)
        spare = pool.take()
        assert spare is not None
        connection, other = os.pipe()  # any file: the server fails before it serves
        spec = ImageServerSpec.of(config, "no-such-image", tmp_path / "m", fuse_fd=connection,
                                  info=tmp_path / "info.json")
        try:
            with pytest.raises(BootseerError, match="image no-such-image failed: .*error: "):
                spawn_server(spec, tmp_path / "server.log", timeout=60, spare=spare)
        finally:
            os.close(connection)
            os.close(other)
        assert spare.process.returncode is not None  # the spare itself ran it, and ended
        assert "no-such-image" in (tmp_path / "server.log").read_text()
    finally:
        pool.close()


def test_a_spares_warm_up_reads_a_blob_as_a_start_would_and_needs_none(
        config: Config, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The warm-up reads an image manifest's chunk table (the store's read path made ready
    before a start needs it); an empty store, or an image ref to a blob that is gone,
    leaves nothing to read, and the spare still gets ready."""
    import logging

    from bootseer.agents.runserver import warm_up
    from bootseer.store import BlobStore, open_store

    (tmp_path / "store").mkdir()
    blobs = BlobStore(open_store(config.store))
    caplog.set_level(logging.INFO, "bootseer.agents.runserver")
    warm_up(config)  # no images at all
    blob = blobs.put(b"manifest" * 100)
    blobs.set_ref("images/a/b", blob.digest)
    warm_up(config)
    assert "no sample read" not in caplog.text
    blobs.delete(blob.digest)
    warm_up(config)
    assert "spare: no sample read" in caplog.text and blob.digest in caplog.text

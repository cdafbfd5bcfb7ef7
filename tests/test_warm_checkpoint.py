"""``bootseer warm --checkpoint``: checkpoints staged on the node (file:// and real HDFS),
read by the checkpoint API from the local copy without a byte from the store; stale,
half-staged and damaged copies never used; the cache's size limit; through the agent."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from store_contract import MIB, ramp
from test_prefetch_lazy import bootseer

import bootseer.checkpoint as ckpt
from bootseer import ready
from bootseer.agents.warm import WarmSummary
from bootseer.store import Store
from bootseer.stripedfs.files import split_url, store_for
from bootseer.stripedfs.stage import CheckpointResult
from bootseer_dev.engines import start_agent

SIZE = 9 * MIB + 777  # nine 1 MiB HDFS blocks, several stripes, and a bit


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    paths = {name: tmp_path / name for name in ("store", "cache", "agent-cache", "run")}
    for path in paths.values():
        path.mkdir()
    return paths


@pytest.fixture(params=["local", "hdfs"])
def base_url(request, dirs) -> str:
    if request.param == "local":
        return (dirs["store"] / "ckpt").as_uri()
    cluster = request.getfixturevalue("hdfs_cluster")
    return f"{cluster.namenode_rpc_url}/ckpt-warm/{uuid.uuid4().hex[:8]}"


@pytest.fixture
def node(dirs, monkeypatch) -> dict[str, Path]:
    """This process reads checkpoints as a workload of a recorded start on the node."""
    monkeypatch.setenv("BOOTSEER_CACHE_DIR", str(dirs["cache"]))
    monkeypatch.setenv(ready.READY_FILE_ENV, str(dirs["run"] / "ready"))
    monkeypatch.setattr(ready, "_marked", set())
    return dirs


def _store(url: str) -> Store:
    return store_for(split_url(url)[0])


def _no_store_reads(monkeypatch, store: Store) -> None:
    """From here on, any ranged read of the store's backend fails the test (stat works)."""
    def refuse(*args, **kwargs):
        raise AssertionError("read the store instead of the staged copy")

    for method in ("_read_range", "read_range_into"):
        monkeypatch.setattr(type(store), method, refuse)


def _count_store_reads(monkeypatch, store: Store) -> list[int]:
    reads: list[int] = []
    for method in ("_read_range", "read_range_into"):
        original = getattr(type(store), method)

        def counted(self, *args, _original=original, **kwargs):
            reads.append(1)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(type(store), method, counted)
    return reads


def _warm(dirs, *urls: str, cache: Path | None = None, check: bool = True,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    args = [a for url in urls for a in ("--checkpoint", url)]
    return bootseer("warm", *args, "--json", "--no-agent" if env is None else "--agent",
                    store=dirs["store"], cache=cache or dirs["cache"], check=check, env=env)


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"embed.weight": torch.randn(512, 512, generator=g),
            "layer.0.weight": torch.randn(256, 1024, generator=g).half(),
            "step": torch.tensor([100], dtype=torch.int64)}


def _publish_checkpoint(base: str, tmp: Path) -> dict[str, torch.Tensor]:
    """A checkpoint directory: a big raw file, a safetensors file and a DCP checkpoint."""
    state = _state()
    store = store_for(base)
    store.put("raw.bin", ramp(0, SIZE))
    save_file(state, tmp / "model.safetensors")
    store.put("model.safetensors", (tmp / "model.safetensors").read_bytes())
    dcp.save(state, checkpoint_id=tmp / "dcp", no_dist=True)
    for path in sorted((tmp / "dcp").iterdir()):
        store.put(f"dcp/{path.name}", path.read_bytes())
    return state


def _same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name


def test_warmed_checkpoint_is_read_from_the_local_copy(base_url, node, tmp_path,
                                                       monkeypatch) -> None:
    state = _publish_checkpoint(base_url, tmp_path)
    out = json.loads(_warm(node, base_url).stdout)
    assert out["via"] == "standalone" and out["complete"]
    (result,) = out["checkpoints"]
    files = len(list(store_for(base_url).list()))
    assert result["files"] == result["fetched_files"] == files >= 4
    assert result["already_local"] == 0 and result["fetched_bytes"] == result["bytes"]
    # No ranged read of the store from here on: everything comes from the copies.
    _no_store_reads(monkeypatch, _store(f"{base_url}/raw.bin"))
    with ckpt.open(f"{base_url}/raw.bin") as f:
        assert f.read() == ramp(0, SIZE)
        f.seek(MIB - 5)
        assert f.read(10) == ramp(MIB - 5, 10)
    assert (node["run"] / "phase.checkpoint_first_byte").exists()
    _same(ckpt.load_safetensors(f"{base_url}/model.safetensors"), state)
    loaded = {k: torch.empty_like(v) for k, v in state.items()}
    dcp.load(loaded, storage_reader=ckpt.StorageReader(f"{base_url}/dcp"), no_dist=True)
    _same(loaded, state)
    again = json.loads(_warm(node, base_url, f"{base_url}/raw.bin").stdout)
    assert [c["already_local"] for c in again["checkpoints"]] == [files, 1]
    assert [c["fetched_files"] for c in again["checkpoints"]] == [0, 0]


def test_a_rewritten_checkpoint_is_read_from_the_store_and_staged_again(node,
                                                                        monkeypatch) -> None:
    url = (node["store"] / "ckpt" / "model.pt").as_uri()
    store = _store(url)
    store.put("model.pt", ramp(0, SIZE))
    _warm(node, url)
    store.put("model.pt", ramp(1, SIZE))  # same size, new content and mtime
    with monkeypatch.context() as m:
        reads = _count_store_reads(m, store)
        assert ckpt.open(url).read() == ramp(1, SIZE)
        assert reads, "the stale copy was read"
    out = json.loads(_warm(node, url).stdout)["checkpoints"][0]
    assert out["fetched_files"] == 1 and out["already_local"] == 0
    data = list((node["cache"] / "checkpoints" / "data").glob("*/*"))
    assert len(data) == 1  # the old copy went when the new one was committed
    _no_store_reads(monkeypatch, store)
    assert ckpt.open(url).read() == ramp(1, SIZE)


def test_what_a_killed_staging_leaves_is_never_used(node, monkeypatch) -> None:
    url = (node["store"] / "ckpt" / "model.pt").as_uri()
    store = _store(url)
    store.put("model.pt", ramp(0, SIZE))
    _warm(node, url)
    cache = node["cache"] / "checkpoints"
    (record,) = (cache / "entries").glob("*/*.json")
    (data,) = (cache / "data").glob("*/*")
    # Killed between the two renames: the copy is in place, its record is not.
    record.unlink()
    # Killed while copying: a temporary of a process that is gone.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (cache / "tmp" / f"{data.name[:16]}.{dead.pid}.0000").write_bytes(ramp(0, SIZE // 2))
    with monkeypatch.context() as m:
        reads = _count_store_reads(m, store)
        assert ckpt.open(url).read() == ramp(0, SIZE) and reads
    out = json.loads(_warm(node, url).stdout)["checkpoints"][0]
    assert out["fetched_files"] == 1  # staged again; the leftovers were swept
    assert list((cache / "tmp").iterdir()) == []
    assert len(list((cache / "data").glob("*/*"))) == 1


def test_a_damaged_copy_is_not_used_and_warm_replaces_it(node, monkeypatch) -> None:
    url = (node["store"] / "ckpt" / "model.pt").as_uri()
    store = _store(url)
    store.put("model.pt", ramp(0, SIZE))
    _warm(node, url)
    (data,) = (node["cache"] / "checkpoints" / "data").glob("*/*")
    data.chmod(0o644)
    with open(data, "r+b") as f:  # same size, one byte flipped: only the sha256 tells
        f.seek(5 * MIB)
        f.write(b"\xff")
    out = json.loads(_warm(node, url).stdout)["checkpoints"][0]
    assert out["already_local"] == 0 and out["fetched_files"] == 1
    with monkeypatch.context() as m:
        _no_store_reads(m, store)
        assert ckpt.open(url).read() == ramp(0, SIZE)
    (data,) = (node["cache"] / "checkpoints" / "data").glob("*/*")
    os.truncate(data, MIB)  # a short copy: its size tells at open
    reads = _count_store_reads(monkeypatch, store)
    assert ckpt.open(url).read() == ramp(0, SIZE) and reads


def test_the_cache_keeps_the_recently_used_copies_within_its_size(node, monkeypatch) -> None:
    store = _store((node["store"] / "ckpt" / "x").as_uri())
    urls = {}
    for name in ("a", "b", "c"):
        store.put(name, ramp(ord(name), 2 * MIB))
        urls[name] = (node["store"] / "ckpt" / name).as_uri()
    env = {"BOOTSEER_CHECKPOINT_CACHE_SIZE": "5m"}
    first = bootseer("warm", "--checkpoint", urls["a"], "--checkpoint", urls["b"],
                     store=node["store"], cache=node["cache"], env=env)
    assert f"checkpoint {urls['b']}: 1 files (2.0 MiB), 0 already local, 1 fetched" \
        in first.stderr
    ckpt.open(urls["a"]).close()  # a is used: b is now the least recently used
    bootseer("warm", "--checkpoint", urls["c"], store=node["store"], cache=node["cache"],
             env=env)
    reads = _count_store_reads(monkeypatch, store)
    for name in ("a", "c"):
        assert ckpt.open(urls[name]).read() == ramp(ord(name), 2 * MIB)
    assert not reads
    assert ckpt.open(urls["b"]).read() == ramp(ord("b"), 2 * MIB) and reads  # evicted
    # A request never evicts its own copies: the third does not fit, and says so.
    too_much = bootseer("warm", "--checkpoint", urls["a"], "--checkpoint", urls["b"],
                        "--checkpoint", urls["c"], store=node["store"], cache=node["cache"],
                        env=env, check=False)
    assert too_much.returncode == 3
    assert "checkpoint.cache_size" in too_much.stderr and "are not local" in too_much.stderr


def test_warm_through_the_agent_stages_in_the_nodes_cache(node, monkeypatch) -> None:
    url = (node["store"] / "ckpt" / "step100").as_uri()
    store = store_for(url)
    store.put("model.pt", ramp(0, SIZE))
    store.put("optim/state.bin", ramp(7, MIB))
    sock = node["run"] / "agent.sock"
    agent = start_agent(sock, {"BOOTSEER_STORE": node["store"].as_uri(),
                               "BOOTSEER_CACHE_DIR": str(node["agent-cache"]),
                               "BOOTSEER_CHECKPOINT_ALLOWED": f"{node['store'].as_uri()}/ckpt/"})
    try:
        out = _warm(node, url, env={"BOOTSEER_AGENT_SOCKET": str(sock)})
    finally:
        agent.terminate()
        agent.wait(20)
    summary = json.loads(out.stdout)
    assert summary["via"] == "agent" and summary["complete"]
    assert summary["checkpoints"][0]["fetched_files"] == 2
    assert summary["checkpoints"][0]["fetched_bytes"] == SIZE + MIB
    assert not (node["cache"] / "checkpoints").exists()  # the agent's cache, not ours
    monkeypatch.setenv("BOOTSEER_CACHE_DIR", str(node["agent-cache"]))
    _no_store_reads(monkeypatch, store)
    assert ckpt.open(f"{url}/optim/state.bin").read() == ramp(7, MIB)


def test_summary_round_trips_through_json() -> None:
    summary = WarmSummary(None, [], [CheckpointResult("hdfs://nn:8020/ckpt", 3, 100, 1, 1, 60,
                                                      1, 0.5)], via="agent")
    body = json.loads(json.dumps(summary.to_json()))
    assert body["checkpoints"][0]["complete"] is False and body["complete"] is False
    assert WarmSummary.from_json(body) == summary

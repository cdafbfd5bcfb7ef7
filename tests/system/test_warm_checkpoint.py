"""``bootseer warm --checkpoint``: checkpoints staged on the node (file:// and real HDFS),
read by the checkpoint API from the local copy without a byte from the store; stale,
half-staged and damaged copies never used; the cache's size limit; through the agent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from support.images import bootseer
from support.store_contract import MIB, ramp

import bootseer.checkpoint as ckpt
from bootseer import ready
from bootseer.agents.warm import WarmSummary
from bootseer.store import Store, open_store
from bootseer.stripedfs.files import split_url
from bootseer.stripedfs.stage import CHECKPOINT
from bootseer.warming import PartResult
from bootseer_dev.engines import start_agent

SIZE = 9 * MIB + 777  # nine 1 MiB HDFS blocks, several stripes, and a bit


@pytest.fixture(params=["local", pytest.param("hdfs", marks=pytest.mark.hdfs)])
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
    ckpt.source.cache_clear()  # the API loads its configuration once per process
    yield dirs
    ckpt.source.cache_clear()


def _copies(dirs) -> Path:
    """Where the node cache keeps the copies' bytes."""
    return dirs["cache"] / "checkpoints" / "copies" / "entries"


def _records(dirs) -> list[Path]:
    return list((dirs["cache"] / "checkpoints" / "records").glob("*/*.json"))


def _store(url: str) -> Store:
    return open_store(split_url(url)[0])


#: How a store's bytes are read: ranged reads, or (file://) its file opened for the reader.
READS = ("_read_range", "read_range_into", "open_local")


def _no_store_reads(monkeypatch, store: Store) -> None:
    """From here on, any read of the store's backend fails the test (stat works)."""
    def refuse(*args, **kwargs):
        raise AssertionError("read the store instead of the staged copy")

    for method in READS:
        monkeypatch.setattr(type(store), method, refuse)


def _count_store_reads(monkeypatch, store: Store) -> list[int]:
    reads: list[int] = []
    for method in READS:
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
    store = open_store(base)
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
    files = len(list(open_store(base_url).list()))
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
    data = list(_copies(node).glob("*/*"))
    assert len(data) == 1 and len(_records(node)) == 1  # the old copy went at the commit
    _no_store_reads(monkeypatch, store)
    assert ckpt.open(url).read() == ramp(1, SIZE)


def test_what_a_killed_staging_leaves_is_never_used(node, monkeypatch) -> None:
    url = (node["store"] / "ckpt" / "model.pt").as_uri()
    store = _store(url)
    store.put("model.pt", ramp(0, SIZE))
    _warm(node, url)
    copies = node["cache"] / "checkpoints" / "copies"
    (record,) = _records(node)
    # Killed between the two renames: the copy is in place, its record is not.
    record.unlink()
    # Killed while copying: a temporary of a process that is gone.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (copies / "tmp" / f"copy.{dead.pid}.0000").write_bytes(ramp(0, SIZE // 2))
    with monkeypatch.context() as m:
        reads = _count_store_reads(m, store)
        assert ckpt.open(url).read() == ramp(0, SIZE) and reads
    out = json.loads(_warm(node, url).stdout)["checkpoints"][0]
    assert out["fetched_files"] == 1  # staged again; the leftovers were swept
    assert list((copies / "tmp").iterdir()) == []
    assert len(list(_copies(node).glob("*/*"))) == 1 and len(_records(node)) == 1


def test_a_damaged_copy_is_not_used_and_warm_replaces_it(node, monkeypatch) -> None:
    url = (node["store"] / "ckpt" / "model.pt").as_uri()
    store = _store(url)
    store.put("model.pt", ramp(0, SIZE))
    _warm(node, url)
    (data,) = _copies(node).glob("*/*")
    data.chmod(0o644)
    with open(data, "r+b") as f:  # same size, one byte flipped: only the sha256 tells
        f.seek(5 * MIB)
        f.write(b"\xff")
    out = json.loads(_warm(node, url).stdout)["checkpoints"][0]
    assert out["already_local"] == 0 and out["fetched_files"] == 1
    with monkeypatch.context() as m:
        _no_store_reads(m, store)
        assert ckpt.open(url).read() == ramp(0, SIZE)
    (data,) = _copies(node).glob("*/*")
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
    store = open_store(url)
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
    ckpt.source.cache_clear()
    _no_store_reads(monkeypatch, store)
    assert ckpt.open(f"{url}/optim/state.bin").read() == ramp(7, MIB)


def test_summary_round_trips_through_json() -> None:
    summary = WarmSummary(None, [], [PartResult(CHECKPOINT, "hdfs://nn:8020/ckpt", 3, 100, 1, 1,
                                                 60, 1, 0.5)], via="agent")
    body = json.loads(json.dumps(summary.to_json()))
    assert body["checkpoints"][0]["complete"] is False and body["complete"] is False
    assert WarmSummary.from_json(body) == summary


def _on_disk(dirs) -> int:
    total = 0
    for path in _copies(dirs).glob("*/*"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            pass  # evicted by a running warm between the listing and the stat
    return total


def test_two_processes_staging_into_one_cache_stay_under_its_limit(node) -> None:
    """Two standalone warms at once, 16 MiB each into a 10 MiB cache: they evict each
    other's copies, never their own, and the limit holds throughout (counted on disk)."""
    urls = []
    for name in ("a", "b"):
        url = (node["store"] / "ckpt" / name).as_uri()
        store = open_store(url)
        for n in range(8):
            store.put(f"part{n}.bin", ramp(ord(name) * 16 + n, 2 * MIB))
        urls.append(url)
    env = {**os.environ, "BOOTSEER_STORE": node["store"].as_uri(),
           "BOOTSEER_CACHE_DIR": str(node["cache"]), "BOOTSEER_CHECKPOINT_CACHE_SIZE": "10m"}
    warms = [subprocess.Popen([sys.executable, "-m", "bootseer", "warm", "--no-agent", "--json",
                               "--checkpoint", url], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL) for url in urls]
    peak = 0
    while any(w.poll() is None for w in warms):
        peak = max(peak, _on_disk(node))
    for warm in warms:
        assert warm.wait(120) in (0, 3)  # 3: some files did not fit, and it says so
        out = json.loads(warm.stdout.read())["checkpoints"][0]
        assert out["fetched_files"] >= 1 and out["fetched_files"] + out["missing"] == 8
    limit = 10 * MIB
    assert peak <= limit and _on_disk(node) <= limit
    usage = int((node["cache"] / "checkpoints" / "copies" / "usage").read_text())
    assert usage == _on_disk(node)  # the count on disk is the truth
    for url, name in zip(urls, "ab"):  # whatever stayed, or not, every read is right
        for n in range(8):
            assert ckpt.open(f"{url}/part{n}.bin").read() == ramp(ord(name) * 16 + n, 2 * MIB)


def test_a_staging_killed_mid_copy_leaves_no_visible_copy(node, monkeypatch) -> None:
    """SIGKILL while a warm writes its copy: no entry, no record, reads go to the store;
    the next warm sweeps the dead writer's temporary and stages the file."""
    size = 256 * MIB
    url = (node["store"] / "ckpt" / "big.bin").as_uri()
    store = _store(url)
    store.put("big.bin", ramp(5, size))
    env = {**os.environ, "BOOTSEER_STORE": node["store"].as_uri(),
           "BOOTSEER_CACHE_DIR": str(node["cache"])}
    warm = subprocess.Popen([sys.executable, "-m", "bootseer", "warm", "--no-agent",
                             "--checkpoint", url], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    tmp = node["cache"] / "checkpoints" / "copies" / "tmp"
    deadline = time.monotonic() + 60
    while not (tmp.is_dir() and any(p.stat().st_size > 0 for p in tmp.iterdir())):
        assert warm.poll() is None, "the warm finished before it could be killed"
        assert time.monotonic() < deadline
    warm.send_signal(signal.SIGKILL)
    warm.wait()
    (leftover,) = tmp.iterdir()
    assert f".{warm.pid}." in leftover.name and leftover.stat().st_size < size
    assert not list(_copies(node).glob("*/*")) and not _records(node)
    with monkeypatch.context() as m:
        reads = _count_store_reads(m, store)
        with ckpt.open(url) as f:
            assert f.read(MIB) == ramp(5, MIB) and reads
    out = json.loads(_warm(node, url).stdout)["checkpoints"][0]
    assert out["fetched_files"] == 1 and not leftover.exists()
    _no_store_reads(monkeypatch, store)
    with ckpt.open(url) as f:
        f.seek(size - MIB)
        assert f.read() == ramp(5 + size - MIB, MIB)

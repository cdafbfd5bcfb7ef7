"""The checkpoint-load API on real HDFS (and the local store): byte-exact striped reads,
torch.load, safetensors and DCP round trips compared tensor by tensor, a dying DataNode,
stores opened with the configured ``hdfs.*`` options."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from support.hdfs import audited_users
from support.store_contract import MIB, ramp
from torch.distributed.checkpoint._extension import ZStandard
from torch.distributed.checkpoint.filesystem import FileSystemWriter

import bootseer.checkpoint as ckpt
from bootseer.store import open_store
from bootseer.stripedfs.reader import StripedReader
from bootseer.stripedfs.safetensors import SafetensorsFormatError

SIZE = 9 * MIB + 777  # nine 1 MiB HDFS blocks and a bit


@pytest.fixture(autouse=True)
def _fresh_configuration():
    """The API loads its configuration once per process: each test its own."""
    ckpt.source.cache_clear()
    yield
    ckpt.source.cache_clear()


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "embed.weight": torch.randn(512, 256, generator=g),
        "layer.0.bias": torch.randn(256, generator=g).to(torch.bfloat16),
        "layer.0.weight": torch.randn(256, 1024, generator=g).half(),
        "step": torch.tensor([1234], dtype=torch.int64),
        "mask": torch.rand(300, generator=g) > 0.5,
        "empty": torch.empty(0, 3),
    }


def _assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name


@pytest.fixture(params=["local", pytest.param("hdfs", marks=pytest.mark.hdfs),
                        pytest.param("webhdfs", marks=pytest.mark.hdfs)])
def base_url(request, tmp_path: Path) -> str:
    if request.param == "local":
        return f"file://{tmp_path}"
    cluster = request.getfixturevalue("hdfs_cluster")
    root = cluster.namenode_rpc_url if request.param == "hdfs" else cluster.webhdfs_url
    return f"{root}/ckpt-test/{uuid.uuid4().hex[:8]}"


def test_open_reads_the_whole_file_and_seeks(base_url: str) -> None:
    open_store(base_url).put("blob.bin", ramp(0, SIZE))
    with ckpt.open(f"{base_url}/blob.bin") as f:
        assert f.read() == ramp(0, SIZE)
        f.seek(MIB - 5)
        assert f.read(10) == ramp(MIB - 5, 10)  # across an HDFS block boundary
        assert f.tell() == MIB + 5
        f.seek(0, 2)
        assert f.read(1) == b""


def test_torch_load_round_trip(base_url: str, tmp_path: Path) -> None:
    state = _state()
    torch.save(state, tmp_path / "model.pt")
    open_store(base_url).put("model.pt", (tmp_path / "model.pt").read_bytes())
    _assert_same(ckpt.load(f"{base_url}/model.pt", map_location="cpu", weights_only=True), state)


def test_safetensors_round_trip(base_url: str, tmp_path: Path) -> None:
    state = {k: v for k, v in _state().items() if v.numel()}  # safetensors: no empty tensors
    save_file(state, tmp_path / "model.safetensors", metadata={"step": "1234"})
    open_store(base_url).put("model.safetensors", (tmp_path / "model.safetensors").read_bytes())
    _assert_same(ckpt.load_safetensors(f"{base_url}/model.safetensors"), state)


def test_sharded_safetensors_load_through_their_index(base_url: str, tmp_path: Path) -> None:
    """A checkpoint as a model hub publishes it: shards and the index naming each
    tensor's shard. A shard named with a path, or a tensor in two shards, is refused."""
    state = {k: v for k, v in _state().items() if v.numel()}
    names = sorted(state)
    shards = {f"model-0000{i + 1}-of-00003.safetensors": names[i::3] for i in range(3)}
    store = open_store(base_url)
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, tmp_path / shard)
        store.put(shard, (tmp_path / shard).read_bytes())

    def put_index(weight_map: dict[str, str]) -> str:
        store.put("model.safetensors.index.json",
                  json.dumps({"metadata": {}, "weight_map": weight_map}).encode())
        return f"{base_url}/model.safetensors.index.json"

    index = put_index({k: shard for shard, keys in shards.items() for k in keys})
    _assert_same(ckpt.load_safetensors(index), state)
    with pytest.raises(SafetensorsFormatError):  # an index naming itself: read as a shard
        ckpt.load_safetensors(put_index({names[0]: "model.safetensors.index.json"}))
    with pytest.raises(SafetensorsFormatError, match="not a file name beside the index"):
        ckpt.load_safetensors(put_index({names[0]: "../model-00001-of-00003.safetensors"}))
    save_file({names[0]: state[names[0]]}, tmp_path / "dup.safetensors")
    store.put("dup.safetensors", (tmp_path / "dup.safetensors").read_bytes())
    first = next(iter(shards))
    with pytest.raises(SafetensorsFormatError, match=f"tensor {names[0]} is in"):
        ckpt.load_safetensors(put_index({names[0]: first, "x": "dup.safetensors"}))
    with pytest.raises(SafetensorsFormatError, match="not a safetensors index"):
        store.put("bad.index.json", b"[1, 2]")
        ckpt.load_safetensors(f"{base_url}/bad.index.json")


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "zstd"])
def test_dcp_round_trip(base_url: str, tmp_path: Path, compressed: bool) -> None:
    """Tensor items are copied into their destinations from the fetched bytes; items a
    DCP extension transformed (zstd) are undone by DCP's own extension first."""
    state = _state()
    extensions = [ZStandard()] if compressed else None
    dcp.save(state, storage_writer=FileSystemWriter(tmp_path / "dcp", _extensions=extensions),
             no_dist=True)
    store = open_store(base_url + "/dcp")
    for path in sorted((tmp_path / "dcp").iterdir()):
        store.put(path.name, path.read_bytes())
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(target, storage_reader=ckpt.StorageReader(base_url + "/dcp"), no_dist=True)
    _assert_same(target, state)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, SIZE), st.integers(0, 3 * MIB)), min_size=1, max_size=6))
def test_random_reads_on_hdfs_are_byte_exact(hdfs_cluster, reads) -> None:
    url = f"{hdfs_cluster.namenode_rpc_url}/ckpt-test/random"
    store = open_store(url)
    if not store.exists("blob.bin"):
        store.put("blob.bin", ramp(0, SIZE))
    with StripedReader(store, "blob.bin") as reader:
        assert reader.layout.block_size == MIB  # stripes are cut at the HDFS blocks
        for offset, length in reads:
            assert reader.read(offset, length) == ramp(offset, max(0, min(length, SIZE - offset)))


@pytest.mark.parametrize("scheme", ["hdfs", "webhdfs"])
def test_datanode_stopped_mid_read(hdfs_cluster, scheme: str) -> None:
    root = hdfs_cluster.namenode_rpc_url if scheme == "hdfs" else hdfs_cluster.webhdfs_url
    url = f"{root}/ckpt-test/{uuid.uuid4().hex[:8]}"
    size = 32 * MIB
    open_store(url).put("big.bin", ramp(0, size))
    got = bytearray()
    try:
        with ckpt.open(f"{url}/big.bin") as f:
            got += f.read(2 * MIB)
            hdfs_cluster.stop_datanode(1, sig=signal.SIGKILL)
            got += f.read()
        assert bytes(got) == ramp(0, size)
    finally:
        hdfs_cluster.start_datanode(1)


@pytest.mark.parametrize("scheme", ["hdfs", "webhdfs"])
def test_the_api_reads_as_the_configured_hdfs_user(hdfs_cluster, scheme: str, tmp_path: Path,
                                                   monkeypatch) -> None:
    """``hdfs.user`` (here from ``BOOTSEER_HDFS_USER``) is who every API read acts as, in
    the NameNode's own audit log: files opened directly and through DCP."""
    run = uuid.uuid4().hex[:8]
    root = hdfs_cluster.namenode_rpc_url if scheme == "hdfs" else hdfs_cluster.webhdfs_url
    url = f"{root}/ckpt-user/{run}"
    state = _state()
    dcp.save(state, checkpoint_id=tmp_path / "dcp", no_dist=True)
    store = open_store(url)
    store.put("blob.bin", ramp(0, 2 * MIB))
    for path in sorted((tmp_path / "dcp").iterdir()):
        store.put(f"dcp/{path.name}", path.read_bytes())
    user = f"api-{scheme}-{run}"
    monkeypatch.setenv("BOOTSEER_HDFS_USER", user)
    monkeypatch.delenv("HADOOP_USER_NAME", raising=False)  # hdfs.user sets it: put it back
    with ckpt.open(f"{url}/blob.bin") as f:
        assert f.read() == ramp(0, 2 * MIB)
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(target, storage_reader=ckpt.StorageReader(f"{url}/dcp"), no_dist=True)
    _assert_same(target, state)
    assert audited_users(hdfs_cluster, "open", f"/ckpt-user/{run}/blob.bin") == {user}
    assert audited_users(hdfs_cluster, "open", f"/ckpt-user/{run}/dcp/.metadata") == {user}

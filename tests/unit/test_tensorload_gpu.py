"""The tensor loader onto a CUDA device: byte-exact against the safetensors library for
every dtype, sharded and a subset, through pinned buffers that never outnumber the
workers. Marked ``gpu``: CI machines have no GPU, so there these are reported as not run
(the one exception to "never skip under CI"); ``make test-gpu`` runs them on a GPU
machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import bootseer.checkpoint as ckpt
from bootseer.stripedfs import tensorload
from bootseer.stripedfs.config import StripeConfig

pytestmark = pytest.mark.gpu

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _fresh_configuration():
    ckpt.source.cache_clear()
    yield
    ckpt.source.cache_clear()


def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    out = {f"w{i}.{str(dt)[6:]}": torch.randn(301, 17 + i, generator=g).to(dt)
           for i, dt in enumerate([torch.float64, torch.float32, torch.float16,
                                   torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2])}
    out["ids"] = torch.randint(0, 1000, (4097,), generator=g)
    out["mask"] = torch.rand(1001, generator=g) > 0.5
    out["empty"] = torch.empty(0, 7)
    out["big"] = torch.randn(40 * MIB // 2, generator=g).to(torch.bfloat16)  # 40 MiB
    return out


def assert_on_device_and_equal(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].device.type == "cuda", name
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name].cpu().reshape(-1).view(torch.uint8),
                           tensor.reshape(-1).view(torch.uint8)), name


def test_a_file_loads_onto_the_gpu_byte_exact(tmp_path: Path) -> None:
    save_file(state(), tmp_path / "m.safetensors")
    config = StripeConfig(max_concurrent_fetches=8)
    got = ckpt.load_safetensors(f"file://{tmp_path}/m.safetensors", device="cuda",
                                config=config)
    assert_on_device_and_equal(got, load_file(tmp_path / "m.safetensors"))
    pool = tensorload.staging_memory(config, 16 * MIB, pinned=True)
    assert 1 <= pool.peak <= config.local_reads  # one buffer per worker at most
    assert pool.take(1)[0].is_pinned()


def test_a_sharded_subset_loads_onto_the_gpu(tmp_path: Path) -> None:
    tensors = state()
    names = sorted(tensors)
    shards = {f"model-0000{i + 1}-of-00002.safetensors": names[i::2] for i in range(2)}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, tmp_path / shard)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: s for s, keys in shards.items() for k in keys}}))
    index = f"file://{tmp_path}/model.safetensors.index.json"
    assert_on_device_and_equal(ckpt.load_safetensors(index, device="cuda"), tensors)
    mine = lambda name: name.startswith("w")  # noqa: E731
    assert_on_device_and_equal(ckpt.load_safetensors(index, device="cuda:0", tensors=mine),
                               {k: v for k, v in tensors.items() if mine(k)})


def test_a_dcp_checkpoint_loads_into_tensors_on_the_gpu(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    saved = {k: v for k, v in state().items() if k != "big"}
    dcp.save(saved, checkpoint_id=tmp_path / "dcp", no_dist=True)
    target = {k: torch.zeros_like(v, device="cuda") for k, v in saved.items()}
    dcp.load(target, storage_reader=ckpt.StorageReader(f"file://{tmp_path}/dcp"),
             no_dist=True)
    assert_on_device_and_equal(target, saved)

"""The tensor loader on the host: every dtype byte-exact against the safetensors library,
through each reader (a local file, the striped reader) and each path (straight into the
tensors, and through staging buffers as a GPU load goes), tensors spanning chunks and a
staging pool smaller than one tensor, subsets that read only their own bytes, and headers
that lie refused before anything is allocated. (The same on a GPU: test_tensorload_gpu.)"""

from __future__ import annotations

import ctypes
import io
import json
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import bootseer.checkpoint as ckpt
from bootseer.errors import InvalidRangeError
from bootseer.store.local import LocalStore
from bootseer.stripedfs import tensorload
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.localfile import LocalFileReader
from bootseer.stripedfs.reader import StripedReader, StripeReadError
from bootseer.stripedfs.safetensors import SafetensorsFormatError, read_header
from bootseer.stripedfs.tensorload import TensorSlot, runs

KIB, MIB = 1 << 10, 1 << 20
#: Small stripes, so that tensors span several chunks; two staging buffers at most.
SMALL = StripeConfig(stripe_size=64 * KIB, initial_read_window=64 * KIB,
                     max_read_window=256 * KIB, max_memory=128 * KIB, max_concurrent_fetches=4)


@pytest.fixture(autouse=True)
def _fresh_configuration():
    ckpt.source.cache_clear()
    yield
    ckpt.source.cache_clear()


def every_dtype() -> dict[str, torch.Tensor]:
    """One tensor of each dtype the loader knows, odd sizes, a scalar, empty ones, and one
    of 3 MiB (larger than the staging pool of SMALL)."""
    g = torch.Generator().manual_seed(3)
    floats = [torch.float64, torch.float32, torch.float16, torch.bfloat16,
              torch.float8_e4m3fn, torch.float8_e5m2]
    ints = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
    out = {f"f.{str(dt)[6:]}": torch.randn(37, 13 + i, generator=g).to(dt)
           for i, dt in enumerate(floats)}
    out.update({f"i.{str(dt)[6:]}": torch.randint(-100 if dt != torch.uint8 else 0, 100,
                                                  (999 + i,), generator=g, dtype=dt)
                for i, dt in enumerate(ints)})
    out["mask"] = torch.rand(1001, generator=g) > 0.5
    out["scalar"] = torch.tensor(3.25)
    out["empty"] = torch.empty(0, 5)
    out["empty.bf16"] = torch.empty(3, 0, dtype=torch.bfloat16)
    out["big"] = torch.randn(6 * 128 * KIB + 7, generator=g).to(torch.float32)
    return out


def assert_bytes_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name].reshape(-1).view(torch.uint8),
                           tensor.reshape(-1).view(torch.uint8)), name


class CountingStore(LocalStore):
    """A local store that counts the bytes read from it, and fails at ``fail_at``."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.bytes_read, self.fail_at = 0, None

    def read_range_into(self, key: str, offset: int, buffer: memoryview, *,
                        progress=None) -> None:
        if self.fail_at is not None and offset <= self.fail_at < offset + len(buffer):
            raise FileNotFoundError(f"{key}: gone")
        self.bytes_read += len(buffer)
        super().read_range_into(key, offset, buffer, progress=progress)


def open_reader(path: Path, how: str) -> LocalFileReader | StripedReader:
    if how == "local":
        fd = os.open(path, os.O_RDONLY)
        return LocalFileReader(fd, os.fstat(fd).st_size, str(path))
    return StripedReader(CountingStore(path.parent.as_uri()), path.name, config=SMALL)


def load(path: Path, how: str, *, staged: bool = False, select=None) -> dict[str, torch.Tensor]:
    with open_reader(path, how) as reader:
        slots = [s for s in read_header(reader) if select is None or select(s.name)]
        return tensorload.load([(reader, slots)], "cpu", SMALL, staged=staged)


@pytest.mark.parametrize("how", ["local", "striped"])
@pytest.mark.parametrize("staged", [False, True], ids=["into-tensors", "through-staging"])
def test_every_dtype_is_byte_exact_against_the_library(tmp_path: Path, how: str,
                                                       staged: bool) -> None:
    save_file(every_dtype(), tmp_path / "m.safetensors")
    assert_bytes_equal(load(tmp_path / "m.safetensors", how, staged=staged),
                       load_file(tmp_path / "m.safetensors"))


def test_staging_holds_at_most_its_pool_whatever_the_tensor(tmp_path: Path) -> None:
    """A 3 MiB tensor through a pool of two 1 MiB buffers (SMALL's 64 KiB stripes
    round up to the 1 MiB minimum; 128 KiB of max_memory still holds two)."""
    big = {"big": every_dtype()["big"]}
    save_file(big, tmp_path / "m.safetensors")
    assert_bytes_equal(load(tmp_path / "m.safetensors", "striped", staged=True), big)
    pool = tensorload.staging_memory(SMALL, 64 * KIB, pinned=False)
    assert pool.capacity == 2 and pool.peak <= 2
    assert pool.limit < big["big"].numel() * 4


def test_a_local_files_reads_run_one_per_core_or_as_configured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local file's chunks are memory copies from the page cache: at most
    ``max_concurrent_local_reads`` at once (default one per core), not the 64 in flight a
    remote store's stripes get."""
    import threading
    import time

    assert StripeConfig().local_reads == len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match="max_concurrent_local_reads"):
        StripeConfig(max_concurrent_local_reads=-1)
    big = {"big": every_dtype()["big"]}
    save_file(big, tmp_path / "m.safetensors")
    monkeypatch.setattr("bootseer.stripedfs.localfile.LOCAL_CHUNK", 64 * KIB)  # 48 chunks
    lock, now, most = threading.Lock(), [0], [0]
    read = LocalFileReader.read_chunk_into

    def counted(self, offset: int, view: memoryview) -> None:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.005)
        try:
            read(self, offset, view)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(LocalFileReader, "read_chunk_into", counted)
    config = StripeConfig(max_concurrent_local_reads=3)  # max_concurrent_fetches stays 64
    assert_bytes_equal(ckpt.load_safetensors(f"file://{tmp_path}/m.safetensors",
                                             config=config), big)
    assert most[0] == 3


def test_the_checkpoint_api_loads_every_dtype(tmp_path: Path) -> None:
    save_file(every_dtype(), tmp_path / "m.safetensors")
    assert_bytes_equal(ckpt.load_safetensors(f"file://{tmp_path}/m.safetensors"),
                       load_file(tmp_path / "m.safetensors"))


@pytest.mark.parametrize("select", [
    pytest.param(lambda name: name.startswith("i."), id="predicate"),
    pytest.param(frozenset({"big", "f.bfloat16", "empty"}).__contains__, id="names"),
])
def test_a_subset_reads_only_its_own_bytes(tmp_path: Path, select) -> None:
    state = every_dtype()
    save_file(state, tmp_path / "m.safetensors")
    with open_reader(tmp_path / "m.safetensors", "striped") as reader:
        slots = read_header(reader)
        header_bytes = reader.store.bytes_read
        wanted = [s for s in slots if select(s.name)]
        got = tensorload.load([(reader, wanted)], "cpu", SMALL)
        assert reader.store.bytes_read - header_bytes == sum(s.nbytes for s in wanted)
    assert_bytes_equal(got, {k: v for k, v in state.items() if select(k)})


def test_a_sharded_subset_opens_only_the_shards_it_needs(tmp_path: Path) -> None:
    state = every_dtype()
    names = sorted(state)
    shards = {f"model-0000{i + 1}-of-00003.safetensors": names[i::3] for i in range(3)}
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, tmp_path / shard)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: s for s, keys in shards.items() for k in keys}}))
    index = f"file://{tmp_path}/model.safetensors.index.json"
    assert_bytes_equal(ckpt.load_safetensors(index), state)
    first, *others = shards
    for other in others:  # a rank that needs only the first shard never opens the others
        (tmp_path / other).write_bytes(b"damaged")
    mine = shards[first][:2]
    assert_bytes_equal(ckpt.load_safetensors(index, tensors=mine),
                       {k: state[k] for k in mine})
    with pytest.raises(KeyError, match="no tensor named nope"):
        ckpt.load_safetensors(index, tensors=[mine[0], "nope"])
    with pytest.raises(TypeError, match="not one string"):
        ckpt.load_safetensors(index, tensors=mine[0])


def _file(header: object, data: bytes = b"", *, header_len: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data


LIES = {
    "a truncated file": _file({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
                              bytes(12)),
    "a header longer than the file": _file({}, header_len=1 << 40),
    "a shape that is not its bytes": _file(
        {"t": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}}, bytes(16)),
    "a shape of a terabyte": _file(
        {"t": {"dtype": "F32", "shape": [1 << 38], "data_offsets": [0, 1 << 40]}}, bytes(16)),
    "overlapping tensors": _file(
        {"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
         "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}}, bytes(12)),
    "an unknown dtype": _file({"t": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}},
                              bytes(16)),
    "a negative offset": _file({"t": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}},
                               bytes(1)),
    "a boolean size": _file({"t": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}},
                            bytes(1)),
    "a float offset": _file({"t": {"dtype": "U8", "shape": [1], "data_offsets": [0.0, 1]}},
                            bytes(1)),
    "a header that is a list": _file([1, 2]),
    "a tensor that is a string": _file({"t": "F32"}),
    "a missing field": _file({"t": {"dtype": "U8", "shape": [1]}}, bytes(1)),
    "too short": b"\x01\x00",
}


@pytest.mark.parametrize("lie", LIES.values(), ids=LIES.keys())
def test_a_lying_header_is_refused_before_anything_is_allocated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lie: bytes) -> None:
    (tmp_path / "m.safetensors").write_bytes(lie)

    def allocate(*args, **kwargs):
        raise AssertionError("the loader was reached")

    monkeypatch.setattr(tensorload, "load", allocate)
    with pytest.raises(SafetensorsFormatError):
        ckpt.load_safetensors(f"file://{tmp_path}/m.safetensors")


def test_a_misaligned_tensor_gets_a_run_of_its_own(tmp_path: Path) -> None:
    """safetensors writers align every tensor; a file that does not still loads: the
    float32 after three bytes cannot be a view of the bytes' run."""
    values = struct.pack("<2f", 1.5, -2.0)
    (tmp_path / "m.safetensors").write_bytes(_file(
        {"u": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
         "f": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]},
         "g": {"dtype": "U8", "shape": [1], "data_offsets": [11, 12]}}, b"abc" + values + b"z"))
    got = ckpt.load_safetensors(f"file://{tmp_path}/m.safetensors")
    assert got["u"].tolist() == list(b"abc") and got["f"].tolist() == [1.5, -2.0]
    assert got["g"].tolist() == [ord("z")]


def test_runs_group_back_to_back_tensors_that_a_view_can_hold() -> None:
    def slot(name: str, dtype: torch.dtype, start: int, end: int) -> TensorSlot:
        return TensorSlot(name, dtype, ((end - start) // dtype.itemsize,), start, end)

    grouped = runs([slot("c", torch.float32, 20, 28), slot("a", torch.uint8, 0, 4),
                    slot("b", torch.float32, 4, 12), slot("e", torch.uint8, 28, 28),
                    slot("d", torch.float64, 30, 38), slot("f", torch.float64, 38, 46)])
    assert [([s.name for s in r.slots], r.start, r.end) for r in grouped] == [
        (["a", "b"], 0, 12), (["c"], 20, 28), (["d", "f"], 30, 46)]


def test_a_failed_read_fails_the_load(tmp_path: Path) -> None:
    save_file(every_dtype(), tmp_path / "m.safetensors")
    with open_reader(tmp_path / "m.safetensors", "striped") as reader:
        slots = read_header(reader)
        reader.store.fail_at = max(s.start for s in slots)
        with pytest.raises(StripeReadError, match="gone"):
            tensorload.load([(reader, slots)], "cpu", SMALL)


def test_a_file_truncated_under_the_loader_fails_the_load(tmp_path: Path) -> None:
    save_file(every_dtype(), tmp_path / "m.safetensors")
    with open_reader(tmp_path / "m.safetensors", "local") as reader:
        slots = read_header(reader)
        os.truncate(tmp_path / "m.safetensors", reader.size - 100)
        with pytest.raises(InvalidRangeError, match="changed while it was read"):
            tensorload.load([(reader, slots)], "cpu", SMALL)


@pytest.mark.parametrize("saved", [
    pytest.param(torch.arange(12, dtype=torch.float32).reshape(3, 4), id="contiguous"),
    pytest.param(torch.arange(40, dtype=torch.int64)[7:29:3], id="a strided view"),
    pytest.param(torch.randn(5, 6).to(torch.bfloat16).t(), id="transposed bf16"),
    pytest.param(torch.tensor(2.5, dtype=torch.float64), id="a scalar"),
    pytest.param(torch.empty(0, 3), id="empty"),
])
def test_a_dcp_item_is_read_as_a_view_of_its_fetched_bytes(saved: torch.Tensor) -> None:
    from bootseer.stripedfs.dcp import saved_tensor

    buffer = io.BytesIO()
    torch.save(saved, buffer)
    data = bytearray(buffer.getvalue())
    got = saved_tensor(data, "item")
    assert got.dtype == saved.dtype and got.shape == saved.shape and torch.equal(got, saved)
    if saved.numel():  # no copy: the tensor's bytes are the fetched bytes
        start = ctypes.addressof(ctypes.c_char.from_buffer(data))
        assert start <= got.untyped_storage().data_ptr() < start + len(data)


def test_a_dcp_item_that_is_no_tensor_is_refused() -> None:
    from bootseer.stripedfs.dcp import saved_tensor

    buffer = io.BytesIO()
    torch.save({"not": "a tensor"}, buffer)
    with pytest.raises(ValueError, match="holds a dict"):
        saved_tensor(bytearray(buffer.getvalue()), "item")


def test_dcp_items_of_a_local_file_are_read_straight_into_their_destinations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Items whose destination takes their bytes as they are go to the tensor loader in
    one batch; the others (another dtype, a destination that is a strided view, a tensor
    saved non-contiguous, an empty one) are copied from their fetched bytes. Every one
    ends byte-exact."""
    import torch.distributed.checkpoint as dcp

    g = torch.Generator().manual_seed(11)
    state = {"w": torch.randn(256, 33, generator=g), "b": torch.randn(7, generator=g).half(),
             "ids": torch.arange(1000), "mask": torch.rand(99, generator=g) > 0.5,
             "t": torch.randn(40, 30, generator=g).t(), "cast": torch.randn(5, generator=g),
             "strided": torch.randn(6, 4, generator=g), "empty": torch.empty(0, 2)}
    dcp.save(state, checkpoint_id=tmp_path / "dcp", no_dist=True)
    target = {k: torch.zeros_like(v.contiguous()) for k, v in state.items()}
    target["cast"] = torch.zeros(5, dtype=torch.float64)
    target["strided"] = torch.zeros(4, 6).t()  # not contiguous
    direct: list[torch.Tensor] = []
    read_into = tensorload.read_into

    def spy(pieces, config, **kwargs):
        direct.extend(dest for _, _, dest in pieces)
        return read_into(pieces, config, **kwargs)

    monkeypatch.setattr(tensorload, "read_into", spy)
    dcp.load(target, storage_reader=ckpt.StorageReader(f"file://{tmp_path}/dcp"),
             no_dist=True)
    for name, tensor in state.items():
        assert torch.equal(target[name], tensor.to(target[name].dtype)), name
    by_pointer = {t.data_ptr(): name for name, t in target.items()}
    assert sorted(by_pointer[t.data_ptr()] for t in direct) == ["b", "ids", "mask", "w"]

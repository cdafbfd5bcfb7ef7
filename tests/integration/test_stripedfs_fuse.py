"""The checkpoint FUSE mount, for real: kernel FUSE, a real HDFS directory, real processes."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.store_contract import MIB, ramp

from bootseer.store import open_store


def bootseer(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "bootseer", *args], capture_output=True,
                            text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"bootseer {args}: {result.stderr}")
    return result


def _mounted(mountpoint: Path) -> bool:
    """From /proc/mounts: os.path.ismount says False for a dead FUSE mount (ENOTCONN)."""
    return any(line.split()[1] == str(mountpoint) for line in open("/proc/mounts"))


def _mount_pid(mountpoint: Path) -> int:
    out = subprocess.run(["pgrep", "-f", f"runserver serve checkpoint .* {mountpoint}$"],
                         capture_output=True, text=True).stdout.split()
    assert out, "no FUSE server process found"
    return int(out[0])


@pytest.fixture
def mounted(hdfs_cluster, tmp_path: Path):
    """Eight 6 MiB shards plus a nested file in HDFS, mounted; unmounted afterwards."""
    url = f"{hdfs_cluster.namenode_rpc_url}/fuse-test/{uuid.uuid4().hex[:8]}"
    store = open_store(url)
    for rank in range(8):
        store.put(f"shard-{rank}.bin", ramp(rank * 1000, 6 * MIB + rank))
    store.put("meta/config.json", b'{"step": 100}')
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    bootseer("ckpt", "mount", url, str(mountpoint))
    yield mountpoint
    if _mounted(mountpoint):
        bootseer("ckpt", "umount", str(mountpoint))


def test_listing_stat_and_reads(mounted: Path) -> None:
    assert sorted(os.listdir(mounted)) == ["meta"] + [f"shard-{r}.bin" for r in range(8)]
    assert (mounted / "meta" / "config.json").read_bytes() == b'{"step": 100}'
    assert (mounted / "shard-3.bin").stat().st_size == 6 * MIB + 3
    with open(mounted / "shard-3.bin", "rb") as f:
        f.seek(MIB - 10)  # across an HDFS block boundary
        assert f.read(20) == ramp(3000 + MIB - 10, 20)
    with pytest.raises(OSError) as info:
        open(mounted / "new-file", "wb")
    assert info.value.errno == errno.EROFS
    assert not (mounted / "missing").exists()


def test_eight_ranks_read_their_shards_at_once(mounted: Path) -> None:
    """Eight processes (like eight ranks) each read a whole shard concurrently."""
    script = "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())"

    def rank(r: int) -> bytes:
        path = mounted / f"shard-{r}.bin"
        return subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                              timeout=120, check=True).stdout

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(rank, range(8)))
    for r, data in enumerate(results):
        assert data == ramp(r * 1000, 6 * MIB + r), f"rank {r}"


def test_sigterm_unmounts_cleanly(mounted: Path) -> None:
    pid = _mount_pid(mounted)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while _mounted(mounted) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _mounted(mounted)  # the server unmounted itself, not just died


def test_a_killed_server_leaves_a_mount_umount_clears(mounted: Path) -> None:
    os.kill(_mount_pid(mounted), signal.SIGKILL)
    time.sleep(0.5)
    with pytest.raises(OSError) as info:
        os.listdir(mounted)
    assert info.value.errno == errno.ENOTCONN
    assert _mounted(mounted)
    bootseer("ckpt", "umount", str(mounted))
    assert not _mounted(mounted)
    assert os.listdir(mounted) == []


def test_failed_reads_are_eio_not_wrong_bytes(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    store.put("gone.bin", ramp(0, MIB))
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    bootseer("ckpt", "mount", str(tmp_path / "store"), str(mountpoint))
    try:
        assert (mountpoint / "gone.bin").stat().st_size == MIB  # listed, then removed:
        store.delete("gone.bin")
        with pytest.raises(OSError) as info:
            (mountpoint / "gone.bin").read_bytes()
        assert info.value.errno in (errno.EIO, errno.ENOENT)
    finally:
        bootseer("ckpt", "umount", str(mountpoint))


def test_mount_errors_are_clear(tmp_path: Path) -> None:
    result = bootseer("ckpt", "mount", str(tmp_path), str(tmp_path / "nope"), check=False)
    assert result.returncode == 1 and "not a directory" in result.stderr

"""The low-level FUSE server (bootseer.prefetch.fuse_ll) on the real kernel: the mount equals
tar -x, a killed server is taken over by a new one (only requests it had read fail, and the page
cache retries reads), unmounting ends a server, and a Debian image runs python3 in runc.

The test process plays the node agent: it mounts (``mount_fd``) and keeps the fd, and runs
each server as a subprocess of this file (``python test_fuse_ll.py serve ...``) that it can
SIGKILL. Needs root and /dev/fuse.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bootseer.mounts import is_mounted, unmount
from bootseer.nodecache import NodeCache
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.store import BlobStore, open_store
from bootseer.store.local import LocalStore

MIB = 1 << 20
FILES = {f"/data/d{i % 3}/f{i}.bin": random.Random(i).randbytes(1000 + 37_000 * i)
         for i in range(12)}
BIG = random.Random(99).randbytes(5 * MIB + 777)


class SlowStore(LocalStore):
    """Every pack read first creates ``marker`` (the test's cue that a fetch is under way),
    then stalls: the server is killed in the middle of it."""

    def __init__(self, url: str, marker: Path) -> None:
        super().__init__(url)
        self.marker = marker

    def _read_range(self, key: str, offset: int, length: int) -> bytes:
        if key.startswith("packs/"):
            self.marker.touch()
            time.sleep(600)
        return super()._read_range(key, offset, length)


def serve_main(store: str, cache: str, image: str, fd: str, state: str, slow: str) -> None:
    """A server process: what ``bootseer image mount --foreground`` would run with an fd."""
    import logging

    from bootseer.prefetch.fuse_ll import serve

    logging.basicConfig(level=logging.INFO, format="server %(process)d: %(message)s")
    blob_store = SlowStore(store, Path(slow)) if slow else open_store(store)
    lazy = LazyImage(BlobStore(blob_store), image, NodeCache(Path(cache), 1 << 30))
    serve(lazy, int(fd), takeover_state=Path(state))


class Connection:
    """A FUSE connection mounted by fd, as the agent holds it, and its server processes."""

    def __init__(self, root: Path, store: Path, image: str) -> None:
        from bootseer.prefetch.fuse_ll import mount_fd

        self.store, self.image = store, image
        self.cache, self.mnt, self.state = root / "cache", root / "mnt", root / "takeover.json"
        self.cache.mkdir(parents=True)
        self.mnt.mkdir()
        self.fd = mount_fd(self.mnt)
        self.servers: list[subprocess.Popen] = []

    def start(self, slow: Path | None = None) -> subprocess.Popen:
        server = subprocess.Popen(
            [sys.executable, __file__, "serve", str(self.store), str(self.cache), self.image,
             str(self.fd), str(self.state), str(slow or "")],
            pass_fds=(self.fd,), stdin=subprocess.DEVNULL)
        self.servers.append(server)
        return server

    def close(self) -> None:
        if is_mounted(self.mnt):
            subprocess.run(["umount", "-l", str(self.mnt)], check=False)
        for server in self.servers:
            if server.poll() is None:
                server.kill()
            server.wait()
        os.close(self.fd)


@pytest.fixture
def connect(tmp_path: Path):
    """connect(store, image) → a mounted Connection; all are unmounted and closed after."""
    made: list[Connection] = []

    def make(store: Path, image: str) -> Connection:
        made.append(Connection(tmp_path / f"conn{len(made)}", store, image))
        return made[-1]

    yield make
    for connection in made:
        connection.close()


def convert_layers(root: Path, layers: list[bytes], name: str, block_size: int = MIB) -> Path:
    """Convert an OCI image of ``layers`` into a new store under ``root``; return the store."""
    from test_prefetch_image_source import OCI_LAYER_GZIP, write_image, write_layout

    from bootseer.prefetch.convert import convert
    from bootseer.prefetch.image_source import open_image

    (root / "image").mkdir(parents=True)
    store = root / "store"
    store.mkdir()
    layout = write_layout(root / "image",
                          [write_image(root / "image", layers, [OCI_LAYER_GZIP] * len(layers))])
    convert(open_image(layout), BlobStore(open_store(str(store))), name=name,
            block_size=block_size)
    return store


def files_image(root: Path) -> Path:
    from test_prefetch_rootfs import dir_, layer, reg

    members = [dir_("data"), *(dir_(f"data/d{i}") for i in range(3)),
               *(reg(path.lstrip("/"), data) for path, data in FILES.items()),
               reg("data/big.bin", BIG), reg("data/empty")]
    return convert_layers(root, [layer(*members)], "files")


def read(path: Path) -> bytes | OSError:
    try:
        return path.read_bytes()
    except OSError as exc:
        return exc


def test_mount_equals_tar_extraction(tmp_path: Path, connect) -> None:
    """The multi-layer image (whiteouts, opaque dirs, hard links, xattrs, devices, ...)."""
    from test_prefetch_rootfs import describe_disk, extract_like_a_runtime, multi_layer_image

    layers = multi_layer_image()
    store = convert_layers(tmp_path / "src", layers, "multi")
    ref = tmp_path / "ref"
    ref.mkdir()
    extract_like_a_runtime(layers, ref, tmp_path / "src")
    conn = connect(store, "multi")
    conn.start()
    on_mount, mount_groups = describe_disk(conn.mnt)
    on_disk, disk_groups = describe_disk(ref)
    assert sorted(on_mount) == sorted(on_disk)
    for path in on_disk:
        assert on_mount[path] == on_disk[path], path
    assert mount_groups == disk_groups
    with pytest.raises(OSError) as info:
        open(conn.mnt / "new", "w")
    assert info.value.errno == errno.EROFS
    with pytest.raises(FileNotFoundError):
        os.stat(conn.mnt / "no" / "such")
    assert os.statvfs(conn.mnt).f_namemax == 255
    device = os.stat(conn.mnt).st_dev
    bdi = Path(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb")
    assert bdi.read_text().strip() == "1024"  # raised by mount_fd, kept through INIT


def test_a_new_server_takes_over_and_queued_reads_succeed(tmp_path: Path, connect) -> None:
    conn = connect(files_image(tmp_path / "src"), "files")
    first = conn.start()
    paths = sorted(FILES)
    for path in paths[:4]:
        assert (conn.mnt / path.lstrip("/")).read_bytes() == FILES[path]
    assert conn.state.exists()  # the INIT answer, for whoever comes next
    first.send_signal(signal.SIGKILL)
    first.wait()
    results: dict[str, bytes | OSError] = {}
    readers = [threading.Thread(target=lambda p=p: results.update({p: read(conn.mnt / p[1:])}))
               for p in paths[4:]]
    for reader in readers:
        reader.start()
    time.sleep(0.5)
    assert all(reader.is_alive() for reader in readers)  # queued in the kernel, not failed
    assert is_mounted(conn.mnt)
    conn.start()
    for reader in readers:
        reader.join(timeout=30)
    assert results == {p: FILES[p] for p in paths[4:]}
    for path in paths[:4]:  # what the first server answered is still there
        assert (conn.mnt / path.lstrip("/")).read_bytes() == FILES[path]


def answer_the_first_flush(conn: Connection) -> None:
    """Close a file while a server runs. Opens cost no request (OPEN is answered ENOSYS), so
    the kernel does not know to skip FLUSH on close until it has sent one and been told
    ENOSYS. Until then, a file of the mount held open by this process across the fork of
    the next server would deadlock: the child's close-on-exec waits for that server."""
    assert (conn.mnt / "data/empty").read_bytes() == b""


def kill_while_fetching(server: subprocess.Popen, marker: Path,
                        reading: Callable[[], bytes | int]) -> tuple[threading.Thread, list]:
    """Run ``reading`` in a thread on a ``server`` that stalls in the fetch of its block
    (started with ``slow=marker``); SIGKILL the server in the middle of that fetch. Returns
    the thread and its result (once done)."""
    result: list[bytes | int | OSError] = []

    def run() -> None:
        try:
            result.append(reading())
        except OSError as exc:
            result.append(exc)

    reader = threading.Thread(target=run)
    reader.start()
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < deadline and reader.is_alive(), result
        time.sleep(0.01)
    server.send_signal(signal.SIGKILL)
    server.wait()
    return reader, result


def test_a_request_in_flight_when_its_server_dies_fails(tmp_path: Path, connect) -> None:
    """The kernel ends the requests a dead server had read with ECONNABORTED; an O_DIRECT
    read is such a request (nothing retries it). The next read after takeover succeeds."""
    conn = connect(files_image(tmp_path / "src"), "files")
    marker = tmp_path / "fetching"
    slow = conn.start(slow=marker)
    answer_the_first_flush(conn)
    fd = os.open(conn.mnt / "data/big.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        buffer = mmap.mmap(-1, MIB)  # page-aligned, as O_DIRECT wants
        reader, result = kill_while_fetching(slow, marker, lambda: os.preadv(fd, [buffer], 0))
        reader.join(timeout=30)
        assert isinstance(result[0], OSError) and result[0].errno == errno.ECONNABORTED, result
        conn.start()
        assert os.preadv(fd, [buffer], 0) == MIB and buffer[:] == BIG[:MIB]
    finally:
        os.close(fd)
    assert (conn.mnt / "data/big.bin").read_bytes() == BIG


def test_a_buffered_read_in_flight_when_its_server_dies_is_retried(tmp_path: Path,
                                                                   connect) -> None:
    """A page cache read whose READ died with the server is retried by the kernel (it reads
    a page that did not come in once more, synchronously): the new request waits in the
    queue for the next server, so the reader sees no error at all."""
    conn = connect(files_image(tmp_path / "src"), "files")
    marker = tmp_path / "fetching"
    slow = conn.start(slow=marker)
    answer_the_first_flush(conn)
    reader, result = kill_while_fetching(slow, marker,
                                         lambda: (conn.mnt / "data/big.bin").read_bytes())
    reader.join(timeout=1)
    assert reader.is_alive() and not result  # waiting for a server, not failed
    conn.start()
    reader.join(timeout=30)
    assert result == [BIG]


def test_unmount_ends_the_server(tmp_path: Path, connect) -> None:
    conn = connect(files_image(tmp_path / "src"), "files")
    server = conn.start()
    assert (conn.mnt / "data/d1/f1.bin").read_bytes() == FILES["/data/d1/f1.bin"]
    unmount(conn.mnt)
    assert server.wait(timeout=10) == 0
    assert not is_mounted(conn.mnt)


def test_real_debian_python_image_runs_in_runc(tmp_path: Path, connect) -> None:
    """debootstrap minbase + python3: python3 -c in runc on an overlay over the mount."""
    from bootseer.prefetch.container import overlay_mount, run_rootfs
    from bootseer.prefetch.convert import convert
    from bootseer.prefetch.image_source import open_image
    from bootseer_dev.image import build_image

    layout = build_image(with_python=True)  # cached after the first build (~35 s)
    store = tmp_path / "store"
    store.mkdir()
    convert(open_image(layout), BlobStore(open_store(str(store))), name="py")
    conn = connect(store, "py")
    conn.start()
    with overlay_mount(conn.mnt, tmp_path / "upper", tmp_path / "work",
                       tmp_path / "rootfs") as root:
        run = run_rootfs(root, ["python3", "-c",
                                "import json, sqlite3, sys; print(6 * 7, sys.version_info[0])"])
    assert (run.returncode, run.stdout.strip()) == (0, "42 3"), run.stderr


if __name__ == "__main__" and sys.argv[1] == "serve":
    serve_main(*sys.argv[2:])

"""One conformance suite for the one FUSE layer: every tree on every way of mounting it.

Both trees Bootseer serves (:class:`ImageTree`, a lazy image; :class:`CheckpointTree`, a
store directory) are served by the one server (:mod:`bootseer.fuse.server`) on the real
kernel, mounted each way a server gets its connection: by the node agent (``mount_fd``,
the connection outliving its servers), by the server itself as root (mount(2)), and
through ``fusermount3`` (the way unprivileged users mount). Each tree is served twice:
from the store, and with its files on the node (``*-passthrough``: the image's kept
whole, the checkpoint's staged), where a root server's opens name them as backing files
and the kernel reads them itself (FUSE passthrough; fusermount3's unprivileged server
cannot, and serves them itself). The image is also served the way the agent serves a
warmed image (``image-metadata``): an overlay over its metadata image (EROFS) whose
data-only layers are the whole files and the connection serving by key (:class:`KeyTree`),
here with half the files whole. On
every combination the mount equals its source and refuses what writes; where the agent
holds the connection, a killed server is taken over by a new one (only requests it had
read fail; queued ones, retried page reads and open files carry on; files open in
passthrough need no server at all; a new server keeps each file's mode), and unmounting
ends a server.

The test process plays the node agent: it mounts and keeps the fd, and runs each server
as a subprocess of this file (``python test_fuse_conformance.py serve ...``) that it can
SIGKILL. Needs root and /dev/fuse.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bootseer.mounts import is_mounted, unmount
from bootseer.store import BlobStore, open_store
from bootseer.store.local import LocalStore

MIB = 1 << 20
FILES = {f"/data/d{i % 3}/f{i}.bin": random.Random(i).randbytes(1000 + 37_000 * i)
         for i in range(12)}
BIG = random.Random(99).randbytes(5 * MIB + 777)
#: Every file of the test trees, by path.
CONTENT = {**FILES, "/data/big.bin": BIG, "/data/empty": b""}
KINDS = ("image", "image-passthrough", "checkpoint", "checkpoint-passthrough")
#: Each kind on each way of mounting it: the metadata image's overlay only on a connection
#: the agent holds, as the agent mounts it.
WAYS = [(kind, how) for kind in KINDS for how in ("agent", "self", "fusermount")] + \
    [("image-metadata", "agent")]
#: The files of ``image-metadata`` kept whole (read by the kernel, in place); the others
#: are read through the server by key.
METADATA_WHOLE = ("/data/big.bin", "/data/d0/")
PASSTHROUGH_KINDS = ("image-passthrough", "checkpoint-passthrough")
#: The trees whose reads reach the server (a passthrough file's never do).
SERVED_KINDS = ("image", "checkpoint")


class SlowStore(LocalStore):
    """Every read of a key starting with ``prefix`` first creates ``marker`` (the test's
    cue that a fetch is under way), then stalls: the server is killed in the middle of it."""

    def __init__(self, url: str, prefix: str, marker: Path) -> None:
        super().__init__(url)
        self.prefix, self.marker = prefix, marker

    def _stall(self, key: str) -> None:
        if key.startswith(self.prefix):
            self.marker.touch()
            time.sleep(600)

    def _read_range(self, key: str, offset: int, length: int) -> bytes:
        self._stall(key)
        return super()._read_range(key, offset, length)

    def read_range_into(self, key: str, offset: int, buffer: memoryview, *,
                        progress=None) -> None:
        self._stall(key)
        super().read_range_into(key, offset, buffer, progress=progress)

    def open_local(self, key: str) -> None:
        """No descriptor: every read goes through the ranged reads above, which stall."""
        return None


def make_tree(kind: str, store_path: str, image: str, cache: str, slow: str):
    """The tree a server of ``kind`` serves (what ``bootseer image mount`` and ``bootseer
    ckpt mount`` build)."""
    from bootseer.nodecache import NodeCache
    from bootseer.prefetch.imagetree import ImageTree
    from bootseer.prefetch.lazyimage import LazyImage
    from bootseer.prefetch.metaimage import KeyTree
    from bootseer.stripedfs.tree import CheckpointTree

    image_kind = kind.startswith("image")
    prefix = "packs/" if image_kind else "data/big.bin"
    store = SlowStore(store_path, prefix, Path(slow)) if slow else open_store(store_path)
    if image_kind:
        tree = KeyTree if kind == "image-metadata" else ImageTree
        return tree(LazyImage(BlobStore(store), image, NodeCache(Path(cache) / "blocks",
                                                                 1 << 30)))
    copies = checkpoint_copies(Path(cache)) if kind == "checkpoint-passthrough" else None
    return CheckpointTree(store, ttl=30.0, copies=copies)


def checkpoint_copies(cache: Path):
    """The checkpoint cache of a node whose cache directory is ``cache``."""
    from bootseer.nodecache import NodeCache
    from bootseer.stripedfs.checkpoint_cache import CheckpointCache

    return CheckpointCache(cache / "checkpoints", NodeCache(cache / "checkpoints" / "copies",
                                                           1 << 30))


def stage_all(store: Path, cache: Path) -> None:
    """Stage a copy of every file of the checkpoint directory ``store``, as ``bootseer warm
    --checkpoint`` does."""
    import hashlib

    from bootseer.stripedfs.checkpoint_cache import object_url

    copies, source = checkpoint_copies(cache), open_store(str(store))
    for path, data in CONTENT.items():
        key = path.lstrip("/")
        tmp = copies.begin()
        tmp.write_bytes(data)
        copies.commit(tmp, object_url(source, key), source.stat(key),
                      hashlib.sha256(data).hexdigest(), None)


def serve_main(kind: str, store: str, image: str, cache: str, how: str, target: str,
               state: str, slow: str) -> None:
    """A server process: ``how`` is a connection's fd number (held by the caller, as the
    agent holds it), ``self`` (mount(2) here) or ``fusermount`` (fusermount3 mounts)."""
    import logging

    from bootseer.fuse import connection
    from bootseer.fuse.server import serve, serve_at

    logging.basicConfig(level=logging.INFO, format="server %(process)d: %(message)s")
    tree = make_tree(kind, store, image, cache, slow)
    if how == "self":
        serve_at(tree, Path(target), "bootseer-test")
    elif how == "fusermount":
        fd = connection.fusermount_fd(Path(target), "bootseer-test")
        serve(tree, fd)
    else:
        serve(tree, int(how), takeover_state=Path(state))


class Connection:
    """A mount of a test tree and its server processes. ``how="agent"``: a connection
    mounted by fd that this process holds, as the agent does; else the server mounts.
    ``mnt`` is where the tree is seen: the connection's mount (``served``), or for
    ``image-metadata`` the overlay over the metadata image and the connection."""

    def __init__(self, root: Path, kind: str, store: Path, image: str,
                 how: str = "agent") -> None:
        from bootseer.fuse.connection import mount_fd

        self.kind, self.store, self.image, self.how = kind, store, image, how
        self.root, self.cache, self.state = root, root / "cache", root / "takeover.json"
        self.mnt = self.served = root / "mnt"
        self.cache.mkdir(parents=True)
        self.mnt.mkdir()
        if kind == "image-passthrough":
            make_whole(store, image, self.cache)
        elif kind == "checkpoint-passthrough":
            stage_all(store, self.cache)
        elif kind == "image-metadata":
            make_whole(store, image, self.cache, lambda path: path.startswith(METADATA_WHOLE))
            self.served, self.meta = root / "keys", build_metadata_image(store, image,
                                                                         self.cache)
            self.served.mkdir()
        self.fd = mount_fd(self.served, "bootseer-test") if how == "agent" else None
        self.servers: list[subprocess.Popen] = []

    def start(self, slow: Path | None = None) -> subprocess.Popen:
        how = str(self.fd) if self.fd is not None else self.how
        server = subprocess.Popen(
            [sys.executable, __file__, "serve", self.kind, str(self.store), self.image,
             str(self.cache), how, str(self.mnt), str(self.state), str(slow or "")],
            pass_fds=() if self.fd is None else (self.fd,), stdin=subprocess.DEVNULL)
        self.servers.append(server)
        if self.fd is None:  # the server mounts: wait for it
            deadline = time.monotonic() + 30
            while not is_mounted(self.mnt):
                assert server.poll() is None and time.monotonic() < deadline, "no mount"
                time.sleep(0.01)
        if self.kind == "image-metadata" and not is_mounted(self.mnt):
            self.mount_overlay()
        return server

    def mount_overlay(self) -> None:
        """The container's root as the agent mounts it for a warmed image (``mnt``): the
        metadata image, then the whole files, then the connection serving by key."""
        from bootseer.mounts import mount_overlay

        (self.root / "meta").mkdir()
        self.meta.mount(self.root / "meta")
        mount_overlay([self.root / "meta"], self.root / "upper", self.root / "work", self.mnt,
                      data=[self.meta.data_dir, self.served])

    def close(self) -> None:
        for mounted in (self.mnt, self.root / "meta", self.served):
            if is_mounted(mounted):
                subprocess.run(["umount", "-l", str(mounted)], check=False)
        for server in self.servers:
            if server.poll() is None:
                server.kill()
            server.wait()
        if self.fd is not None:
            os.close(self.fd)


@pytest.fixture
def connect(tmp_path: Path):
    """connect(kind, store, image) → a mounted Connection; all are unmounted and closed."""
    made: list[Connection] = []

    def make(kind: str, store: Path, image: str = "files", how: str = "agent") -> Connection:
        made.append(Connection(tmp_path / f"conn{len(made)}", kind, store, image, how))
        return made[-1]

    yield make
    for connection in made:
        connection.close()


def convert_layers(root: Path, layers: list[bytes], name: str, block_size: int = MIB) -> Path:
    """Convert an OCI image of ``layers`` into a new store under ``root``; return the store."""
    from support.oci import OCI_LAYER_GZIP, write_image, write_layout

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


def make_whole(store: Path, image: str, cache: Path,
               paths: Callable[[str], bool] = lambda path: True) -> int:
    """Keep the image's files (those ``paths`` accepts) whole in the node cache ``cache``,
    as ``bootseer warm`` does; returns how many are."""
    from bootseer.nodecache import NodeCache
    from bootseer.prefetch.lazyimage import LazyImage
    from bootseer.prefetch.rootfs import Kind
    from bootseer.prefetch.wholefiles import WholeFiles

    lazy = LazyImage(BlobStore(open_store(str(store))), image,
                     NodeCache(cache / "blocks", 1 << 30))
    files = [e for e in lazy.manifest.entries if e.kind is Kind.FILE and paths(e.path)]
    return WholeFiles(lazy).make_whole(files)


def build_metadata_image(store: Path, image: str, cache: Path):
    """The image's metadata image in the node cache ``cache``, as ``bootseer warm`` builds
    it (:class:`MetaImage`)."""
    from bootseer.nodecache import NodeCache
    from bootseer.prefetch.lazyimage import LazyImage
    from bootseer.prefetch.metaimage import MetaImage
    from bootseer.prefetch.wholefiles import WholeFiles

    lazy = LazyImage(BlobStore(open_store(str(store))), image,
                     NodeCache(cache / "blocks", 1 << 30))
    meta = MetaImage.of(lazy)
    assert meta.build(WholeFiles(lazy))
    return meta


def files_image(root: Path) -> Path:
    from support.layers import dir_, layer, reg

    members = [dir_("data"), *(dir_(f"data/d{i}") for i in range(3)),
               *(reg(path.lstrip("/"), data) for path, data in FILES.items()),
               reg("data/big.bin", BIG), reg("data/empty")]
    return convert_layers(root, [layer(*members)], "files")


def checkpoint_dir(root: Path) -> Path:
    """The same files as :func:`files_image`, as a checkpoint directory in a store."""
    for path, data in CONTENT.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_bytes(data)
    return root


def source(kind: str, root: Path) -> Path:
    """The store holding the test tree of ``kind``."""
    return files_image(root) if kind.startswith("image") else checkpoint_dir(root / "store")


def describe(mnt: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path below ``mnt``: its file type and, for a regular file, its bytes."""
    found = {}
    for directory, dirs, files in os.walk(mnt):
        for name in dirs + files:
            path = Path(directory, name)
            mode = path.lstat().st_mode
            found["/" + str(path.relative_to(mnt))] = (
                stat.S_IFMT(mode), path.read_bytes() if stat.S_ISREG(mode) else None)
    return found


def expected() -> dict[str, tuple[int, bytes | None]]:
    tree = {path: (stat.S_IFREG, data) for path, data in CONTENT.items()}
    for path in CONTENT:
        parent = os.path.dirname(path)
        while parent != "/":
            tree[parent] = (stat.S_IFDIR, None)
            parent = os.path.dirname(parent)
    return tree


def refuses_writes(mnt: Path) -> None:
    """Everything that would change the tree fails, EROFS (the mount is read-only)."""
    attempts: list[Callable[[], object]] = [
        lambda: open(mnt / "new", "w"), lambda: open(mnt / "data/empty", "r+b"),
        lambda: os.mkdir(mnt / "dir"), lambda: os.unlink(mnt / "data/empty"),
        lambda: os.rename(mnt / "data/empty", mnt / "data/moved"),
        lambda: os.chmod(mnt / "data/empty", 0o777),
        lambda: os.truncate(mnt / "data/big.bin", 0),
        lambda: os.symlink("x", mnt / "link"),
        lambda: os.setxattr(mnt / "data/empty", "user.x", b"1"),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno == errno.EROFS


def key_of(conn: Connection, path: str) -> str:
    """The whole-file key of the image's file ``path`` (its name in the data layers)."""
    from bootseer.nodecache import NodeCache
    from bootseer.prefetch.lazyimage import LazyImage
    from bootseer.prefetch.wholefiles import WholeFiles

    lazy = LazyImage(BlobStore(open_store(str(conn.store))), conn.image,
                     NodeCache(conn.cache / "blocks", 1 << 30))
    key = WholeFiles(lazy).key(lazy.lookup(path))
    assert key is not None
    return key


def writes_stay_in_their_layer(conn: Connection) -> None:
    """The metadata image's overlay is a container's root: a write is copied up into its
    own layer; the whole file and the file served by key it came from do not change."""
    from bootseer.prefetch.metaimage import redirect

    for path, layer in (("/data/d0/f3.bin", conn.meta.data_dir), ("/data/d1/f1.bin",
                                                                   conn.served)):
        with open(conn.mnt / path[1:], "r+b") as f:
            f.write(b"changed")
        assert (conn.root / "upper" / path[1:]).read_bytes() == \
            b"changed" + FILES[path][7:]
        assert Path(str(layer) + redirect(key_of(conn, path))).read_bytes() == FILES[path]
    refuses_writes(conn.root / "meta")


@pytest.mark.parametrize(("kind", "how"), WAYS)
def test_the_mount_equals_its_source_and_refuses_writes(tmp_path: Path, connect, kind: str,
                                                         how: str) -> None:
    conn = connect(kind, source(kind, tmp_path / "src"), how=how)
    conn.start()
    assert describe(conn.mnt) == expected()
    if kind == "image-metadata":
        writes_stay_in_their_layer(conn)
    else:
        refuses_writes(conn.mnt)
    with pytest.raises(FileNotFoundError):
        os.stat(conn.mnt / "no" / "such")
    with pytest.raises(NotADirectoryError):
        os.listdir(conn.mnt / "data/empty")
    with pytest.raises(IsADirectoryError):
        (conn.mnt / "data").read_bytes()
    with pytest.raises(OSError) as info:
        os.readlink(conn.mnt / "data/empty")
    assert info.value.errno == errno.EINVAL
    assert os.statvfs(conn.mnt).f_namemax == 255
    assert os.lstat(conn.mnt / "data").st_mode & 0o555 == 0o555  # readable, searchable
    assert {"ro", "nosuid", "nodev"} <= mount_options(conn.served)
    assert {"nosuid", "nodev"} <= mount_options(conn.mnt)


def mount_options(mnt: Path) -> set[str]:
    return set(next(line.split()[3] for line in open("/proc/mounts")
                    if line.split()[1] == str(mnt)).split(","))


@pytest.mark.parametrize("how", ["mount_fd", "fusermount_fd"])
def test_a_hostile_source_name_cannot_add_mount_options(tmp_path: Path, how: str) -> None:
    """A checkpoint URL becomes the mount's source name; with fusermount3 it travels in the
    option list, where a comma would start an option of its own (``suid``, ``dev``)."""
    from bootseer.fuse import connection

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    fd = getattr(connection, how)(mnt, "bootseer:hdfs://nn/x,suid,dev,allow_other=1\\,exec")
    try:
        source, options = next((line.split()[0], line.split()[3]) for line in
                               open("/proc/mounts") if line.split()[1] == str(mnt))
        assert {"ro", "nosuid", "nodev"} <= set(options.split(","))
        assert not {"suid", "dev"} & set(options.split(","))
        assert "," not in source
    finally:
        os.close(fd)  # no server: the connection ends, so the unmount cannot wait
        unmount(mnt)


@pytest.mark.parametrize("kind", ["checkpoint", "image-passthrough"])
def test_an_unprivileged_user_mounts_through_fusermount(kind: str) -> None:
    """A user without CAP_SYS_ADMIN: fusermount3 mounts and hands the connection over; the
    same server serves it, and the user's own ``fusermount3 -u`` ends it. This machine's
    /dev/fuse is root's alone (0600), so the test runs in a mount namespace of its own
    whose /dev/fuse is a node of the same device open to all, as on a stock host. With
    the image's files whole in the user's cache, the server still serves them itself (it
    may not register backing files, so it does not ask the kernel for passthrough)."""
    root = Path(tempfile.mkdtemp(prefix="bootseer-fusermount-"))
    try:
        os.chmod(root, 0o755)
        store = source(kind, root / "src")
        for made in ("mnt", "cache"):
            (root / made).mkdir()
            shutil.chown(root / made, "nobody", "nogroup")
        script = (f"mknod -m 0666 {root}/fuse c 10 229 && mount --bind {root}/fuse /dev/fuse "
                  f"{reveal_python(root)} && exec setpriv --reuid nobody --regid nogroup "
                  f"--clear-groups {sys.executable} {__file__} unprivileged {kind} {store} "
                  f"{root / 'mnt'} {root / 'cache'}")
        run = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                              script], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split() == ["mounted", "read", "unmounted"], run.stdout
    finally:
        shutil.rmtree(root, ignore_errors=True)


def reveal_python(root: Path) -> str:
    """Shell steps (for a private mount namespace) that let any user run this Python: where
    it lives below a directory only root may enter (pyenv under /root), that directory is
    covered by an open tmpfs holding just the Python installation, bound from below."""
    prefix = Path(sys.base_prefix).resolve()
    closed = next((a for a in reversed(prefix.parents) if not os.stat(a).st_mode & 0o001),
                  None)
    if closed is None:
        return ""
    keep, inside = root / "python", prefix.relative_to(closed)
    return (f"&& mkdir {keep} && mount --bind {prefix} {keep} "
            f"&& mount -t tmpfs -o mode=0755 tmpfs {closed} && mkdir -p {closed / inside} "
            f"&& mount --bind {keep} {closed / inside}")


def unprivileged_main(kind: str, store: str, mnt: str, cache: str) -> None:
    """As an unprivileged user: serve ``store`` at ``mnt`` through fusermount3 (for the
    image, its files made whole in ``cache`` first), read a file through the mount,
    unmount it; say each step."""
    assert os.geteuid() != 0
    if kind == "image-passthrough":
        assert make_whole(Path(store), "files", Path(cache)) == len(CONTENT) - 1
    server = subprocess.Popen([sys.executable, __file__, "serve", kind, store, "files", cache,
                               "fusermount", mnt, "", ""], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not is_mounted(Path(mnt)):
        assert server.poll() is None and time.monotonic() < deadline, "no mount"
        time.sleep(0.01)
    print("mounted")
    assert Path(mnt, "data/d1/f1.bin").read_bytes() == FILES["/data/d1/f1.bin"]
    print("read")
    subprocess.run(["fusermount3", "-u", mnt], check=True)
    assert server.wait(timeout=10) == 0
    print("unmounted")


def read(path: Path) -> bytes | OSError:
    try:
        return path.read_bytes()
    except OSError as exc:
        return exc


def test_mount_equals_tar_extraction(tmp_path: Path, connect) -> None:
    """The multi-layer image (whiteouts, opaque dirs, hard links, xattrs, devices, ...)."""
    from support.layers import describe_disk, extract_like_a_runtime, multi_layer_image

    layers = multi_layer_image()
    store = convert_layers(tmp_path / "src", layers, "multi")
    ref = tmp_path / "ref"
    ref.mkdir()
    extract_like_a_runtime(layers, ref, tmp_path / "src")
    conn = connect("image", store, "multi")
    conn.start()
    on_mount, mount_groups = describe_disk(conn.mnt)
    on_disk, disk_groups = describe_disk(ref)
    assert sorted(on_mount) == sorted(on_disk)
    for path in on_disk:
        assert on_mount[path] == on_disk[path], path
    assert mount_groups == disk_groups
    device = os.stat(conn.mnt).st_dev
    bdi = Path(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb")
    assert bdi.read_text().strip() == "1024"  # raised by mount_fd, kept through INIT


@pytest.mark.parametrize("kind", [*KINDS, "image-metadata"])
def test_a_new_server_takes_over_and_queued_reads_succeed(tmp_path: Path, connect,
                                                          kind: str) -> None:
    """(``image-metadata``: the files read first are whole, the queued ones are not.)"""
    conn = connect(kind, source(kind, tmp_path / "src"))
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


@pytest.mark.parametrize("kind", SERVED_KINDS)
def test_a_request_in_flight_when_its_server_dies_fails(tmp_path: Path, connect,
                                                        kind: str) -> None:
    """The kernel ends the requests a dead server had read with ECONNABORTED; an O_DIRECT
    read is such a request (nothing retries it). The next read after takeover succeeds on
    the same open file: its handle was the dead server's, and the new one re-creates it."""
    conn = connect(kind, source(kind, tmp_path / "src"))
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
    queue for the next server, so the reader sees no error at all. (The image's mount;
    checkpoint mounts bypass the page cache, as the test above shows.)"""
    conn = connect("image", files_image(tmp_path / "src"))
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


@pytest.mark.parametrize("kind", PASSTHROUGH_KINDS)
def test_files_open_in_passthrough_stay_readable_without_a_server(tmp_path: Path, connect,
                                                                  kind: str) -> None:
    """The kernel reads a passthrough file itself: with its server killed and none to take
    over, a file opened before (read, and mmapped) still reads byte for byte."""
    conn = connect(kind, source(kind, tmp_path / "src"))
    server = conn.start()
    path, small = conn.mnt / "data/big.bin", conn.mnt / "data/d1/f4.bin"
    with open(path, "rb", buffering=0) as f, open(small, "rb") as g:
        mapped = mmap.mmap(g.fileno(), 0, prot=mmap.PROT_READ)
        assert f.read(MIB) == BIG[:MIB]
        server.send_signal(signal.SIGKILL)
        server.wait()
        assert f.read() == BIG[MIB:]
        assert os.pread(f.fileno(), 4096, 3 * MIB + 5) == BIG[3 * MIB + 5 : 3 * MIB + 4101]
        assert mapped[:] == FILES["/data/d1/f4.bin"]
        mapped.close()
    conn.start()  # the mount is served again (new opens need a server)
    assert path.read_bytes() == BIG


def test_whole_files_under_a_metadata_image_need_no_server(tmp_path: Path,
                                                           connect) -> None:
    """The kernel finds a whole file's name in the metadata image and its bytes in the
    whole files: with the server killed and none to take over, whole files open, list and
    read (and map) byte for byte, new opens too; a file served by key waits for the next
    server, and reads right once it comes."""
    conn = connect("image-metadata", files_image(tmp_path / "src"))
    server = conn.start()
    assert (conn.mnt / "data/d1/f1.bin").read_bytes() == FILES["/data/d1/f1.bin"]
    server.send_signal(signal.SIGKILL)
    server.wait()
    assert sorted(os.listdir(conn.mnt / "data/d0")) == ["f0.bin", "f3.bin", "f6.bin",
                                                        "f9.bin"]
    assert (conn.mnt / "data/big.bin").read_bytes() == BIG
    with open(conn.mnt / "data/d0/f9.bin", "rb") as f:
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
            assert mapped[:] == FILES["/data/d0/f9.bin"]
    results: dict[str, bytes | OSError] = {}
    reader = threading.Thread(target=lambda: results.update(
        f4=read(conn.mnt / "data/d1/f4.bin")))
    reader.start()
    time.sleep(0.5)
    assert reader.is_alive()  # queued for a server, not failed
    conn.start()
    reader.join(timeout=30)
    assert results == {"f4": FILES["/data/d1/f4.bin"]}
    assert describe(conn.mnt) == expected()


def test_a_new_server_keeps_each_files_mode_and_its_backing_files(tmp_path: Path,
                                                                   connect) -> None:
    """The kernel fails an open (EIO) if a file's open files mix passthrough and reads
    through the server. The first server serves f0 (not whole when first opened) and
    passes f1 through; then f0 is made whole and the server killed. Its successor keeps
    both modes: a second open of f0, while the first is open, is served (not EIO), and a
    new open of f1 names the backing file registered before (it reads with no server)."""
    store = files_image(tmp_path / "src")
    conn = connect("image", store)
    make_whole(store, "files", conn.cache, lambda path: path != "/data/d0/f0.bin")
    first = conn.start()
    f0, f1 = conn.mnt / "data/d0/f0.bin", conn.mnt / "data/d1/f1.bin"
    with open(f0, "rb") as held:
        assert held.read() == FILES["/data/d0/f0.bin"]
        assert f1.read_bytes() == FILES["/data/d1/f1.bin"]
        assert make_whole(store, "files", conn.cache) == len(CONTENT) - 1
        first.send_signal(signal.SIGKILL)
        first.wait()
        second = conn.start()
        assert f0.read_bytes() == FILES["/data/d0/f0.bin"]
        with open(f1, "rb", buffering=0) as g:
            second.send_signal(signal.SIGKILL)
            second.wait()
            assert g.read() == FILES["/data/d1/f1.bin"]  # no server: passed through
    assert conn.state.with_name(conn.state.name + ".backing").stat().st_size > 0
    conn.start()
    assert describe(conn.mnt) == expected()


def test_a_whole_file_that_fails_its_check_is_never_registered(tmp_path: Path,
                                                              connect) -> None:
    """A whole file of the wrong size (damaged, or planted) is dropped, not named to the
    kernel: the server reads the file from its blocks, byte for byte."""
    from bootseer.nodecache import NodeCache
    from bootseer.prefetch.lazyimage import LazyImage
    from bootseer.prefetch.wholefiles import WholeFiles

    store = files_image(tmp_path / "src")
    conn = connect("image-passthrough", store)
    lazy = LazyImage(BlobStore(open_store(str(store))), "files",
                     NodeCache(conn.cache / "blocks", 1 << 30))
    entry = lazy.lookup("/data/big.bin")
    whole = WholeFiles(lazy)
    key = whole.key(entry)
    assert key is not None
    with open(whole.cache.path(key), "r+b") as f:
        f.truncate(entry.size - 1)
    server = conn.start()
    assert (conn.mnt / "data/big.bin").read_bytes() == BIG
    assert not whole.cache.path(key).exists()
    unmount(conn.mnt)
    assert server.wait(timeout=10) == 0


@pytest.mark.parametrize(("kind", "how"), [way for way in WAYS if way[1] != "fusermount"])
def test_unmount_ends_the_server(tmp_path: Path, connect, kind: str, how: str) -> None:
    conn = connect(kind, source(kind, tmp_path / "src"), how=how)
    server = conn.start()
    assert (conn.mnt / "data/d1/f1.bin").read_bytes() == FILES["/data/d1/f1.bin"]
    for mounted in (conn.mnt, conn.root / "meta", conn.served):  # the overlay's, first
        if is_mounted(mounted):
            unmount(mounted)
    assert server.wait(timeout=10) == 0
    assert not is_mounted(conn.served)


@pytest.mark.parametrize("kind", ["image", "image-passthrough"])
def test_real_debian_python_image_runs_in_runc(tmp_path: Path, connect, kind: str) -> None:
    """debootstrap minbase + python3: python3 -c in runc on an overlay over the mount (with
    passthrough: over a mount whose files are backed by the node's whole files, within
    the kernel's stacking depth)."""
    from bootseer.prefetch.container import overlay_mount, run_rootfs
    from bootseer.prefetch.convert import convert
    from bootseer.prefetch.image_source import open_image
    from bootseer_dev.image import build_image

    layout = build_image(with_python=True)  # cached after the first build (~35 s)
    store = tmp_path / "store"
    store.mkdir()
    convert(open_image(layout), BlobStore(open_store(str(store))), name="py")
    conn = connect(kind, store, "py")
    conn.start()
    with overlay_mount(conn.mnt, tmp_path / "upper", tmp_path / "work",
                       tmp_path / "rootfs") as root:
        run = run_rootfs(root, ["python3", "-c",
                                "import json, sqlite3, sys; print(6 * 7, sys.version_info[0])"])
    assert (run.returncode, run.stdout.strip()) == (0, "42 3"), run.stderr


if __name__ == "__main__":
    {"serve": serve_main, "unprivileged": unprivileged_main}[sys.argv[1]](*sys.argv[2:])

"""A warmed image's container root over its metadata image: names and attributes from an
EROFS image the kernel reads, data from the whole files, the rest from the server by key.

Real processes throughout: the agent, ``bootseer warm``, mkfs.erofs, EROFS, overlayfs,
the FUSE server, runc.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.ci import require
from support.containers import run_in, stop_agents
from support.images import bootseer
from support.pagecache import drop_cached, resident_pages

from bootseer.agents.client import AgentClient
from bootseer.agents.mountapi import MountRequest
from bootseer.mounts import is_mounted
from bootseer.nodecache import NodeCache
from bootseer.prefetch.blockformat import FileEntry
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.metaimage import METACOPY, REDIRECT, MetaImage, redirect, unsupported
from bootseer.prefetch.rootfs import Kind
from bootseer.prefetch.wholefiles import WholeFiles
from bootseer.store import BlobStore, open_store
from bootseer_dev.engines import start_agent

PY = 'python3 -c "import json, email.parser; print(6 * 7)"'


@pytest.fixture
def node(dirs, python_layout, tmp_path: Path):
    """The python image, recorded once for workload "py" and warmed through the agent."""
    require(unsupported(), "metadata images (EROFS on files, overlay data-only layers)")
    bootseer("image", "convert", str(python_layout), "--name", "py", store=dirs["store"],
             cache=dirs["cache"])
    sock = tmp_path / "run" / "agent.sock"
    env = {"BOOTSEER_STORE": f"file://{dirs['store']}",
           "BOOTSEER_CACHE_DIR": str(dirs["agent-cache"]),
           "BOOTSEER_IMAGE_RECORD_IMAGES": "*"}
    procs = [start_agent(sock, env)]
    try:
        with AgentClient(sock) as client:
            first = client.mount(MountRequest("rec", "py", workload="py", record="always"))
            assert run_in(first, PY).returncode == 0
            client.release("rec")
        warmed = json.loads(bootseer("warm", "--json", "--image", "py", "--workload", "py",
                                     store=dirs["store"], cache=dirs["cache"],
                                     env={"BOOTSEER_AGENT_SOCKET": str(sock)}).stdout)
        assert warmed["via"] == "agent" and warmed["image"]["metadata_image"] is True
        # Stubs, not data: the image is a small fraction of the image's bytes.
        meta = MetaImage.of(_image(dirs)).path
        assert meta.stat().st_size < 8 << 20 and meta.stat().st_mode & 0o777 == 0o600
        yield sock, procs, lambda: procs.append(start_agent(sock, env))
    finally:
        stop_agents(procs, dirs["agent-cache"])


def _image(dirs) -> LazyImage:
    return LazyImage(BlobStore(open_store(str(dirs["store"]))), "py",
                     NodeCache(dirs["agent-cache"] / "blocks", 1 << 32))


def test_a_warmed_start_names_nothing_through_the_server(node, dirs) -> None:
    """The start's lookups, misses and opens are the kernel's: the server answers none
    of them (python3 looks for hundreds of names the image lacks), and reads nothing.
    The metadata image is read whole as it is mounted, not a lookup at a time."""
    sock, _, _ = node
    meta = MetaImage.of(_image(dirs)).path
    drop_cached(meta)
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("c1", "py", workload="py", record="never"))
        directory = Path(mount.rootfs).parent
        assert is_mounted(directory / "meta") and not mount.recording
        deadline = time.monotonic() + 10
        while not all(resident_pages(meta)):
            assert time.monotonic() < deadline, resident_pages(meta).count(False)
            time.sleep(0.05)
        result = run_in(mount, PY)
        assert (result.returncode, result.stdout) == (0, "42\n"), result.stderr
        start = client.release("c1")
    assert start.detail["metadata_image"] is True
    requests = start.detail["image"]["fuse_requests"]
    assert (requests.get("lookup", 0), requests.get("lookup_negative", 0),
            requests.get("read", 0), requests.get("open", 0)) == (0, 0, 0, 0), requests
    assert not directory.exists() and not is_mounted(directory / "meta")
    # Nor is anything prefetched: every hot block is in a file the kernel reads whole.
    prefetch = start.detail["image"]["prefetch"]
    assert prefetch["done"] and prefetch["hot_blocks"] > 0
    assert (prefetch["in_whole_files"], prefetch["already_local"]) == \
        (prefetch["hot_blocks"], 0), prefetch


def test_a_containers_writes_stay_in_its_own_layer(node, dirs) -> None:
    """A write copies the file up (its bytes read through the server's layer: it is not
    whole); the image's bytes and the next container's view are as they were."""
    sock, _, _ = node
    append = 'echo changed >> /usr/lib/os-release && tail -1 /usr/lib/os-release'
    with AgentClient(sock) as client:
        for name, expected in (("w1", "changed\n"), ("w2", "changed\n")):
            mount = client.mount(MountRequest(name, "py", workload="py", record="never"))
            result = run_in(mount, append)
            assert (result.returncode, result.stdout) == (0, expected), result.stderr
            assert run_in(mount, "grep -c changed /usr/lib/os-release").stdout == "1\n"
            client.release(name)


def test_overlay_xattrs_written_through_a_root_are_escaped(node, dirs) -> None:
    """Even root, writing overlay directives through a container's root (a container
    lacks the CAP_SYS_ADMIN that trusted.* needs), cannot point a file at other bytes:
    overlayfs keeps them escaped in the writable layer."""
    sock, _, _ = node
    image = _image(dirs)
    other = WholeFiles(image).key(next(e for e in image.manifest.entries
                                       if "/json/__pycache__/__init__." in e.path))
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("x1", "py", workload="py", record="never"))
        target = Path(mount.rootfs) / "usr/lib/os-release"
        before = target.read_bytes()
        os.setxattr(target, REDIRECT, redirect(other).encode())
        os.setxattr(target, METACOPY, b"")
        upper = sorted(os.listxattr(Path(mount.rootfs).parent / "upper/usr/lib/os-release"))
        assert "trusted.overlay.overlay.redirect" in upper and REDIRECT not in upper
        assert run_in(mount, "cat /usr/lib/os-release").stdout.encode() == before
        client.release("x1")


def test_the_root_equals_the_served_root(node, dirs) -> None:
    """Every name, kind, mode, owner, size, time, link and file of the image is the same
    through the metadata image as through the server's tree (a start that records)."""
    sock, _, _ = node
    # (A directory's size is its file system's own: EROFS counts its entries' bytes.)
    script = ("cd / && find bin etc lib usr -xdev \\( -type f -o -type l \\) "
              "-printf '%p %y %m %U %G %s %T@ %n %l\\n' -o -type d "
              "-printf '%p %y %m %U %G %T@ %n\\n' | sort && "
              "find usr/lib/python3* -type f -name '*.py' | sort | head -400 | "
              "xargs cat | md5sum")
    out = {}
    with AgentClient(sock) as client:
        for name, record in (("kernel", "never"), ("served", "always")):
            mount = client.mount(MountRequest(name, "py", workload="py", record=record))
            assert is_mounted(Path(mount.rootfs).parent / "meta") == (name == "kernel")
            result = run_in(mount, script)
            assert result.returncode == 0, result.stderr
            out[name] = result.stdout
            client.release(name)
    kernel, served = (set(out[name].splitlines()) for name in ("kernel", "served"))
    assert sorted(kernel - served)[:20] == sorted(served - kernel)[:20] == []
    assert len(kernel) > 1000


def test_files_not_whole_are_read_from_the_server_and_survive_its_death(node, dirs) -> None:
    """Two hot files' whole files are gone (evicted): the overlay finds them in the
    server's layer, by key, one before and one after the server is killed (its
    replacement serves keys too)."""
    sock, _, _ = node
    image = _image(dirs)
    whole = WholeFiles(image)
    gone = {}
    for part in ("/json/__pycache__/__init__.", "/email/__pycache__/parser."):
        (entry,) = [e for e in image.manifest.entries if part in e.path]
        key = whole.key(entry)
        assert key is not None and key in whole.cache
        whole.cache.drop(key)
        gone[part] = entry
    parser = gone["/email/__pycache__/parser."]
    expected = hashlib.md5(image.read(parser, 0, parser.size)).hexdigest()
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("c2", "py", workload="py", record="never"))
        results = []
        container = threading.Thread(target=lambda: results.append(run_in(
            mount, 'python3 -c "import json; print(42)" && '
            'while [ ! -e /run/bootseer/go ]; do sleep 0.05; done && '
            f'md5sum {parser.path}')))
        container.start()
        while not client.mounts()[0].get("serving"):
            time.sleep(0.05)
        (listed,) = client.mounts()
        time.sleep(1)
        os.kill(listed["pid"], signal.SIGKILL)
        (Path(mount.signal_dir) / "go").touch()
        container.join(120)
        assert results and results[0].returncode == 0, results
        assert results[0].stdout.split()[:2] == ["42", expected]
        start = client.release("c2")
    assert start.detail["server_deaths"] == 1 and not start.detail["server_failed"]
    # The replacement's report: the parser's key (and its prefix directory) looked up.
    assert start.detail["image"]["fuse_requests"]["lookup"] >= 1


def test_with_every_whole_file_evicted_the_server_serves_them_all(node, dirs) -> None:
    sock, _, _ = node
    meta = MetaImage.of(_image(dirs))
    for entry in meta.data_dir.glob("*/*"):
        if entry.name != meta.key:
            entry.unlink()
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("c4", "py", workload="py", record="never"))
        assert run_in(mount, PY).stdout == "42\n"
        start = client.release("c4")
    assert start.detail["metadata_image"] is True
    assert start.detail["image"]["fuse_requests"]["read"] > 0
    # The server reads them all: their hot blocks are prefetched (from the node cache).
    prefetch = start.detail["image"]["prefetch"]
    assert (prefetch["in_whole_files"], prefetch["already_local"]) == \
        (0, prefetch["hot_blocks"]), prefetch


def test_a_restarted_agent_adopts_a_root_over_its_metadata_image(node, dirs) -> None:
    """The agent dies under a running container: the next one adopts the mount (its
    server serving keys), and its release unmounts the metadata image too."""
    sock, procs, restart = node
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("c3", "py", workload="py", record="never"))
    directory = Path(mount.rootfs).parent
    procs[-1].send_signal(signal.SIGKILL)
    procs[-1].wait()
    restart()
    assert run_in(mount, PY).stdout == "42\n"
    with AgentClient(sock) as client:
        (listed,) = client.mounts()
        assert (listed["id"], listed["serving"]) == ("c3", True)
        start = client.release("c3")
    assert start.detail["metadata_image"] is True
    assert not directory.exists() and not is_mounted(directory / "meta")


def test_the_metadata_image_counts_against_the_cache_and_may_be_evicted(node,
                                                                        dirs) -> None:
    """It is an entry of the whole files' cache, counted in its one limit. Evicted, the
    next start is served through FUSE (names too), and the next warm builds it again."""
    sock, _, _ = node
    meta = MetaImage.of(_image(dirs))
    used, size = meta.files.usage(), meta.path.stat().st_size
    meta.files.drop(meta.key)
    assert meta.files.usage() == used - size and not meta.exists()
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("c5", "py", workload="py", record="never"))
        assert not is_mounted(Path(mount.rootfs).parent / "meta")
        assert run_in(mount, PY).stdout == "42\n"
        start = client.release("c5")
    assert "metadata_image" not in start.detail
    assert start.detail["image"]["fuse_requests"]["lookup"] > 0
    warmed = json.loads(bootseer("warm", "--json", "--image", "py", "--workload", "py",
                                 store=dirs["store"], cache=dirs["cache"],
                                 env={"BOOTSEER_AGENT_SOCKET": str(sock)}).stdout)
    assert warmed["image"]["metadata_image"] is True and meta.exists()


def _manifest_entry(path: str, kind: Kind, **kw) -> FileEntry:
    fields = dict(mode=0o644, uid=0, gid=0, size=0, mtime=0.0, link_target=None, xattrs={},
                  devmajor=0, devminor=0, ino=2, nlink=1, blocks=())
    return FileEntry(path, kind, **(fields | kw))


@pytest.mark.parametrize("entries, error", [
    ([_manifest_entry("/../escape", Kind.DIR)], "not a clean path"),
    ([_manifest_entry("/a/b", Kind.DIR)], "not a clean path"),  # no /a
    ([_manifest_entry("/l", Kind.SYMLINK, link_target="/tmp/bootseer-outside"),
      _manifest_entry("/l/x", Kind.FIFO)], "not a clean path"),  # under a link
    ([_manifest_entry("/h", Kind.HARDLINK, link_target="/etc/shadow")], "names no file"),
])
def test_a_hostile_manifest_builds_nothing_outside(tmp_path: Path, entries, error) -> None:
    from bootseer.errors import BootseerError
    from bootseer.prefetch.metaimage import _write_tree

    root = tmp_path / "tree"
    root.mkdir()
    with pytest.raises(BootseerError, match=error):
        _write_tree(root, [_manifest_entry("/", Kind.DIR, ino=1), *entries], {})
    assert all(root in p.parents or p == root for p in tmp_path.rglob("*"))
    assert not Path("/tmp/bootseer-outside").exists() and not Path("/escape").exists()


def test_an_images_trusted_xattrs_never_reach_the_metadata_image(tmp_path: Path) -> None:
    """An image naming its own redirect (another file's bytes) or any overlay directive:
    dropped; other xattrs (file capabilities, user.*) kept. (A hard link shallower than
    its file is still one inode with it.)"""
    from bootseer.prefetch.metaimage import _write_tree

    root = tmp_path / "tree"
    root.mkdir()
    evil = {REDIRECT: b"/ab/" + b"a" * 64, "trusted.overlay.opaque": b"y", "user.ok": b"1"}
    _write_tree(root, [_manifest_entry("/", Kind.DIR, ino=1),
                       _manifest_entry("/d", Kind.DIR, xattrs={"trusted.overlay.opaque": b"y"},
                                       ino=3),
                       _manifest_entry("/f", Kind.FILE, size=5, xattrs=evil, ino=4),
                       _manifest_entry("/e", Kind.FILE, xattrs=evil, ino=5),
                       _manifest_entry("/l", Kind.HARDLINK, link_target="/d/g", ino=6),
                       _manifest_entry("/d/g", Kind.FILE, size=3, ino=6)],
                {"/f": "cd" * 32, "/d/g": "ef" * 32})
    assert os.getxattr(root / "f", REDIRECT) == b"/cd/" + b"cd" * 32  # its key's, not its own
    assert os.getxattr(root / "f", METACOPY) == b""
    assert os.getxattr(root / "f", "user.ok") == b"1"
    assert sorted(os.listxattr(root / "e")) == ["user.ok"]  # empty: no redirect at all
    assert os.listxattr(root / "d") == []
    assert os.stat(root / "l").st_ino == os.stat(root / "d" / "g").st_ino  # a link, shallower
    assert stat.S_ISREG(os.stat(root / "f").st_mode) and os.stat(root / "f").st_size == 5


def test_an_image_with_a_file_whose_blocks_do_not_add_up_gets_no_metadata_image(
        tmp_path: Path) -> None:
    """The manifest is the store's bytes: a file claiming blocks that are not its size has
    no key to redirect to, so the image gets no metadata image at all (it is served
    through FUSE, as before), and nothing is left behind."""
    from bootseer.prefetch.blockformat import BlockLocation

    mib = 1 << 20
    table = [BlockLocation(f"{n:064x}", 0, 0, 10, size) for n, size in enumerate((mib, 5))]
    entries = [_manifest_entry("/", Kind.DIR, ino=1),
               _manifest_entry("/ok", Kind.FILE, size=5, blocks=(1,), ino=2),
               _manifest_entry("/lies", Kind.FILE, size=mib + 6, blocks=(0, 1), ino=3)]
    image = SimpleNamespace(
        manifest=SimpleNamespace(block_size=mib, blocks=table, entries=entries),
        cache=NodeCache(tmp_path / "blocks", 1 << 30), image_id="sha256:" + "1" * 64)
    meta = MetaImage.of(image)
    assert meta.build(WholeFiles(image)) is False and not meta.exists()
    assert not meta.path.parent.exists() or not list(meta.path.parent.iterdir())

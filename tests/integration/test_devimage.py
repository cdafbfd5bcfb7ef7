"""bootseer_dev.image against the real thing: debootstrap, apt, overlayfs and runc.

The Debian image (minbase + a python3 layer) is built once into the user's cache (~1 min)
and reused by every later run. Nothing is mocked and nothing skips: without root,
debootstrap, runc or the Debian archive these tests fail, with the tool's own message
(scripts/install-system-deps.sh installs the tools).

The layer writer and the unpacker are also checked on a small tree made here, with every
kind of entry and change a layer can carry, and the unpacked image is compared with the
independent merge of bootseer.prefetch.rootfs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bootseer.prefetch.image_source import OCI_LAYER_GZIP, open_image
from bootseer.prefetch.rootfs import Kind, merge_layers
from bootseer_dev.image import (
    build_image,
    find_mirror,
    overlay_mount,
    read_build_info,
    run_rootfs,
    unpack_image,
)
from bootseer_dev.image import layers as layer_mod
from bootseer_dev.image.oci import (
    LAYER_GZIP_TYPE,
    History,
    append_layer,
    blob_path,
    write_layout,
)
from bootseer_dev.image.unpack import UnpackError

# --- mirror discovery ----------------------------------------------------------------------


def test_find_mirror_reads_deb822_and_one_line_sources(tmp_path: Path) -> None:
    sources = tmp_path / "debian.sources"
    sources.write_text(
        "Types: deb\nURIs: http://security.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n\n"
        "# a comment\nTypes: deb\nURIs: http://off.example/debian\nSuites: bookworm\n"
        "Enabled: no\n\n"
        "Types: deb deb-src\nURIs: http://mirror.example/debian/\n"
        "Suites: bookworm\n bookworm-updates\nComponents: main\n")
    listing = tmp_path / "sources.list"
    listing.write_text("# deb http://commented.example/debian bookworm main\n"
                       "deb-src http://src.example/debian bookworm main\n"
                       "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm "
                       "main\n")
    assert find_mirror("bookworm", [sources]) == "http://mirror.example/debian"
    assert find_mirror("bookworm", [listing]) == "http://one.example/debian"
    assert find_mirror("trixie", [sources, listing]) == "http://deb.debian.org/debian"


def test_find_mirror_on_this_machine_is_an_archive_url() -> None:
    assert find_mirror().startswith(("http://", "https://", "file:", "ftp://"))


# --- layers and unpacking, on a tree made here ---------------------------------------------


def _describe(root: Path) -> tuple[dict, set]:
    """Everything a layer must carry about a tree, and its hard-link groups."""
    out, inodes = {}, {}
    for rel, st in layer_mod.snapshot(root).items():
        path = root / rel
        digest = None
        if stat.S_ISREG(st.mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            inodes.setdefault(st.ino, set()).add(rel)
        out[rel] = (stat.S_IFMT(st.mode), stat.S_IMODE(st.mode), st.uid, st.gid, st.size,
                    st.mtime_ns // 10**9, st.link_target, st.rdev, st.xattrs, digest)
    return out, {frozenset(g) for g in inodes.values() if len(g) > 1}


def _make_base(root: Path) -> None:
    for d in ("etc", "olddir/sub", "bin", "usr/lib", "dev", "run", "swap/inner"):
        (root / d).mkdir(parents=True)
    (root / "etc/conf").write_text("v1\n")
    (root / "etc/gone").write_text("bye\n")
    (root / "olddir/a").write_text("a")
    (root / "olddir/sub/b").write_text("b")
    (root / "bin/tool").write_bytes(b"\x7fELF" + bytes(range(256)) * 40)
    (root / "bin/tool").chmod(0o755)
    os.link(root / "bin/tool", root / "bin/tool-link")
    (root / "usr/lib/lib.so").write_bytes(b"lib" * 1000)
    os.symlink("usr/lib", root / "lib64")
    os.symlink("/etc/conf", root / "abs-link")
    os.mknod(root / "dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mkfifo(root / "run/fifo", 0o600)
    (root / "suid").write_text("#!/bin/sh\n")
    os.chown(root / "suid", 1000, 1000)
    (root / "suid").chmod(0o4755)
    (root / "swap/inner/f").write_text("under a dir that becomes a file")
    (root / "flip").write_text("a file that becomes a dir")
    os.utime(root / "etc/conf", (1_600_000_000, 1_600_000_000))


def _change(root: Path) -> None:
    (root / "etc/conf.new").write_text("v2\n")
    os.replace(root / "etc/conf.new", root / "etc/conf")  # new inode, as dpkg does
    (root / "etc/gone").unlink()
    for p in ("olddir/sub/b", "olddir/a"):
        (root / p).unlink()
    (root / "olddir/sub").rmdir()
    (root / "olddir").rmdir()
    os.link(root / "usr/lib/lib.so", root / "usr/lib/lib.so.1")
    (root / "bin/tool").chmod(0o700)
    (root / "newdir").mkdir(mode=0o750)
    (root / "newdir/x").write_text("new")
    os.setxattr(root / "newdir/x", "user.bootseer", b"\x00\xffbinary")
    (root / "swap/inner/f").unlink()
    (root / "swap/inner").rmdir()
    (root / "swap").rmdir()
    (root / "swap").write_text("now a file")
    (root / "flip").unlink()
    (root / "flip").mkdir()
    (root / "flip/child").write_text("c")


def test_layers_and_unpack_round_trip_every_kind_of_change(tmp_path: Path) -> None:
    tree, layout = tmp_path / "tree", tmp_path / "image"
    tree.mkdir()
    (layout / "blobs/sha256").mkdir(parents=True)
    _make_base(tree)
    base_state = layer_mod.snapshot(tree)
    expected_base = _describe(tree)

    def store(changes, states, n):
        blob = layer_mod.write_layer(tree, changes, states, tmp_path / f"layer{n}")
        os.replace(blob.path, blob_path(layout, blob.digest))
        return blob

    layer1 = store(layer_mod.full(base_state), base_state, 1)
    _change(tree)
    after_state = layer_mod.snapshot(tree)
    changes = layer_mod.diff(base_state, after_state)
    layer2 = store(changes, after_state, 2)
    write_layout(layout, [layer1, layer2], [History("2026-01-01T00:00:00Z", "a"),
                                            History("2026-01-01T00:00:00Z", "b")],
                 cmd=["sh"], ref_name="t", created="2026-01-01T00:00:00Z")

    names = [c.arcname for c in changes]
    assert ".wh.olddir" in names and "etc/.wh.gone" in names
    assert not any(n.startswith("olddir/") for n in names)  # one whiteout for the subtree
    assert "usr/lib/lib.so" in names and "usr/lib/lib.so.1" in names  # new link: both names
    assert "lib64" not in names and "run/fifo" not in names  # unchanged: left out
    assert layer2.whiteouts == 2

    with tarfile.open(blob_path(layout, layer2.digest)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["usr/lib/lib.so.1"].islnk()
    assert members["usr/lib/lib.so.1"].linkname == "usr/lib/lib.so"
    assert members["newdir/x"].pax_headers["SCHILY.xattr.user.bootseer"].encode(
        "utf-8", "surrogateescape") == b"\x00\xffbinary"
    assert members["newdir/x"].uname == ""  # numeric ownership only

    image = open_image(layout)
    assert [layer.media_type for layer in image.layers] == [OCI_LAYER_GZIP] * 2
    assert image.config["rootfs"]["diff_ids"] == [layer1.diff_id, layer2.diff_id]

    base_only = tmp_path / "base-only"
    unpack_image(dataclasses.replace(image, layers=image.layers[:1]), base_only)
    assert _describe(base_only) == expected_base
    unpacked = unpack_image(layout, tmp_path / "unpacked")
    assert _describe(unpacked) == _describe(tree)

    with image.layers[0].open() as l1, image.layers[1].open() as l2:
        index = merge_layers([("1", l1), ("2", l2)], lambda p, f, n: n)
    assert {e.path.lstrip("/") for e in index if e.path != "/"} == set(after_state)
    assert index["/dev/null"].kind is Kind.CHAR and index["/dev/null"].devminor == 3
    assert index["/suid"].mode == 0o4755 and index["/suid"].uid == 1000
    assert index["/swap"].kind is Kind.FILE and index["/flip/child"].kind is Kind.FILE


def test_append_layer_adds_a_layer_the_image_source_reads_on_top(tmp_path: Path) -> None:
    base, extra, layout = tmp_path / "base", tmp_path / "extra", tmp_path / "image"
    (base / "etc").mkdir(parents=True)
    (base / "etc/conf").write_text("v1\n")
    (extra / "opt").mkdir(parents=True)
    (extra / "opt/ballast.bin").write_bytes(os.urandom(4096))
    states = layer_mod.snapshot(base)
    (layout / "blobs/sha256").mkdir(parents=True)
    layer = layer_mod.write_layer(base, layer_mod.full(states), states, tmp_path / "l.tmp")
    os.replace(layer.path, blob_path(layout, layer.digest))
    first = write_layout(layout, [layer], [History("2026-01-01T00:00:00Z", "base")],
                         cmd=["sh"], ref_name="t", created="2026-01-01T00:00:00Z")
    second = append_layer(layout, extra, "COPY extra /", "2026-01-02T00:00:00Z")
    assert second != first
    image = open_image(layout)
    assert image.manifest_digest == second and len(image.layers) == 2
    assert image.config["config"]["Cmd"] == ["sh"]
    assert [h["created_by"] for h in image.config["history"]] == ["base", "COPY extra /"]
    with image.layers[1].open() as stream, tarfile.open(fileobj=stream, mode="r|*") as tar:
        names = [m.name for m in tar]
    assert names == ["opt", "opt/ballast.bin"]
    index = json.loads((layout / "index.json").read_text())
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == "t"


def test_unpack_refuses_to_write_through_a_symlink(tmp_path: Path) -> None:
    tree, layout = tmp_path / "tree", tmp_path / "image"
    (tree / "etc").mkdir(parents=True)
    (layout / "blobs/sha256").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, tree / "evil")
    state = layer_mod.snapshot(tree)
    blob1 = layer_mod.write_layer(tree, layer_mod.full(state), state, tmp_path / "l1")
    os.replace(blob1.path, blob_path(layout, blob1.digest))
    (tree / "evil").unlink()
    (tree / "evil").mkdir()
    (tree / "evil/x").write_text("escaped")
    after = layer_mod.snapshot(tree)
    # A hostile layer: evil/x without the entry that turns evil into a directory.
    changes = [c for c in layer_mod.diff(state, after) if c.path != "evil"]
    blob2 = layer_mod.write_layer(tree, changes, after, tmp_path / "l2")
    os.replace(blob2.path, blob_path(layout, blob2.digest))
    write_layout(layout, [blob1, blob2], [], cmd=["sh"], ref_name="t",
                 created="2026-01-01T00:00:00Z")
    with pytest.raises(UnpackError, match="symlink"):
        unpack_image(layout, tmp_path / "dest")
    assert list(outside.iterdir()) == []


# --- the real Debian image -----------------------------------------------------------------


@pytest.fixture(scope="module")
def python_image() -> Path:
    """debian bookworm minbase + python3, from the user's cache (built on first use)."""
    return build_image(with_python=True)


@pytest.fixture(scope="module")
def python_rootfs(python_image: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack_image(python_image, tmp_path_factory.mktemp("devimage") / "rootfs")


def test_image_is_an_oci_layout_that_image_source_reads(python_image: Path) -> None:
    image = open_image(python_image)
    assert len(image.layers) == 2
    assert all(layer.media_type == LAYER_GZIP_TYPE for layer in image.layers)
    config = image.config
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert config["config"]["Cmd"] == ["python3"]
    assert any(e.startswith("PATH=/usr/local/sbin:") for e in config["config"]["Env"])
    assert len(config["rootfs"]["diff_ids"]) == 2 and len(config["history"]) == 2
    info = read_build_info(python_image)
    assert info.manifest_digest == image.manifest_digest
    assert [layer["digest"] for layer in info.layers] == [la.digest for la in image.layers]
    assert info.rootfs_bytes > 100_000_000


def test_image_layers_merge_into_debian_with_python(python_image: Path) -> None:
    image = open_image(python_image)
    with image.layers[0].open() as stream:
        base = merge_layers([("1", stream)], lambda p, f, n: n)
    with image.layers[0].open() as l1, image.layers[1].open() as l2:
        merged = merge_layers([("1", l1), ("2", l2)], lambda p, f, n: n)
    assert "/etc/debian_version" in base and "/usr/bin/python3" not in base
    assert merged["/usr/bin/python3"].kind is Kind.SYMLINK
    python = "/usr/bin/" + merged["/usr/bin/python3"].link_target
    assert merged[python].kind is Kind.FILE and merged[python].mode & 0o111
    assert merged["/dev/null"].kind is Kind.CHAR  # debootstrap's device nodes survive
    assert "/etc/resolv.conf" not in merged  # the host's DNS stays out of the image
    assert not [e.path for e in merged if e.path.startswith("/var/lib/apt/lists/")
                and e.kind is Kind.FILE and e.size > 0]
    assert len(merged) > len(base)


def test_unpacked_image_matches_the_merged_index(python_image: Path,
                                                 python_rootfs: Path) -> None:
    image = open_image(python_image)
    with image.layers[0].open() as l1, image.layers[1].open() as l2:
        merged = merge_layers([("1", l1), ("2", l2)], lambda p, f, n: n)
    on_disk = layer_mod.snapshot(python_rootfs)
    assert {"/" + p for p in on_disk} | {"/"} == set(merged.entries)
    for path in ("etc/passwd", "usr/bin/dpkg", "usr/bin/python3"):
        entry, state = merged["/" + path], on_disk[path]
        assert (entry.st_mode, entry.uid, entry.gid) == (state.mode, state.uid, state.gid)
        assert (int(entry.mtime), entry.link_target) == (state.mtime_ns // 10**9,
                                                         state.link_target)


def test_second_build_comes_from_the_cache(python_image: Path, tmp_path: Path) -> None:
    info = read_build_info(python_image)
    assert build_image(with_python=True) == python_image
    assert read_build_info(python_image) == info
    copy = build_image(tmp_path / "copy", with_python=True)
    assert copy == tmp_path / "copy"
    assert open_image(copy).manifest_digest == info.manifest_digest


def test_cli_build_prints_where_the_image_is(python_image: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli-image"
    proc = subprocess.run([sys.executable, "-m", "bootseer_dev.image", "build", "--python",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout
    assert open_image(out).manifest_digest == read_build_info(python_image).manifest_digest


def test_python_runs_in_runc_on_a_writable_overlay(python_rootfs: Path, tmp_path: Path) -> None:
    with overlay_mount(python_rootfs, tmp_path / "upper", tmp_path / "work",
                       tmp_path / "root") as root:
        proc = run_rootfs(root, ["python3", "-c", "print(6*7)"])
        assert (proc.returncode, proc.stdout.strip()) == (0, "42"), proc.stderr
        proc = run_rootfs(root, ["sh", "-c", "echo hi > /root/note && hostname && id -u"])
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["bootseer", "0"]
        assert (root / "root/note").read_text() == "hi\n"
    assert (tmp_path / "upper/root/note").read_text() == "hi\n"  # writes went to upper
    assert not (python_rootfs / "root/note").exists()  # and the lower dir is untouched
    assert not os.path.ismount(tmp_path / "root")


def test_run_rootfs_env_exit_code_and_readonly_root(python_rootfs: Path) -> None:
    proc = run_rootfs(python_rootfs, ["sh", "-c", 'echo "$GREETING"; exit 3'],
                      env={"GREETING": "hello"}, readonly=True)
    assert (proc.returncode, proc.stdout) == (3, "hello\n")
    proc = run_rootfs(python_rootfs, ["sh", "-c", "touch /etc/x"], readonly=True)
    assert proc.returncode != 0 and "Read-only" in proc.stderr
    assert not (python_rootfs / "etc/x").exists()


def test_run_rootfs_timeout_kills_the_container(python_rootfs: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_rootfs(python_rootfs, ["sleep", "60"], timeout=1, readonly=True)

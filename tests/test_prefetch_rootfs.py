"""Tests for bootseer.prefetch.rootfs: OCI layer rules, hard links, hostile input, and equivalence
with a real GNU ``tar -x`` of the same layers.

The layer builders here (``reg``, ``dir_``, ..., ``layer``, ``multi_layer_image``) are also
used by ``test_prefetch_image_source``.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import BinaryIO

import pytest

from bootseer.prefetch.rootfs import Entry, Kind, RootfsIndex, UnsafeLayerError, merge_layers

MTIME = 1_600_000_000

# --- building layer tars ------------------------------------------------------------------

Member = tuple[tarfile.TarInfo, bytes]


def _info(name: str, type_: bytes, mode: int, uid: int = 0, gid: int = 0,
          xattrs: dict[str, bytes] | None = None) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid, info.mtime = type_, mode, uid, gid, MTIME
    if xattrs:
        info.pax_headers = {f"SCHILY.xattr.{k}": v.decode("utf-8", "surrogateescape")
                            for k, v in xattrs.items()}
    return info


def reg(name: str, data: bytes = b"", mode: int = 0o644, **kw) -> Member:
    info = _info(name, tarfile.REGTYPE, mode, **kw)
    info.size = len(data)
    return info, data


def dir_(name: str, mode: int = 0o755, **kw) -> Member:
    return _info(name, tarfile.DIRTYPE, mode, **kw), b""


def sym(name: str, target: str) -> Member:
    info = _info(name, tarfile.SYMTYPE, 0o777)
    info.linkname = target
    return info, b""


def hard(name: str, target: str, mode: int = 0o600) -> Member:
    info = _info(name, tarfile.LNKTYPE, mode, uid=99, gid=99)  # tar ignores these
    info.linkname = target
    return info, b""


def dev(name: str, type_: bytes, major: int, minor: int, mode: int = 0o660, gid: int = 0
        ) -> Member:
    info = _info(name, type_, mode, gid=gid)
    info.devmajor, info.devminor = major, minor
    return info, b""


def fifo(name: str, mode: int = 0o600) -> Member:
    return _info(name, tarfile.FIFOTYPE, mode), b""


def whiteout(directory: str, name: str) -> Member:
    return reg(f"{directory}/.wh.{name}" if directory else f".wh.{name}")


def opaque(directory: str) -> Member:
    return reg(f"{directory}/.wh..wh..opq")


def raw(name: str, type_: bytes, data: bytes = b"") -> Member:
    info = _info(name, type_, 0o644)
    info.size = len(data)
    return info, data


def layer(*members: Member) -> bytes:
    """A PAX tar, as ``docker save``/buildkit write them."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


BIG = random.Random(5).randbytes(300_000)
LONG_NAME = "long/" + "n" * 150
LONG_TARGET = "../" + "t" * 140


def multi_layer_image() -> list[bytes]:
    """Three layers that exercise every rule the merge implements."""
    base = layer(
        dir_("./"),
        dir_("etc/"), reg("etc/passwd", b"root:x:0:0\n"),
        reg("etc/shadow", b"root:*:1::::::\n", 0o640, gid=42),
        dir_("bin/"), reg("bin/su", b"su", 0o4755), reg("bin/sg", b"sg", 0o2755),
        dir_("tmp", 0o1777),
        reg("usr/lib/libx.so.1", b"ELF"),  # usr/ and usr/lib/ implicit
        sym("usr/lib/libx.so", "libx.so.1"), sym("lib", "usr/lib"),
        sym("abs", "/etc/passwd"), sym("up", "../../../../etc"),
        dir_("dev/"), dev("dev/null", tarfile.CHRTYPE, 1, 3, 0o666),
        dev("dev/sda", tarfile.BLKTYPE, 8, 0, gid=6), dir_("run/"), fifo("run/fifo"),
        dir_("data/"), reg("data/big.bin", BIG),
        reg("data/hl-a", b"shared", 0o755, uid=7, gid=8), hard("data/hl-b", "data/hl-a"),
        hard("./data/hl-c", "./data/hl-a"),
        reg("caps/ping", b"ping", 0o755,
            xattrs={"user.bin": b"\x01\x00\xff\xfe", "trusted.bootseer": b"y",
                    "user.text": b"caf\xc3\xa9"}),
        dir_("whdir/"), reg("whdir/keep", b"k"), reg("whdir/gone", b"g"),
        dir_("subtree/"), reg("subtree/a/b/c", b"c"),
        dir_("opq/"), reg("opq/lower1", b"1"), dir_("opq/sub/"), reg("opq/sub/lower2", b"2"),
        dir_("dir2file/"), reg("dir2file/child", b"child"),
        reg("file2dir", b"was a file"),
        dir_("dir2dir/"), reg("dir2dir/kept", b"kept"),
        reg("over", b"version 1", 0o644),
        dir_("linkbreak/"), reg("linkbreak/a", b"old"), hard("linkbreak/b", "linkbreak/a"),
        sym("sym2file", "/nowhere"),
        dir_("uids/"), reg("uids/f", b"u", 0o600, uid=1000, gid=1000),
        reg(LONG_NAME, b"long"), sym("longlink", LONG_TARGET),
        reg("café/ünï.txt", "ünï".encode()),
    )
    middle = layer(
        dir_("./"),
        whiteout("whdir", "gone"), whiteout("", "subtree"),
        dir_("opq/"), opaque("opq"), reg("opq/new", b"new"),
        reg("dir2file", b"now a file"),
        dir_("file2dir/", 0o750), reg("file2dir/inside", b"inside"),
        dir_("dir2dir/", 0o700, uid=1000),
        reg("over", b"version 2", 0o600),
        reg("linkbreak/a", b"new"),
        reg("sym2file", b"was a symlink"),
        hard("data/hl-d", "data/hl-a"),  # a link to a lower layer's file
        reg("etc/passwd", b"root:x:0:0\nuser:x:1000:1000\n", xattrs={"user.v": b"2"}),
        whiteout("etc", "shadow"),
        reg("newdir/nested/deep.txt", b"deep"),
    )
    top = layer(
        whiteout("", "dir2file"), whiteout("opq", "new"),
        reg("whdir/gone", b"back again"),
        reg("bin/su", b"su", 0o755),
        dir_("subtree/"),
        whiteout("data", "hl-a"),  # the group lives on as hl-b, hl-c, hl-d
    )
    return [base, middle, top]


# --- merging ------------------------------------------------------------------------------


def sha_store(path: str, fileobj: BinaryIO, size: int) -> str:
    data = fileobj.read()
    assert len(data) == size, path
    return hashlib.sha256(data).hexdigest()


def merge(*layers: bytes) -> RootfsIndex[str]:
    return merge_layers([(f"L{i}", io.BytesIO(t)) for i, t in enumerate(layers)], sha_store)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class OneWay(io.RawIOBase):
    """A pipe-like stream: reading works, seeking and telling fail."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._data.readinto(buffer)

    def seekable(self) -> bool:
        return False

    def seek(self, *args) -> int:
        raise io.UnsupportedOperation("seek")

    def tell(self) -> int:
        raise io.UnsupportedOperation("tell")


@pytest.fixture
def nothing_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run in an empty working directory and check it is still empty afterwards."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    yield work
    assert list(work.iterdir()) == []


def test_merged_view_of_the_multi_layer_image(nothing_written):
    index = merge(*multi_layer_image())
    assert index["/"].kind is Kind.DIR and index["/"].ino == 1
    assert index.listdir("/whdir") == ("gone", "keep")
    assert index["/whdir/gone"].content == digest(b"back again")
    assert "/etc/shadow" not in index and "/subtree/a" not in index
    assert index.listdir("/subtree") == ()
    assert index.listdir("/opq") == ()  # lower contents hidden in L1, "new" whited out in L2
    assert "/dir2file" not in index and "/dir2file/child" not in index
    assert index["/file2dir"].kind is Kind.DIR and index["/file2dir"].mode == 0o750
    assert index["/dir2dir"].mode == 0o700 and index["/dir2dir"].uid == 1000
    assert index.listdir("/dir2dir") == ("kept",)
    assert index["/over"].content == digest(b"version 2") and index["/over"].mode == 0o600
    assert index["/bin/su"].mode == 0o755 and index["/bin/sg"].mode == 0o2755
    assert index["/tmp"].st_mode == stat.S_IFDIR | 0o1777
    assert index["/usr"].mode == 0o755 and index["/usr"].mtime == 0  # implicit
    assert index["/lib"].link_target == "usr/lib" and index["/up"].link_target.startswith("..")
    assert index["/longlink"].link_target == LONG_TARGET
    assert index[f"/{LONG_NAME}"].content == digest(b"long")
    assert index["/café/ünï.txt"].size == len("ünï".encode())
    assert (index["/dev/sda"].kind, index["/dev/sda"].devmajor, index["/dev/sda"].gid) == (
        Kind.BLOCK, 8, 6)
    assert index["/caps/ping"].xattrs == {"user.bin": b"\x01\x00\xff\xfe",
                                          "trusted.bootseer": b"y", "user.text": b"caf\xc3\xa9"}
    assert index["/data/big.bin"].content == digest(BIG)
    # The hard link group survives the whiteout of the name it was created under.
    group = index.hardlink_groups[index["/data/hl-b"].ino]
    assert group == ("/data/hl-b", "/data/hl-c", "/data/hl-d")
    first, *others = (index[p] for p in group)
    assert first.kind is Kind.FILE and first.nlink == 3
    assert all(e.kind is Kind.HARDLINK and e.link_target == "/data/hl-b" for e in others)
    assert {(e.ino, e.nlink, e.mode, e.uid, e.content) for e in (first, *others)} == {
        (first.ino, 3, 0o755, 7, digest(b"shared"))}
    # Overwriting one name of a group breaks the link, as on disk.
    assert index["/linkbreak/a"].content == digest(b"new")
    assert index["/linkbreak/b"].content == digest(b"old")
    assert index["/linkbreak/b"].kind is Kind.FILE and index["/linkbreak/b"].nlink == 1
    assert index["/linkbreak/a"].ino != index["/linkbreak/b"].ino
    assert not any(".wh." in e.path for e in index)


def test_order_is_deterministic_tree_order():
    index = merge(layer(reg("b/z"), reg("a-b"), reg("a/c"), reg("a/b")))
    assert list(index.entries) == ["/", "/a", "/a/b", "/a/c", "/a-b", "/b", "/b/z"]
    assert [e.ino for e in index] == [1, 2, 3, 4, 5, 6, 7]
    assert index.listdir("/") == ("a", "a-b", "b")
    assert index["/"].nlink == 4 and index["/a"].nlink == 2


def test_store_content_sees_every_file_of_every_layer_and_reads_one_way():
    calls = []

    def store(path: str, fileobj: BinaryIO, size: int) -> int:
        calls.append((path, size, fileobj.read(3)))  # reads part only: the rest is skipped
        return len(calls)

    layers = multi_layer_image()
    index = merge_layers([(f"L{i}", OneWay(t)) for i, t in enumerate(layers)], store)
    expected = []
    for data in layers:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            expected += [(m, tar.extractfile(m).read(3)) for m in tar
                         if m.isreg() and ".wh." not in m.name]
    assert [(p, s, head) for p, s, head in calls] == [
        ("/" + m.name.removeprefix("./"), m.size, head) for m, head in expected]
    assert index["/over"].content == max(
        number for number, (path, _, _) in enumerate(calls, 1) if path == "/over")


def test_same_layer_entries_survive_a_marker_in_any_order():
    lower = layer(reg("d/old"), dir_("d/sub/", 0o700, uid=5), reg("d/sub/old"))
    for marker in (opaque("d"), whiteout("d", "sub")):
        before, after = (merge(lower, layer(*order))
                         for order in ((marker, reg("d/sub/new")), (reg("d/sub/new"), marker)))
        assert before == after
        assert after.listdir("/d/sub") == ("new",)
        assert (after["/d/sub"].mode, after["/d/sub"].uid) == (0o755, 0)  # implicit now


def test_whiteout_hides_lower_only_and_a_missing_target_is_a_no_op():
    index = merge(layer(reg("a"), reg("b")),
                  layer(whiteout("", "a"), reg("c"), whiteout("", "c"), whiteout("", "zz")))
    assert index.listdir("/") == ("b", "c")


def test_opaque_marker_in_root_and_readding_after_whiteout():
    index = merge(layer(reg("a"), reg("b/c")), layer(opaque(""), reg("x")),
                  layer(reg("b/c", b"again")))
    assert index.listdir("/") == ("b", "x") and index["/b"].mtime == 0


def test_dir_replaced_by_symlink_removes_the_subtree():
    index = merge(layer(reg("d/f")), layer(sym("d", "/elsewhere")))
    assert index["/d"].kind is Kind.SYMLINK and "/d/f" not in index
    assert "/d" not in index.children


def test_hardlink_in_the_same_layer_and_relinking():
    index = merge(layer(reg("f", b"x", 0o700), hard("h", "f"), hard("h", "f")))
    assert index.hardlink_groups == {index["/f"].ino: ("/f", "/h")}
    assert index["/h"].mode == 0o700 and index["/h"].uid == 0  # the target's, not the header's


def test_sparse_files_are_expanded(tmp_path: Path):
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.write(b"head")
        f.seek(1 << 20)
        f.write(b"tail")
    expected = digest(sparse.read_bytes())
    for fmt in ("gnu", "posix"):
        out = subprocess.run(["tar", "--sparse", f"--format={fmt}", "-cf", "-", "-C",
                              str(tmp_path), "sparse"], check=True, capture_output=True).stdout
        entry = merge(out)["/sparse"]
        assert (entry.size, entry.content) == ((1 << 20) + 4, expected)


# --- hostile input ------------------------------------------------------------------------

REJECTED = {
    "dot-dot": [layer(reg("../escape"))],
    "dot-dot-inside": [layer(reg("a/../../escape"))],
    "dot-dot-alone": [layer(dir_(".."))],
    "symlink-parent-absolute": [layer(sym("a", "/etc")), layer(reg("a/passwd"))],
    "symlink-parent-relative": [layer(sym("a", "../../..")), layer(reg("a/x/y"))],
    "symlink-parent-same-layer": [layer(dir_("a/"), sym("a", "/etc"), reg("a/passwd"))],
    "symlink-parent-whiteout": [layer(sym("a", "/etc")), layer(whiteout("a", "passwd"))],
    "symlink-parent-opaque": [layer(sym("a", "/etc")), layer(opaque("a"))],
    "symlink-parent-dir": [layer(sym("a", "/")), layer(dir_("a/etc/"))],
    "hardlink-through-symlink": [layer(sym("a", "/etc")), layer(hard("h", "a/passwd"))],
    "file-parent": [layer(reg("f")), layer(reg("f/x"))],
    "device-parent": [layer(dev("null", tarfile.CHRTYPE, 1, 3), reg("null/x"))],
    "hardlink-missing": [layer(hard("h", "nothing"))],
    "hardlink-dot-dot": [layer(reg("f")), layer(hard("h", "../f"))],
    "hardlink-directory": [layer(dir_("d/"), hard("h", "d"))],
    "hardlink-itself": [layer(reg("h"), hard("h", "h"))],
    "hardlink-whited-out": [layer(reg("f")), layer(whiteout("", "f"), hard("h", "f"))],
    "root-not-a-dir": [layer(reg("./"))],
    "contiguous-file": [layer(raw("c", tarfile.CONTTYPE, b"data"))],
    "unknown-type": [layer(raw("v", b"V"))],
    "gnu-dumpdir": [layer(raw("d", b"D"))],
    "empty-symlink-target": [layer(sym("s", ""))],
    "whiteout-of-dot-dot": [layer(reg("a/.wh..."))],
    "whiteout-of-dot": [layer(reg("a/.wh.."))],
    "whiteout-of-nothing": [layer(reg(".wh."))],
    "below-a-whiteout-name": [layer(reg(".wh.x/y"))],
    "not-a-tar": [b"this is not a tar archive at all" * 40],
    "truncated": [layer(reg("f", BIG))[:5000]],
}


@pytest.mark.parametrize("layers", REJECTED.values(), ids=REJECTED.keys())
def test_hostile_layers_are_rejected(layers, nothing_written):
    with pytest.raises(UnsafeLayerError, match=r"layer L\d"):
        merge(*layers)


def test_rejection_names_layer_entry_and_reason():
    with pytest.raises(UnsafeLayerError) as info:
        merge(layer(sym("a", "/etc")), layer(reg("./a/passwd")))
    assert str(info.value) == ("layer L1: entry './a/passwd': its parent /a is a symlink "
                               "(to /etc); refusing to write through it")


def test_absolute_names_are_stripped_with_a_warning(nothing_written, caplog):
    victim = nothing_written / "pwned"
    with caplog.at_level(logging.WARNING, "bootseer.prefetch.rootfs"):
        index = merge(layer(reg(str(victim), b"x"), reg("/etc/passwd"), hard("/h", "/etc/passwd"),
                            sym("/s", str(victim))))
    assert not victim.exists()
    assert f"{victim}" in index and index["/h"].kind is Kind.HARDLINK
    assert index["/s"].link_target == str(victim)  # stored verbatim, never followed
    assert sum("absolute name" in r.message for r in caplog.records) == 1


def test_duplicates_in_one_layer_last_wins_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, "bootseer.prefetch.rootfs"):
        index = merge(layer(reg("f", b"1"), reg("f", b"2", 0o600), dir_("d/"), reg("d/x"),
                            reg("d", b"file")))
    assert index["/f"].content == digest(b"2") and index["/f"].mode == 0o600
    assert index["/d"].kind is Kind.FILE and "/d/x" not in index
    assert sum("appears twice" in r.message for r in caplog.records) == 2


def test_hardlink_to_a_non_file_is_a_copy(caplog):
    with caplog.at_level(logging.WARNING, "bootseer.prefetch.rootfs"):
        index = merge(layer(sym("s", "/target"), fifo("p"), hard("hs", "s"), hard("hp", "p")))
    assert index["/hs"].kind is Kind.SYMLINK and index["/hs"].link_target == "/target"
    assert index["/hp"].kind is Kind.FIFO and index["/hp"].ino != index["/p"].ino
    assert index.hardlink_groups == {}
    assert sum("storing a copy" in r.message for r in caplog.records) == 2


def test_aufs_metadata_is_skipped(caplog):
    with caplog.at_level(logging.WARNING, "bootseer.prefetch.rootfs"):
        index = merge(layer(reg(".wh..wh.aufs"), reg(".wh..wh.plnk/123.456"), reg("f")))
    assert index.listdir("/") == ("f",)
    assert sum("AUFS" in r.message for r in caplog.records) == 2


def test_symlinks_to_outside_are_kept_but_never_followed():
    index = merge(layer(sym("etc", "/host-etc"), sym("up", "../../../..")),
                  layer(reg("up2", b"x")))
    assert index["/etc"].link_target == "/host-etc" and index["/up"].st_mode == (
        stat.S_IFLNK | 0o777)


def test_deep_nesting_does_not_recurse():
    deep = "/".join(["d"] * 1500)
    index = merge(layer(reg(deep + "/f")), layer(whiteout("", "d")))
    assert list(index.entries) == ["/"]


# --- equivalence with a real tar -x -------------------------------------------------------


def extract_like_a_runtime(layers: list[bytes], root: Path, scratch: Path) -> None:
    """Apply layers the way a runtime over plain ``tar -x`` does: a non-directory replaces
    a directory tree, then whiteouts and opaque markers remove lower-layer paths."""
    for number, data in enumerate(layers):
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = [(m.name.removeprefix("./").rstrip("/"), m) for m in tar]
        markers = [n for n, _ in members if n.rsplit("/", 1)[-1].startswith(".wh.")]
        this_layer = set()
        for name, _ in members:
            parts = name.split("/")
            if name not in markers:
                this_layer.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
        for name, member in members:
            path = root / name
            if name and not member.isdir() and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
        tar_file = scratch / f"layer{number}.tar"
        tar_file.write_bytes(data)
        subprocess.run(["tar", "-x", "--xattrs", "--xattrs-include=*", "--same-owner", "-p",
                        "--numeric-owner", "-f", str(tar_file), "-C", str(root)],
                       check=True, umask=0o022)
        for marker in markers:
            directory, _, base = marker.rpartition("/")
            if base == ".wh..wh..opq":
                targets = [f"{directory}/{c}".lstrip("/") for c in os.listdir(root / directory)]
            else:
                targets = [f"{directory}/{base[4:]}".lstrip("/")]
            for target in targets:
                _remove_lower(root, target, this_layer)
            (root / marker).unlink(missing_ok=True)


def _remove_lower(root: Path, name: str, this_layer: set[str]) -> None:
    path = root / name
    if not os.path.lexists(path):
        return
    if name in this_layer:
        if path.is_dir() and not path.is_symlink():
            for child in os.listdir(path):
                _remove_lower(root, f"{name}/{child}", this_layer)
    elif path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _describe(st_mode: int, uid: int, gid: int, size: int, mtime: float, target: str | None,
              xattrs: dict, rdev: tuple[int, int], content: str | None, nlink: int) -> dict:
    is_dir = stat.S_ISDIR(st_mode)
    return dict(mode=st_mode, uid=uid, gid=gid, nlink=nlink, target=target, xattrs=xattrs,
                rdev=rdev, content=content, size=None if is_dir else size,
                mtime=None if is_dir else int(mtime))


def describe_disk(root: Path) -> tuple[dict[str, dict], set[frozenset[str]]]:
    found, inodes = {}, {}
    for dirpath, dirnames, filenames in os.walk(root):
        names = [""] if Path(dirpath) == root else []
        for name in names + dirnames + filenames:
            path = os.path.join(dirpath, name) if name else dirpath
            relative = os.path.relpath(path, root)
            key = "/" if relative == "." else "/" + relative
            st = os.lstat(path)
            is_link, is_file = stat.S_ISLNK(st.st_mode), stat.S_ISREG(st.st_mode)
            dev = stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            xattrs = {} if is_link else {n: os.getxattr(path, n, follow_symlinks=False)
                                         for n in os.listxattr(path, follow_symlinks=False)}
            found[key] = _describe(
                st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime,
                os.readlink(path) if is_link else None, xattrs,
                (os.major(st.st_rdev), os.minor(st.st_rdev)) if dev else (0, 0),
                digest(Path(path).read_bytes()) if is_file else None, st.st_nlink)
            if is_file:
                inodes.setdefault(st.st_ino, set()).add(key)
    return found, {frozenset(g) for g in inodes.values()}


def describe_index(index: RootfsIndex[str]) -> tuple[dict[str, dict], set[frozenset[str]]]:
    def one(e: Entry[str]) -> dict:
        return _describe(e.st_mode, e.uid, e.gid, e.size, e.mtime,
                         e.link_target if e.kind is Kind.SYMLINK else None, dict(e.xattrs),
                         (e.devmajor, e.devminor), e.content, e.nlink)

    groups: dict[int, set[str]] = {}
    for e in index:
        if e.kind in (Kind.FILE, Kind.HARDLINK):
            groups.setdefault(e.ino, set()).add(e.path)
    return {e.path: one(e) for e in index}, {frozenset(g) for g in groups.values()}


def test_merge_equals_real_tar_extraction(tmp_path: Path, nothing_written):
    layers = multi_layer_image()
    root = tmp_path / "rootfs"
    root.mkdir()
    extract_like_a_runtime(layers, root, tmp_path)
    on_disk, disk_groups = describe_disk(root)
    in_index, index_groups = describe_index(merge(*layers))
    assert sorted(in_index) == sorted(on_disk)
    for path in on_disk:
        assert in_index[path] == on_disk[path], path
    assert index_groups == disk_groups
    assert any(len(g) == 3 for g in disk_groups)

"""Tests for bootseer.prefetch.rootfs: OCI layer rules, hard links, hostile input.

The layer builders live in ``support/layers.py``; the equivalence with a real GNU ``tar -x``
(root) is ``integration/test_prefetch_rootfs_tar.py``.
"""

from __future__ import annotations

import io
import logging
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import BinaryIO

import pytest
from support.layers import (
    BIG,
    LONG_NAME,
    LONG_TARGET,
    dev,
    digest,
    dir_,
    fifo,
    hard,
    layer,
    merge,
    multi_layer_image,
    opaque,
    raw,
    reg,
    sym,
    whiteout,
)

from bootseer.prefetch.rootfs import Kind, UnsafeLayerError, merge_layers


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

"""The multi-layer test image and its layer builders (``reg``, ``dir_``, ..., ``layer``),
the merge used to index them, and a real ``tar -x`` of the same layers to compare with: shared
by the rootfs, image-source, lazy-image and FUSE-conformance tests."""

from __future__ import annotations

import hashlib
import io
import os
import random
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import BinaryIO

from bootseer.prefetch.rootfs import Entry, Kind, RootfsIndex, merge_layers

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

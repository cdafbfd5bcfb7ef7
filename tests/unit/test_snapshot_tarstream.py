"""The shard tar reader against what ``tarfile`` writes, and against what it must refuse."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from bootseer.snapshot.tarstream import MalformedStream, Member, TarStream, TruncatedStream, _number


def _tar(members: list[tuple[tarfile.TarInfo, bytes]], fmt=tarfile.PAX_FORMAT) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return raw.getvalue()


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _symlink(name: str, target: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, b""


def _read_all(data: bytes, buffer_size: int = 1024, read_every: bool = True):
    stream = TarStream(io.BytesIO(data), buffer_size=buffer_size)
    out = []
    for member in stream:
        content = b"".join(bytes(v) for v in stream.content()) if read_every else None
        out.append((member, content))
    return out


LONG = "0/" + "/".join(["d" * 60] * 4) + "/file.py"  # > 100 bytes: a PAX path record
ODD = os.fsdecode(b"0/caf\xe9-not-utf8")  # surrogate-escaped, written as hdrcharset=BINARY
MEMBERS = [
    _file("0/empty", b""),
    _file("0/one-block", b"x" * 512),
    _file("0/big", os.urandom(5000)),  # several buffer refills at 1 KiB
    _file(LONG, b"long name"),
    _file("0/naïve-ünïcode", b"utf-8 name"),
    _file(ODD, b"bytes name"),
    _symlink("0/link", "../some/where"),
    _symlink("0/long-link", "/" + "t" * 150),  # a PAX linkpath record
]


@pytest.mark.parametrize("buffer_size", [512, 1024, 1 << 20])
def test_reads_back_what_tarfile_writes(buffer_size) -> None:
    got = _read_all(_tar(MEMBERS), buffer_size)
    assert [m for m, _ in got] == [
        Member(info.name, "symlink" if info.issym() else "file", len(data), info.linkname)
        for info, data in MEMBERS]
    assert [c for _, c in got] == [data for _, data in MEMBERS]


def test_unread_content_is_skipped() -> None:
    got = _read_all(_tar(MEMBERS), read_every=False)
    assert [m.name for m, _ in got] == [info.name for info, _ in MEMBERS]


def test_a_ustar_prefix_is_joined() -> None:
    name = "0/" + "p" * 120 + "/leaf"  # ustar splits it into prefix + name
    got = _read_all(_tar([_file(name, b"data")], fmt=tarfile.USTAR_FORMAT))
    assert got == [(Member(name, "file", 4, ""), b"data")]


def test_a_stream_without_end_blocks_ends_cleanly() -> None:
    data = _tar([_file("0/a", b"abc")])
    assert len(_read_all(data[:1024])) == 1  # header + one padded block, no end blocks


# PAX header block 0-512, its records 512-1024, the member's header 1024-1536, content after
@pytest.mark.parametrize("cut", [100, 600, 1500, 2000])
def test_a_cut_stream_is_truncated(cut) -> None:
    data = _tar([_file(LONG, os.urandom(3000))])
    with pytest.raises(TruncatedStream):
        _read_all(data[:cut])


@pytest.mark.parametrize("kind", [tarfile.DIRTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE,
                                  tarfile.FIFOTYPE])
def test_members_a_shard_never_holds_are_refused(kind) -> None:
    info = tarfile.TarInfo("0/thing")
    info.type, info.linkname = kind, "0/other" if kind == tarfile.LNKTYPE else ""
    with pytest.raises(MalformedStream, match="only files and symlinks"):
        _read_all(_tar([(info, b"")]))


def test_gnu_long_names_are_refused() -> None:
    with pytest.raises(MalformedStream):
        _read_all(_tar([_file(LONG, b"x")], fmt=tarfile.GNU_FORMAT))


def test_garbage_is_refused() -> None:
    junk = bytearray(_tar([_file("0/a", b"abc")]))
    junk[124:136] = b"not octal!!\0"
    with pytest.raises(MalformedStream, match="not octal"):
        _read_all(bytes(junk))


def test_numbers_in_octal_and_base_256() -> None:
    assert _number(b"00000001750\0") == 0o1750
    assert _number(b"\x80" + (9 << 30).to_bytes(11, "big")) == 9 << 30


def test_a_pax_header_over_the_shard_limit_is_refused_before_it_is_read() -> None:
    """A header claiming 400 MB of PAX records: refused from the header field alone (the
    reader would otherwise buffer all of it)."""
    from bootseer.snapshot.tarstream import MAX_PAX_BYTES

    header = bytearray(512)
    header[0:9] = b"PaxHeader"
    header[124:136] = b"%011o\0" % (400 << 20)
    header[156:157] = b"x"
    stream = TarStream(io.BytesIO(bytes(header) + bytes(1024)), buffer_size=1024)
    with pytest.raises(MalformedStream, match=f"at most {MAX_PAX_BYTES}"):
        list(stream)
    long_name = [_file("0/" + "n" * 4000, b"fits")]  # PATH_MAX-sized: well within
    assert [m.name for m, _ in _read_all(_tar(long_name))] == ["0/" + "n" * 4000]

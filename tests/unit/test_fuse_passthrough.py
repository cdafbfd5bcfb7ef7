"""The passthrough decisions of a connection, without the kernel: what a taking-over
server reads back from its predecessor's log, and what a fresh connection forgets.
(Registering backing files with a real FUSE connection: test_fuse_conformance.py.)"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from bootseer.fuse import passthrough
from bootseer.fuse.passthrough import Passthrough, PassthroughCounts
from bootseer.fuse.tree import Backing, Node, Tree


class NeverAsked(Tree):
    """A tree whose nodes have versions, and which must not be asked for backing files."""

    def __init__(self) -> None:
        self.version = 7

    def node(self, ino: int) -> Node | None:
        return None

    def lookup(self, parent: int, name: str) -> Node | None:
        return None

    def readdir(self, ino: int) -> list:
        return []

    def read(self, ino: int, handle: int, offset: int, size: int) -> bytes:
        return b""

    def content_version(self, ino: int) -> int:
        return self.version

    def backing(self, ino: int) -> Backing | None:
        raise AssertionError(f"asked for node {ino}'s backing file")


def test_a_successor_keeps_the_logged_decisions_and_ignores_a_torn_last_one(
        tmp_path: Path) -> None:
    log = tmp_path / "takeover.json.backing"
    records = [passthrough._RECORD.pack(5, 7, 3), passthrough._RECORD.pack(6, 7, 0)]
    log.write_bytes(b"".join(records) + passthrough._RECORD.pack(8, 7, 4)[:5])
    counts = PassthroughCounts()
    tree = NeverAsked()
    decided = Passthrough(-1, tree, log, fresh=False, counts=counts)
    try:
        assert (decided.backing_id(5), decided.backing_id(6)) == (3, 0)
        assert counts.inherited == 2
        tree.version = 8  # the file changed: a new version is decided afresh
        with pytest.raises(AssertionError, match="node 5"):
            decided.backing_id(5)
    finally:
        decided.close()


def test_a_fresh_connection_starts_a_fresh_log(tmp_path: Path) -> None:
    log = tmp_path / "takeover.json.backing"
    log.write_bytes(passthrough._RECORD.pack(5, 7, 3))
    Passthrough(-1, NeverAsked(), log, fresh=True, counts=PassthroughCounts()).close()
    assert log.read_bytes() == b""
    assert log.stat().st_mode & 0o777 == 0o600


def test_a_log_past_its_bound_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(passthrough, "MAX_LOG_BYTES", 40)
    log = tmp_path / "takeover.json.backing"
    log.write_bytes(passthrough._RECORD.pack(5, 7, 3) * 3)
    with pytest.raises(OSError) as info:
        Passthrough(-1, NeverAsked(), log, fresh=False, counts=PassthroughCounts())
    assert info.value.errno == errno.EFBIG


def test_only_a_process_with_cap_sys_admin_asks_for_passthrough() -> None:
    status = Path("/proc/self/status").read_text()
    effective = int(next(line for line in status.splitlines()
                         if line.startswith("CapEff:")).split()[1], 16)
    assert passthrough.may_pass_through() == bool(effective >> 21 & 1)

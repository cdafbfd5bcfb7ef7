"""CheckpointTree on its own (no FUSE): node numbers, handles, limits, and a listing that
never holds up reads of files already open."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

from bootseer.fuse.tree import ROOT
from bootseer.store.local import LocalStore
from bootseer.stripedfs import tree as tree_module
from bootseer.stripedfs.tree import CheckpointTree, node_number


class StallingStore(LocalStore):
    """``list`` blocks while ``stall`` is set (a slow NameNode); ``listing`` says it began."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.stall, self.listing, self.release = False, threading.Event(), threading.Event()

    def list(self, prefix: str = ""):
        if self.stall:
            self.listing.set()
            assert self.release.wait(30)
        return super().list(prefix)


@pytest.fixture
def store(tmp_path: Path) -> StallingStore:
    (tmp_path / "ckpt" / "rank0").mkdir(parents=True)
    (tmp_path / "ckpt" / "rank0" / "model.bin").write_bytes(bytes(range(256)) * 64)
    return StallingStore(f"file://{tmp_path / 'ckpt'}")


def test_node_numbers_are_the_same_in_every_process_and_handles_are_recreated(store) -> None:
    first, second = CheckpointTree(store), CheckpointTree(store)
    directory = first.lookup(ROOT, "rank0")
    assert directory is not None and directory.ino == node_number("/rank0")
    node = first.lookup(directory.ino, "model.bin")
    assert node == second.lookup(second.lookup(ROOT, "rank0").ino, "model.bin")
    handle = first.open(node.ino)
    # A successor never saw this handle: it opens the file again under it.
    assert second.read(node.ino, handle, 256, 4) == bytes(range(4))
    second.release(node.ino, handle)
    assert [name for name, _ in first.readdir(ROOT)] == [".", "..", "rank0"]
    with pytest.raises(OSError) as info:
        first.readdir(node.ino)
    assert info.value.errno == errno.ENOTDIR


def test_open_files_are_capped(store, monkeypatch) -> None:
    monkeypatch.setattr(tree_module, "MAX_OPEN", 2)
    tree = CheckpointTree(store)
    ino = node_number("/rank0/model.bin")
    tree.open(ino), tree.open(ino)
    with pytest.raises(OSError) as info:
        tree.open(ino)
    assert info.value.errno == errno.ENFILE


def test_a_slow_listing_never_holds_up_reads_of_open_files(store) -> None:
    tree = CheckpointTree(store, ttl=0.0)  # every metadata call lists again
    ino = node_number("/rank0/model.bin")
    handle = tree.open(ino)
    store.stall = True
    lister = threading.Thread(target=tree.node, args=(ROOT,))
    lister.start()
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(tree.read(ino, handle, 0, 8)))
    try:
        assert store.listing.wait(30)
        reader.start()
        reader.join(10)  # the listing still stalls: the read must not wait for it
        assert not reader.is_alive() and read == [bytes(range(8))]
    finally:
        store.release.set()
        lister.join(30)
        reader.join(30)

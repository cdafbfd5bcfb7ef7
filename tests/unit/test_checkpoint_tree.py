"""CheckpointTree on its own (no FUSE): node numbers, handles, limits, a listing that never
holds up reads of files already open, and staged copies offered as backing files."""

from __future__ import annotations

import errno
import hashlib
import threading
from pathlib import Path

import pytest

from bootseer.fuse.tree import ROOT
from bootseer.nodecache import NodeCache
from bootseer.store.local import LocalStore
from bootseer.stripedfs import tree as tree_module
from bootseer.stripedfs.checkpoint_cache import CheckpointCache, object_url
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


def stage(cache: CheckpointCache, store: LocalStore, key: str, data: bytes) -> None:
    """Stage ``data`` as the copy of ``key`` as ``warm --checkpoint`` does (bytes, record)."""
    tmp = cache.begin()
    tmp.write_bytes(data)
    cache.commit(tmp, object_url(store, key), store.stat(key), hashlib.sha256(data).hexdigest(),
                 None)


def test_a_current_staged_copy_backs_its_file_and_a_rewritten_file_is_decided_afresh(
        store, tmp_path: Path) -> None:
    """The kernel may read a file's staged copy in its place only while the copy is of
    what the store holds; a rewrite is a new content version, whose copy is no more."""
    cache = CheckpointCache(tmp_path / "ckpt-cache",
                            NodeCache(tmp_path / "ckpt-cache" / "copies", 1 << 30))
    tree = CheckpointTree(store, copies=cache, ttl=0.0)
    ino = node_number("/rank0/model.bin")
    assert tree.offers_backing and not CheckpointTree(store).offers_backing
    assert tree.backing(ino) is None  # nothing staged
    stage(cache, store, "rank0/model.bin", bytes(range(256)) * 64)
    version = tree.content_version(ino)
    backing = tree.backing(ino)
    assert backing is not None
    with open(backing.fd, "rb") as f:
        assert f.read() == bytes(range(256)) * 64
    (tmp_path / "ckpt" / "rank0" / "model.bin").write_bytes(b"rewritten")
    assert tree.content_version(ino) != version
    assert tree.backing(ino) is None  # the copy is of the old bytes
    assert tree.backing(node_number("/rank0")) is None  # a directory has none

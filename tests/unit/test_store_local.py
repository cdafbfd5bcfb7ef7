"""The ``file://`` backend: the store contract, plus what only a local directory can show."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.store_contract import GIB, StoreContract

from bootseer.errors import BackendUnavailableError
from bootseer.store import BlobStore, open_store
from bootseer.store.local import LocalStore


class TestLocalStore(StoreContract):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"file://{tmp_path}/store"


def test_sparse_content_stays_sparse_on_disk(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    with store.open_writer() as w:
        w.write(b"x")
        for _ in range(1024):
            w.write(bytes(1 << 20))
        w.write(b"y")
        w.commit("big")
    path = tmp_path / "store" / "big"
    assert path.stat().st_size == GIB + 2
    assert path.stat().st_blocks * 512 < 1 << 20
    assert store.read_range("big", GIB + 1, 1) == b"y"


def test_temporaries_of_dead_writers_are_swept(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    (tmp_path / ".tmp").mkdir()
    dead = tmp_path / ".tmp" / "abcd.999999999"  # no such PID
    dead.write_bytes(b"partial")
    live = store.open_writer()  # our own, in progress
    live.write(b"in flight")
    assert list(store.list()) == []  # temporaries are never listed
    assert store.sweep_temporaries(older_than=0) == 1
    assert not dead.exists()
    live.commit("done")
    assert store.get("done") == b"in flight"


def test_failed_commit_removes_the_temporary(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    store.put("k", b"1")
    with pytest.raises(FileExistsError):
        store.put("k", b"2", overwrite=False)
    assert os.listdir(tmp_path / ".tmp") == []


def test_a_commit_describes_what_it_published_though_another_writer_replaced_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process may replace (or remove) a key the moment a commit renames it into
    place; the commit still succeeded and says what it wrote (a CI run once saw a member
    die here: it stat-ed the key again after the rename)."""
    store = LocalStore(str(tmp_path))
    rename = os.replace

    def then_another_writer(src: str, dst: str) -> None:
        rename(src, dst)
        Path(dst).write_bytes(b"another, longer object")

    monkeypatch.setattr(os, "replace", then_another_writer)
    info = store.put("k", b"mine")
    assert (info.key, info.size) == ("k", 4)
    monkeypatch.setattr(os, "replace", lambda src, dst: (rename(src, dst), os.unlink(dst)))
    assert store.put("gone", b"mine too").size == 8


def test_blob_layout_is_plain_files(tmp_path: Path) -> None:
    """Operators can check a blob with sha256sum: the content is stored unchanged."""
    blobs = BlobStore(LocalStore(str(tmp_path)))
    info = blobs.put(b"plain")
    hexd = info.digest.removeprefix("sha256:")
    assert (tmp_path / "blobs" / "sha256" / hexd[:2] / hexd).read_bytes() == b"plain"


def test_store_urls(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert open_store(f"file://{tmp_path}").root == tmp_path
    with pytest.raises(BackendUnavailableError, match="no store backend for 's3://'"):
        open_store("s3://bucket/x")
    with pytest.raises(ValueError, match="host"):
        open_store("file://otherhost/x")


def test_reads_never_follow_a_symlink_below_the_root(tmp_path: Path) -> None:
    """A checkpoint directory is written by jobs and read by the root agent: a link
    planted there is not an object, whatever it points to."""
    root = tmp_path / "store"
    store = LocalStore(str(root))
    store.put("real/file", b"data")
    (root / "link").symlink_to("/etc/passwd")
    (root / "dir-link").symlink_to("/etc")
    os.mkfifo(root / "fifo")  # opening it must not block either
    for key in ("link", "dir-link/passwd", "fifo"):
        with pytest.raises(OSError):
            store.stat(key)
        with pytest.raises(OSError):
            store.read_range(key, 0, 1)
    assert [i.key for i in store.list()] == ["real/file"]
    assert [i.key for i in store.list("dir-link/")] == []
    assert store.read_range("real/file", 0, 4) == b"data"
    root_link = tmp_path / "alias"
    root_link.symlink_to(root)  # the root itself is the operator's: followed
    assert LocalStore(str(root_link)).read_range("real/file", 0, 4) == b"data"


def test_small_objects_are_refused_over_their_limit_before_they_are_read(tmp_path) -> None:
    from bootseer.errors import SizeLimitError

    store = LocalStore(str(tmp_path))
    store.put("refs/big", b"x" * 100)
    with pytest.raises(SizeLimitError, match="over the 64 bytes"):
        store.get("refs/big", max_size=64)
    blobs = BlobStore(store)
    digest = blobs.put(b"y" * 100).digest
    with pytest.raises(SizeLimitError):
        blobs.get(digest, max_size=64)
    assert blobs.get(digest, max_size=100) == b"y" * 100

"""Whole files and FUSE passthrough on a lazy image's mount: what ``bootseer warm`` keeps
whole, what a hostile manifest cannot make whole, and that a start that records still
sees every read while a start that does not leaves its reads to the kernel."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

from support.images import BIG, MIB, MIB_BLOCKS, big_image, bootseer, recorded_big_image
from support.pagecache import drop_cached, resident_mib

from bootseer.mounts import unmount
from bootseer.nodecache import NodeCache
from bootseer.prefetch import hotlist
from bootseer.prefetch.blockformat import BlockLocation, FileEntry
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.rootfs import Kind
from bootseer.prefetch.wholefiles import WholeFiles
from bootseer.store import BlobStore, open_store

_names = iter(range(1 << 30))


def _entry(size: int, blocks: tuple[int, ...], path: str = "") -> FileEntry:
    """A file of ``size`` bytes made of ``blocks`` (a path of its own unless given)."""
    return FileEntry(path or f"/f{next(_names)}", Kind.FILE, 0o644, 0, 0, size, 0.0, None,
                     {}, 0, 0, 2, 1, blocks)


def test_a_file_whose_blocks_do_not_add_up_is_never_made_whole(tmp_path: Path) -> None:
    """The manifest is the store's bytes: a file may claim blocks of other sizes than its
    own (another file's blocks, or sizes that lie). Such a file has no key, so nothing is
    ever written or named for it."""
    table = [BlockLocation(f"{n:064x}", 0, 0, 10, size)
             for n, size in enumerate((MIB, MIB, 5, MIB - 1))]
    files = WholeFiles(SimpleNamespace(manifest=SimpleNamespace(block_size=MIB, blocks=table),
                                       cache=NodeCache(tmp_path, 1 << 30),
                                       image_id="sha256:" + "0" * 64))
    assert files.key(_entry(2 * MIB + 5, (0, 1, 2))) is not None
    assert files.key(_entry(2 * MIB + 5, (0, 1, 2))) == files.key(_entry(2 * MIB + 5, (0, 1, 2),
                                                                          "/other"))
    assert files.key(_entry(2 * MIB + 5, (0, 2, 1))) is None  # a short block inside
    assert files.key(_entry(2 * MIB + 6, (0, 1, 2))) is None  # the size lies
    assert files.key(_entry(2 * MIB, (0, 1, 2))) is None  # more blocks than the size holds
    assert files.key(_entry(MIB + 5, (0, 3))) is None  # a last block of the wrong size
    assert files.key(_entry(0, ())) is None  # nothing to back
    assert files.key(_entry(5, (2,))) != files.key(_entry(MIB - 1, (3,)))
    # Nor is anything opened or read ahead for one (the ranges come from the same claims).
    assert files.read_ahead(_entry(2 * MIB + 6, (0, 1, 2)), [(0, 2 * MIB + 6)]) is False
    assert files.open(_entry(MIB + 5, (0, 3))) is None


def test_warm_keeps_the_files_it_stages_whole_and_root_only(dirs) -> None:
    """(Without fetching, as a job's warm through peers does, only a file whose blocks
    are all on the node is made whole.)"""
    bootseer("image", "convert", str(big_image(dirs["image"])), "--name", "big", *MIB_BLOCKS,
             store=dirs["store"], cache=dirs["cache"])
    image = LazyImage(BlobStore(open_store(str(dirs["store"]))), "big",
                      NodeCache(dirs["cache"] / "blocks", 1 << 30), readahead_blocks=0)
    big = image.lookup("/data/big.bin")
    image.read(big, 0, 10)  # one block of six on the node
    assert WholeFiles(image).make_whole([big], fetch=False) == 0
    assert image.stats.blocks_fetched == 1 and not WholeFiles(image).any()
    out = json.loads(bootseer("warm", "--json", "--image", "big", "--all", "--no-agent",
                              store=dirs["store"], cache=dirs["cache"]).stdout)
    assert out["image"]["whole_files"] == 2
    backing = WholeFiles(image).open(image.lookup("/data/big.bin"))
    assert backing is not None
    with open(backing.fd, "rb") as f:
        assert f.read() == BIG
    path = WholeFiles(image).cache.path(backing.key)
    assert path.parent.parent.parent == dirs["cache"] / "files"  # beside the blocks, apart
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.parent.stat().st_mode & 0o777 == 0o700


def _start(dirs: dict[str, Path], workload: str, *, record: bool, passthrough: bool) -> dict:
    """Mount the image (recording or not), read blocks 3, 1 and 4 of big.bin and all of
    small.txt through it, unmount; the server's report."""
    report = dirs["run"] / "report.json"
    report.unlink(missing_ok=True)
    env = {"BOOTSEER_IMAGE_PASSTHROUGH": str(passthrough).lower()}
    bootseer("image", "mount", "big", str(dirs["mnt"]), "--workload", workload, "--no-prefetch",
             *(["--record"] if record else []), "--report", str(report),
             store=dirs["store"], cache=dirs["cache"], env=env)
    try:
        with open(dirs["mnt"] / "data/big.bin", "rb", buffering=0) as f:
            for n in (3, 1, 4):
                f.seek(n * MIB)
                assert f.read(100) == BIG[n * MIB : n * MIB + 100]
        assert (dirs["mnt"] / "data/small.txt").read_bytes() == b"small\n"
    finally:
        unmount(dirs["mnt"])
    return _report_at(report)


def _report_at(report: Path) -> dict:
    """The report an unmounted mount's server writes on its way out."""
    deadline = time.monotonic() + 30
    while not report.exists():
        assert time.monotonic() < deadline, "no report"
        time.sleep(0.1)
    return json.loads(report.read_text())


def test_a_recording_start_sees_every_read_and_a_later_start_passes_through(dirs) -> None:
    """Before any file is whole, a mount does not ask for passthrough (its opens cost no
    round trip). Every file whole: a first start that records is served as without
    passthrough, so its hot list is the same as with passthrough off; a start that does
    not record opens both files in passthrough and the server reads nothing."""
    bootseer("image", "convert", str(big_image(dirs["image"])), "--name", "big", *MIB_BLOCKS,
             store=dirs["store"], cache=dirs["cache"])
    report = _start(dirs, "w", record=False, passthrough=True)
    requests = report["fuse_requests"]  # one OPEN, answered ENOSYS: no more are sent
    assert (requests["open"], "release" in requests, requests["read"] > 0) == (1, False, True)
    bootseer("warm", "--image", "big", "--all", "--no-agent", store=dirs["store"],
             cache=dirs["cache"])
    blobs = BlobStore(open_store(str(dirs["store"])))
    image = LazyImage(blobs, "big", NodeCache(dirs["cache"] / "blocks", 1 << 30))

    def recorded(passthrough: bool) -> tuple[list[tuple[str, str]], dict]:
        workload = f"passthrough-{passthrough}"  # a hot list of its own
        report = _start(dirs, workload, record=True, passthrough=passthrough)
        hot = hotlist.load(blobs, image.image_id, workload, image.manifest)
        assert hot is not None and hot.recordings == 1
        return sorted((b.digest, b.path) for b in hot.blocks), report

    without, _ = recorded(False)
    with_passthrough, report = recorded(True)
    assert with_passthrough == without and len(without) == 4
    assert report["fuse_requests"].get("open_passthrough", 0) == 0
    assert report["passthrough"]["registered"] == 0

    report = _start(dirs, "w", record=False, passthrough=True)
    assert report["fuse_requests"]["open_passthrough"] == 2
    assert report["fuse_requests"].get("read", 0) == 0
    assert report["passthrough"] == {"registered": 2, "served": 0, "inherited": 0,
                                     "refused": 0}


def test_a_passed_through_files_hot_blocks_are_read_ahead_by_the_kernel(dirs) -> None:
    """The server pushes no pages of a file the kernel reads from its whole file: once
    the file is looked up, the kernel is asked to read that file's hot blocks (1, 3 and 4
    of big.bin) ahead, and only those."""
    image_id = recorded_big_image(dirs)
    bootseer("warm", "--image", "big", "--all", "--no-agent", store=dirs["store"],
             cache=dirs["cache"])
    image = LazyImage(BlobStore(open_store(str(dirs["store"]))), image_id,
                      NodeCache(dirs["cache"] / "blocks", 1 << 30))
    whole = WholeFiles(image)
    key = whole.key(image.lookup("/data/big.bin"))
    assert key is not None
    path = whole.cache.path(key)
    drop_cached(path)
    report = dirs["run"] / "report.json"
    bootseer("image", "mount", "big", str(dirs["mnt"]), "--workload", "train", "--report",
             str(report), store=dirs["store"], cache=dirs["cache"])
    try:
        assert (dirs["mnt"] / "data/big.bin").stat().st_size == len(BIG)
        deadline = time.monotonic() + 30
        while resident_mib(path) != [False, True, False, True, True, False]:
            assert time.monotonic() < deadline, resident_mib(path)
            time.sleep(0.05)
    finally:
        unmount(dirs["mnt"])
    body = _report_at(report)
    assert (body["read_ahead"]["files"], body["read_ahead"]["bytes"]) == (1, 3 * MIB)
    assert body["read_ahead"]["cpu_s"] > 0  # the asking thread's, counted apart
    assert body["pages_pushed"]["pushes"] == 0

"""``bootseer warm`` and record-then-prefetch end to end: real FUSE mounts, real runc
containers on the Debian + python3 image, and the real HDFS cluster as the store."""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from support.images import BIG, MIB, big_image, bootseer, recorded_big_image

from bootseer.nodecache import NodeCache
from bootseer.prefetch import hotlist
from bootseer.prefetch.convert import convert
from bootseer.prefetch.image_source import open_image
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.warm import warm_image
from bootseer.store import BlobStore, open_store


def test_warm_stages_the_hot_blocks_then_a_mount_reads_nothing_from_the_store(dirs) -> None:
    recorded_big_image(dirs)
    out = bootseer("warm", "--image", "big", "--workload", "train", "--json",
                   store=dirs["store"], cache=dirs["cache"])
    summary = json.loads(out.stdout)["image"]
    assert summary["complete"] and summary["hot_list"] and summary["blocks"] == 3
    assert summary["fetched_blocks"] == 3 and summary["fetch_requests"] <= 3
    again = json.loads(bootseer("warm", "--image", "big", "--workload", "train", "--json",
                                store=dirs["store"], cache=dirs["cache"]).stdout)["image"]
    assert again["already_local"] == 3 and again["fetched_blocks"] == 0
    # Everything the start needs is local: the manifest and the hot blocks. Remove the
    # image's packs and hot pack from the store: the warmed blocks still read.
    blobs = BlobStore(open_store(str(dirs["store"])))
    image = LazyImage(blobs, summary["image_id"], NodeCache(dirs["cache"] / "blocks", 1 << 30),
                      readahead_blocks=0)
    for pack in (dirs["store"] / "packs").iterdir():
        pack.unlink()
    entry = image.lookup("/data/big.bin")
    for n in (1, 3, 4):
        assert image.read(entry, n * MIB, MIB) == BIG[n * MIB : (n + 1) * MIB]
    assert image.stats.blocks_fetched == 0


def test_a_warm_sharing_its_image_ends_when_the_blocks_are_on_disk(dirs, monkeypatch) -> None:
    """Warms of one image share its LazyImage (the agent's way). One that finds the hot
    blocks already fetched by another waits until they are in the node's cache, not only
    until their bytes have arrived: else it ends first and counts them missing."""
    recorded_big_image(dirs)
    blobs = BlobStore(open_store(str(dirs["store"])))
    cache = NodeCache(dirs["cache"] / "blocks", 1 << 30)
    lazy = LazyImage(blobs, "big", cache, prefetch_memory=0)
    hotlist.load(blobs, lazy.image_id, "train", cache=cache)  # cached: only blocks go slow
    fetched, write = threading.Event(), threading.Event()
    put_many = cache.put_many

    def slow_put_many(entries) -> None:  # the first warm's blocks reach the disk late
        entries = list(entries)
        fetched.set()
        assert write.wait(10)
        put_many(entries)

    monkeypatch.setattr(cache, "put_many", slow_put_many)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(warm_image, blobs, cache, "big", "train", lazy=lazy)
        assert fetched.wait(10)
        second = pool.submit(warm_image, blobs, cache, "big", "train", lazy=lazy)
        time.sleep(0.5)
        assert not second.done()  # it waits for the first warm's blocks to be on disk
        write.set()
        results = [first.result(10), second.result(10)]
    assert [(r.complete, r.missing) for r in results] == [(True, 0), (True, 0)]
    assert results[1].fetched == 0  # the first warm fetched them, once


def test_warm_without_a_hot_list_stages_the_manifest_and_says_so(dirs) -> None:
    recorded_big_image(dirs)
    out = bootseer("warm", "--image", "big", "--workload", "other", store=dirs["store"],
                   cache=dirs["cache"])
    assert "no hot list for workload 'other'" in out.stderr and out.returncode == 0
    out = bootseer("warm", "--image", "big", "--workload", "other", "--all", "--json",
                   store=dirs["store"], cache=dirs["cache"])
    assert json.loads(out.stdout)["image"]["blocks"] == 7  # every block of the image


def test_warm_exit_status_says_when_not_everything_is_local(dirs) -> None:
    recorded_big_image(dirs)
    tiny = bootseer("--debug", "warm", "--image", "big", "--workload", "train", "--json",
                    store=dirs["store"], cache=dirs["cache"], check=False,
                    env={"BOOTSEER_IMAGE_CACHE_SIZE": "1m"})
    assert tiny.returncode == 3, tiny.stderr
    assert json.loads(tiny.stdout)["image"]["missing"] >= 2 and "too small" in tiny.stderr
    for pack in (dirs["store"] / "packs").iterdir():
        pack.unlink()
    gone = bootseer("warm", "--image", "big", "--workload", "train", store=dirs["store"],
                    cache=dirs["cache"] / "fresh", check=False)
    assert gone.returncode == 3 and "are not local" in gone.stderr
    missing = bootseer("warm", "--image", "nope", store=dirs["store"], cache=dirs["cache"],
                       check=False)
    assert missing.returncode == 1 and missing.stderr.startswith("error:")


def test_record_then_prefetch_a_real_python_start_in_runc(dirs, tmp_path: Path) -> None:
    """First start records (ended by the ready file), the second prefetches it."""
    from bootseer_dev.image import build_image

    bootseer("image", "convert", str(build_image(with_python=True)), "--name", "py",
             store=dirs["store"], cache=dirs["cache"])
    script = ("python3 -c 'import json, decimal, email.parser; print(1)'; "
              "touch \"$BOOTSEER_READY_FILE\"; sleep 0.5; "
              "cat /usr/bin/perl > /dev/null; echo done $BOOTSEER_IMAGE_ID")
    first = tmp_path / "first.json"
    run = bootseer("image", "run", "--record", "--workload", "t", "--stats", str(first), "py",
                   "--", "sh", "-c", script, store=dirs["store"], cache=dirs["cache"])
    image_id = BlobStore(open_store(str(dirs["store"]))).get_ref("images/py").digest
    assert run.stdout.split() == ["1", "done", image_id]  # the base of env snapshot keys
    recorded = json.loads(first.read_text())["recording"]
    assert recorded["ended"] == "ready" and recorded["hot_blocks"] > 5
    assert "recorded this start (ready)" in run.stderr
    blobs = BlobStore(open_store(str(dirs["store"])))
    image_id = blobs.get_ref("images/py").digest
    hot = hotlist.load(blobs, image_id, "t")
    paths = {b.path for b in hot.blocks}
    assert "/usr/bin/python3.11" in paths and "/usr/bin/perl" not in paths  # after ready
    second = tmp_path / "second.json"
    bootseer("image", "run", "--no-record", "--workload", "t", "--stats", str(second), "py",
             "--", "python3", "-c", "import json, decimal, email.parser; print(1)",
             store=dirs["store"], cache=dirs["cache"] / "cold")
    stats = json.loads(second.read_text())
    pre = stats["prefetch"]
    assert pre["hot_blocks"] == len(hot.blocks) and pre["hot_pack"] and pre["done"]
    assert pre["fetch_requests"] <= 3  # a few large reads of the hot pack
    # The prefetched blocks reached the start: put in the page cache once their file was
    # looked up (those reads never reach the server), or found or waited for by reads.
    from_prefetch = stats["pages_pushed"]["pushes"] + stats["prefetch_hits"] + \
        stats["prefetch_waits"]
    assert from_prefetch >= len(hot.blocks) // 2, stats
    assert stats["blocks_fetched"] <= 2, stats  # reads hardly ever went to the store
    assert "recording" not in stats


def test_the_ready_file_ends_a_recording_and_default_runs_record_until_three(dirs,
                                                                             tmp_path) -> None:
    from bootseer_dev.image import build_image

    bootseer("image", "convert", str(build_image(with_python=True)), "--name", "py",
             store=dirs["store"], cache=dirs["cache"])
    stats = tmp_path / "s.json"
    for n in (1, 2, 3, 4):
        bootseer("image", "run", "--stats", str(stats), "py", "--", "sh", "-c",
                 "python3 -c 'print(1)'; touch \"$BOOTSEER_READY_FILE\"; sleep 0.4",
                 store=dirs["store"], cache=dirs["cache"] / str(n))
        recording = json.loads(stats.read_text()).get("recording")
        if n <= 3:
            assert recording["ended"] == "ready" and recording["recordings"] == n
        else:
            assert recording is None  # three recordings merged: the list has converged


def test_record_prefetch_and_warm_on_hdfs(hdfs_cluster, tmp_path: Path) -> None:
    """The hot list, the hot pack and the prefetch against the real HDFS cluster."""
    root = f"/test-prefetch-{uuid.uuid4().hex[:8]}"
    blobs = BlobStore(open_store(f"{hdfs_cluster.namenode_rpc_url}{root}"))
    result = convert(open_image(big_image(tmp_path / "image")), blobs, name="big",
                     block_size=MIB)
    image = LazyImage(blobs, "big", NodeCache(tmp_path / "c1", 1 << 30), readahead_blocks=0)
    image.recorder = hotlist.Recorder(image.image_id, "h")
    for n in (5, 0, 2):
        image.read(image.lookup("/data/big.bin"), n * MIB, 10)
    hot = hotlist.save(blobs, image.recorder.stop(), image.manifest)
    assert blobs.store.stat(hot.layout.pack).size == hot.layout.size
    cache = NodeCache(tmp_path / "c2", 1 << 30)
    warmed = warm_image(blobs, cache, "big", "h")
    assert warmed.complete and warmed.fetched == 3 and warmed.detail["fetch_requests"] <= 3
    assert warmed.detail["image_id"] == result.image_id
    image = LazyImage(blobs, "big", cache, readahead_blocks=0)
    for n in (5, 0, 2):
        assert image.read(image.lookup("/data/big.bin"), n * MIB, MIB) == \
            BIG[n * MIB : (n + 1) * MIB]
    assert image.stats.blocks_fetched == 0

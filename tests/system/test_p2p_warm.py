"""`bootseer warm --job` through peers (#17).

First, in this process: publishing a snapshot or a hot pack publishes torrents; staging
through a :class:`~bootseer.p2p.Fanout` (a real swarm on the loopback, no peers) verifies,
caches and seeds, and stops seeding what the cache evicts; warm requests check their job,
nodes and peers.

Then real agents on fleet-lab nodes with [p2p] on, the lab's HDFS behind one capped
DataNode: four nodes warm an environment snapshot and an image's recorded hot pack at
once, and the DataNode's egress counter (tc) says how often the bytes left the store.
Those start HDFS in the lab's own namespaces on base port 19550: run this module under
`flock /tmp/hdfs-tests.lock` like every test that starts the dev cluster.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
from support.images import BIG, MIB, MIB_BLOCKS, big_image
from support.images import bootseer as lazy_cli
from support.lab import need_lab_tools
from support.snapshots import bootseer as snapshot_cli
from support.wait import wait_until

from bootseer.agents.mountapi import PeerFileRead, PeerRead
from bootseer.agents.warm import WarmRequest
from bootseer.errors import SizeLimitError
from bootseer.nodecache import NodeCache
from bootseer.p2p import Fanout, Peer, publish_torrent, rendezvous, torrents
from bootseer.p2p.trust import Networks, PeerKey, Trust
from bootseer.prefetch import hotlist
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.warm import warm_image
from bootseer.snapshot.manifest import Manifest, Shard
from bootseer.snapshot.restore import manifest_blob
from bootseer.snapshot.stage import stage_snapshot
from bootseer.store import BlobStore, open_store
from bootseer_dev import netns
from bootseer_dev.fleet import Lab, LabSpec
from bootseer_dev.fleet.nodes import agent_env
from bootseer_dev.fleet.spec import P2P_PORT

PY = sys.executable
NODES = 4
ENV_KEY = "p2pw-env"
#: The snapshot's content: three random files (as large compressed), one shard each.
ENV_FILE_BYTES = 4 << 20
SHARD_SIZE = "4MiB"
IMAGE = "py"
#: A checkpoint directory of two shards, in the lab's HDFS (1 MiB blocks).
CKPT = "p2pw-ckpt"
CKPT_SHARD_BYTES = 6 << 20
SEED_AFTER_START = 2.0


# -- in this process -----------------------------------------------------------------------


def _shards(blobs: BlobStore, key: str) -> tuple[Shard, ...]:
    _, data = manifest_blob(blobs, key)
    return Manifest.decode(data, key).shards


def test_a_published_snapshot_is_staged_through_a_fanout_verified_and_seeded(
        tmp_path: Path, local_swarm) -> None:
    store_dir, target = tmp_path / "store", tmp_path / "venv"
    target.mkdir()
    write = f"head -c 300000 /dev/urandom > {target}/a; head -c 1M /dev/urandom > {target}/b"
    snapshot_cli("env", "snapshot", "--key", "k", "--path", str(target), "--", "sh", "-c",
                 write, store=store_dir, env={"BOOTSEER_SNAPSHOT_SHARD_SIZE": "256KiB"})
    blobs = BlobStore(open_store(store_dir.as_uri()))
    shards = _shards(blobs, "k")
    assert len(shards) == 2  # one ends inside a torrent piece
    manifest = blobs.get_ref("env/k")
    # published with the snapshot, beside each shard and beside the manifest
    for digest, size in [(s.digest, s.size) for s in shards] + [(manifest.digest,
                                                                  manifest.size)]:
        assert torrents.load(blobs.store, digest, size).size == size
    cache = NodeCache(tmp_path / "cache" / "snapshots", 1 << 30)
    with local_swarm() as swarm:
        fanout = Fanout(swarm, ())
        staged = stage_snapshot(blobs, cache, "k", fanout=fanout)
        assert staged.complete and staged.fetched == 2 and staged.peer_bytes == 0
        assert staged.store_bytes == staged.bytes  # no peers: all from the store
        # the manifest came through the swarm too
        assert sorted(r.store_bytes for r in fanout.results) == \
            sorted([*(s.size for s in shards), manifest.size])
        for digest in [s.digest for s in shards] + [manifest.digest]:
            hexd = digest.removeprefix("sha256:")
            assert hashlib.sha256(cache.path(hexd).read_bytes()).hexdigest() == hexd
        assert not list((cache.directory / "tmp").iterdir())
        assert swarm.stats().seeding == 3
        cache.drop(shards[0].digest.removeprefix("sha256:"))  # evicted: no longer seeded
        wait_until(lambda: swarm.stats().seeding == 2)
        again = stage_snapshot(blobs, cache, "k", fanout=Fanout(swarm, ()))
        assert (again.already_local, again.fetched) == (1, 1)


def test_a_recorded_hot_pack_is_warmed_whole_through_a_fanout(tmp_path: Path, local_swarm) -> None:
    store_dir, cache_dir = tmp_path / "store", tmp_path / "cache"
    lazy_cli("image", "convert", str(big_image(tmp_path)), "--name", "big", *MIB_BLOCKS,
             store=store_dir, cache=cache_dir)
    blobs = BlobStore(open_store(store_dir.as_uri()))
    recorder_cache = NodeCache(tmp_path / "recorder", 1 << 30)
    image = LazyImage(blobs, "big", recorder_cache, readahead_blocks=0)
    image.recorder = hotlist.Recorder(image.image_id, "train")
    for n in (3, 1, 4):
        image.read(image.lookup("/data/big.bin"), n * MIB, 10)
    layout = hotlist.save(blobs, image.recorder.stop(), image.manifest, recorder_cache).layout
    assert layout is not None
    hexd = layout.pack.removeprefix("packs/")
    assert hexd in recorder_cache  # the recorder keeps its copy, to seed
    assert torrents.load(blobs.store, "sha256:" + hexd, layout.size).size == layout.size
    image_id = blobs.get_ref("images/big").digest
    hot_id = hotlist.latest_ref(blobs, image_id, "train")[1].digest
    small = [image_id, hot_id]  # the image's manifest and its hot list
    for digest in small:  # published with a torrent, like the pack
        assert torrents.load(blobs.store, digest, blobs.stat(digest).size)
    cache = NodeCache(cache_dir / "node", 1 << 30)
    with local_swarm() as swarm:
        fanout = Fanout(swarm, ())
        result = warm_image(blobs, cache, "big", "train", fanout=fanout)
        assert result.complete and result.items == 3 and result.fetched == 3
        # The pack whole through the swarm (its pieces from the store: no peers), then
        # the blocks from that copy: no ranged read of the store.
        assert (result.store_bytes, result.detail["fetch_requests"]) == (layout.size, 0)
        # the manifest and the hot list came through the swarm too, and are seeded
        assert sorted(r.digest for r in fanout.results) == sorted([*small, "sha256:" + hexd])
        assert hexd in cache and swarm.stats().seeding == 3
        # A pack without a torrent (recorded before they were published): ranged reads.
        blobs.store.delete(torrents.key("sha256:" + hexd))
        other = NodeCache(cache_dir / "other", 1 << 30)
        ranged = warm_image(blobs, other, "big", "train", fanout=Fanout(swarm, ()))
        assert ranged.complete and ranged.detail["fetch_requests"] >= 1 and hexd not in other
    entry = LazyImage(blobs, "big", cache, readahead_blocks=0).lookup("/data/big.bin")
    for pack in (store_dir / "packs").iterdir():  # the warmed blocks need no store
        pack.unlink()
    warmed = LazyImage(blobs, "big", cache, readahead_blocks=0)
    for n in (1, 3, 4):
        assert warmed.read(entry, n * MIB, MIB) == BIG[n * MIB : (n + 1) * MIB]
    assert warmed.stats.blocks_fetched == 0
    # The start after the warm (its image server) finds the hot list in the node's cache.
    blobs.store.delete(blobs.blob_key(hot_id))
    assert hotlist.load(blobs, image_id, "train", cache=cache) == \
        hotlist.HotList.decode(cache.get(hot_id.removeprefix("sha256:")))


def test_a_small_object_over_its_limit_is_refused_before_a_byte_is_read(
        tmp_path: Path, local_swarm) -> None:
    """A manifest or hot list comes through the swarm only within its size limit: a
    larger one (a store writer's) is refused from its size alone, nothing is cached."""
    blobs = BlobStore(open_store((tmp_path / "store").as_uri()))
    data = os.urandom(100_000)
    digest = blobs.put(data).digest
    assert publish_torrent(blobs.store, digest, data)  # from the bytes in memory
    cache = NodeCache(tmp_path / "cache", 1 << 30)
    with local_swarm() as swarm:
        fanout = Fanout(swarm, ())
        with pytest.raises(SizeLimitError):
            fanout.cache_blob(blobs, digest, cache, max_size=len(data) - 1)
        assert digest.removeprefix("sha256:") not in cache and fanout.results == []
        result = fanout.cache_blob(blobs, digest, cache, max_size=len(data))
        assert result is not None and result.store_bytes == len(data)
        assert cache.get(digest.removeprefix("sha256:")) == data
        assert fanout.cache_blob(blobs, digest, cache) is None  # cached: seeded, not read


def test_a_torrent_that_cannot_be_published_does_not_fail_the_publish(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blobs = BlobStore(open_store((tmp_path / "store").as_uri()))
    data = os.urandom(100_000)
    digest = blobs.put(data).digest
    wrong = tmp_path / "wrong"
    wrong.write_bytes(os.urandom(100_000))  # not the blob's bytes
    with caplog.at_level(logging.WARNING, logger="bootseer.p2p.publish"):
        assert not publish_torrent(blobs.store, digest, wrong)
    assert "could not publish the torrent" in caplog.text
    right = tmp_path / "right"
    right.write_bytes(data)
    assert publish_torrent(blobs.store, digest, right)
    assert not publish_torrent(blobs.store, digest, right)  # there already


def test_an_image_conversion_publishes_each_packs_torrent(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    lazy_cli("image", "convert", str(big_image(tmp_path)), "--name", "big", *MIB_BLOCKS,
             store=store_dir, cache=tmp_path / "cache")
    blobs = BlobStore(open_store(store_dir.as_uri()))
    packs = LazyImage(blobs, "big", NodeCache(tmp_path / "c", 1 << 30)).manifest.packs
    assert packs
    for key in packs:  # hashed while the pack was streamed to the store
        size = blobs.store.stat(key).size
        torrent = torrents.load(blobs.store, "sha256:" + key.removeprefix("packs/"), size)
        pack = tmp_path / torrent.hex
        pack.write_bytes(blobs.store.get(key))
        assert torrent.data == torrents.build(torrent.digest, size, pack,
                                              torrents.piece_size_for(size, torrents.DEMAND_PIECE))


def test_a_demand_read_without_peers_or_torrent_is_refused(tmp_path: Path, local_swarm) -> None:
    from bootseer.p2p.demand import DemandReads, NotShared
    from bootseer.p2p.publish import leaf_hasher, publish_layer
    from bootseer.prefetch.blockformat import pack_digest

    store = open_store((tmp_path / "store").as_uri())
    data = os.urandom(3 << 20)
    hexd = hashlib.sha256(data).hexdigest()
    store.put("packs/" + hexd, data)
    store.put("packs/" + "b" * 64, data)  # no torrent
    hasher = leaf_hasher()
    hasher.update(data)
    assert publish_layer(store, "sha256:" + hexd, hasher)
    with local_swarm() as swarm:
        demand = DemandReads(swarm, store, tmp_path / "partial", "n0", 0.5,
                             digest_of=pack_digest)
        for key in ("packs/" + hexd, "packs/" + "b" * 64, "blobs/x", "packs/../../etc"):
            with pytest.raises(NotShared):  # alone in the job; no torrent; not a pack
                demand.read("j", key, 0, 1 << 20)
        assert demand.snapshot().fallbacks == 4 and demand.snapshot().reads == 0


def test_peer_reads_check_what_a_server_asks() -> None:
    body = {"job": "train-7", "pack": "packs/" + "a" * 64, "offset": 0, "length": 1 << 20}
    assert PeerRead.from_json(body).to_json() == body
    for bad in ({"pack": "packs/../etc"}, {"pack": "blobs/sha256/" + "a" * 64},
                {"offset": -1}, {"length": 0}, {"length": 1 << 40}, {"length": True},
                {"offset": 1.5}, {"job": "../x"}, {"extra": 1}):
        with pytest.raises(ValueError):
            PeerRead.from_json(body | bad)
    body = {"job": "train-7", "url": "hdfs://nn:9000/ckpt/x", "size": 10 << 20,
            "mtime": 1.5e9, "offset": 1 << 20, "length": 4 << 20}
    assert PeerFileRead.from_json(body).to_json() == body
    for bad in ({"url": "x\n"}, {"url": ""}, {"url": 7}, {"size": -1}, {"size": 1.0},
                {"mtime": float("nan")}, {"mtime": "now"}, {"mtime": True},
                {"offset": 9 << 20},  # past the end
                {"length": 0}, {"length": 1 << 40}, {"job": "../x"}, {"pack": "x"}):
        with pytest.raises(ValueError):
            PeerFileRead.from_json(body | bad)


def test_warm_requests_check_their_job_nodes_and_peers() -> None:
    body = {"envs": ["k"], "job": "train-7", "nodes": 4,
            "peers": ["198.19.0.2:6881", "198.19.0.1:6881", "198.19.0.2:6881"]}
    request = WarmRequest.from_json(body)
    assert (request.job, request.nodes) == ("train-7", 4)
    assert [str(p) for p in request.peers] == ["198.19.0.1:6881", "198.19.0.2:6881"]
    assert WarmRequest.from_json(request.to_json()) == request
    for bad in ({"job": "-rf"}, {"job": "../x"}, {"nodes": 0}, {"nodes": True},
                {"nodes": 5000}, {"peers": "198.19.0.1:6881"}, {"peers": ["host:6881"]},
                {"peers": ["198.19.0.1"]}, {"peers": ["198.19.0.1:0"]}):
        with pytest.raises(ValueError):
            WarmRequest.from_json(body | bad)


def test_members_are_gathered_until_the_expected_number_announced(tmp_path: Path) -> None:
    store = open_store((tmp_path / "store").as_uri())
    trust = Trust(PeerKey(os.urandom(32)), Networks.parse(["198.19.0.0/16"]))
    rendezvous.announce(store, trust, "j", "a", Peer("198.19.0.1", 6881))
    late = threading.Timer(0.3, rendezvous.announce,
                           (store, trust, "j", "b", Peer("198.19.0.2", 6881)))
    late.start()
    began = time.monotonic()
    assert len(rendezvous.gather(store, trust, "j", 2, timeout=10)) == 2
    assert 0.2 < time.monotonic() - began < 5
    assert len(rendezvous.gather(store, trust, "j", None)) == 2
    began = time.monotonic()
    assert len(rendezvous.gather(store, trust, "j", 3, timeout=0.5)) == 2  # waited
    assert time.monotonic() - began >= 0.5


# -- on the fleet lab ------------------------------------------------------------------------


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A 4-node lab with peer-to-peer on, a snapshot published from node 0, a hot list
    (and its hot pack) recorded by a start on node 0 and a checkpoint put in HDFS; then
    node 0 is cold again."""
    from bootseer_dev.image import build_image

    need_lab_tools()
    state_dir = tmp_path_factory.mktemp("p2pw")
    spec = LabSpec(nodes=NODES, datanodes=1, name="p2pw", state_dir=state_dir,
                   hdfs_base_port=19550, block_size=1 << 20, origins=False, p2p=True,
                   seed_after_start=SEED_AFTER_START)
    lab = Lab(spec)
    try:
        lab.up(timeout_s=90)
        bootseer = [PY, "-m", "bootseer"]
        target = state_dir / "venv"
        target.mkdir()
        _ok(lab.run(0, [*bootseer, "env", "snapshot", "--key", ENV_KEY, "--path", str(target),
                        "--", "sh", "-c", f"for n in 1 2 3; do head -c {ENV_FILE_BYTES} "
                        f"/dev/urandom > {target}/blob$n; done"],
                    env={"BOOTSEER_SNAPSHOT_SHARD_SIZE": SHARD_SIZE}))
        _ok(lab.run(0, [*bootseer, "image", "convert", str(build_image(with_python=True)),
                        "--name", IMAGE]))
        start = lab.run(0, [*bootseer, "image", "run", "--record", IMAGE, "--", "python3",
                            "-c", "import email.parser, json, http.client; print(6 * 7)"])
        assert _ok(start).splitlines()[0] == "42"
        local = state_dir / "ckpt-src"
        local.mkdir()
        for n in range(2):
            (local / f"shard{n}.bin").write_bytes(os.urandom(CKPT_SHARD_BYTES))
        _ok(lab.run(0, [*bootseer, "ckpt", "put", str(local),
                        f"{lab.spec.checkpoint_prefix()}{CKPT}"]))
        lab.restart_agents([0])
        yield lab
    finally:
        lab.down()


def _warm_all(lab: Lab, job: str, *, kill: int | None = None, scheduler: bool = False,
              parts: tuple[str, ...] | None = None,
              last_parts: tuple[str, ...] | None = None) -> tuple[list[dict | None], int]:
    """`bootseer warm --job J --nodes 4` on every node at once (with ``scheduler``,
    ``--peers`` naming the nodes instead); each node's summary (None if its warm failed)
    and the bytes the DataNode sent meanwhile. With ``kill``, that node's agent is
    killed once the node has received its first MiB. ``parts``: what to warm (default:
    the snapshot, the image's hot blocks and the checkpoint); ``last_parts``: what the
    last node warms instead, if given."""
    members = ["--peers", ",".join(f"{lab.spec.node(i).address}:{P2P_PORT}"
                                   for i in range(NODES))] if scheduler else \
        ["--nodes", str(NODES)]
    if parts is None:
        parts = ("--env", ENV_KEY, "--image", IMAGE,
                 "--checkpoint", f"{lab.spec.checkpoint_prefix()}{CKPT}")
    argv = [PY, "-m", "bootseer", "warm", "--agent", "--json", "--job", job, *members]
    sent = lab.link_bytes("datanode-0")[0]
    received = lab.link_bytes(f"node-{kill}")[1] if kill is not None else 0
    warms = [subprocess.Popen(
        [*netns.enter_argv(lab.spec.node(i).netns), *argv,
         *(last_parts if last_parts is not None and i == NODES - 1 else parts)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
        env=agent_env(lab.client_env()) | {"BOOTSEER_CONFIG": str(lab.node_files(i).config)})
        for i in range(NODES)]
    if kill is not None:
        deadline = time.monotonic() + 60
        while lab.link_bytes(f"node-{kill}")[1] - received < 1 << 20:
            assert time.monotonic() < deadline, "the node never started fetching"
            time.sleep(0.02)
        os.kill(lab.agent_record(kill).pid, signal.SIGKILL)
    summaries = []
    for i, warm in enumerate(warms):
        out, err = warm.communicate(timeout=120)
        if i != kill:
            assert warm.returncode == 0, f"node {i}: {err[-3000:]}"
        summaries.append(json.loads(out) if warm.returncode == 0 else None)
    return summaries, lab.link_bytes("datanode-0")[0] - sent


def _needed(summary: dict) -> int:
    """The bytes one node stages: the hot blocks (the hot pack), the shards and the
    checkpoint."""
    return summary["image"]["bytes"] + sum(env["bytes"] for env in summary["envs"]) + \
        sum(ckpt["bytes"] for ckpt in summary["checkpoints"])


def _peer_bytes(summary: dict) -> int:
    return summary["image"]["peer_bytes"] + summary["envs"][0]["peer_bytes"] + \
        summary["checkpoints"][0]["peer_bytes"]


def _assert_staged_and_verified(lab: Lab, i: int, summary: dict) -> None:
    """The warm completed, and every cache entry on the node hashes to its name (whole
    files, in ``files/``, are named by their blocks' digests instead: they are made of
    blocks verified here, prefetch/wholefiles.py; the snapshot's unpacked tree, a
    directory, by its key: it is unpacked from shards verified here, snapshot/tree.py)."""
    assert summary["complete"] and summary["image"]["hot_list"], summary
    (env,) = summary["envs"]
    assert env["shards"] == 3 and env["missing"] == 0 and env["tree"], env
    (ckpt,) = summary["checkpoints"]
    assert ckpt["files"] == 2 and ckpt["missing"] == 0, ckpt
    entries = [entry for entry in lab.node_files(i).cache_dir.glob("*/entries/*/*")
               if entry.parent.parent.parent.name != "files" and not entry.is_dir()]
    copies = list(lab.node_files(i).cache_dir.glob("checkpoints/copies/entries/*/*"))
    assert len(copies) == 2
    entries += copies
    snapshots = list(lab.node_files(i).cache_dir.glob("snapshots/entries/*/*"))
    assert len([e for e in snapshots if e.is_dir()]) == 1  # the unpacked tree
    assert len(snapshots) == env["shards"] + 2  # and the manifest
    for entry in entries:
        assert hashlib.sha256(entry.read_bytes()).hexdigest() == entry.name, entry


def _metrics(lab: Lab, i: int) -> dict[str, float]:
    transport = httpx.HTTPTransport(uds=str(lab.node_files(i).socket))
    with httpx.Client(transport=transport, base_url="http://agent") as client:
        text = client.get("/metrics").raise_for_status().text
    return {name: float(value) for name, _, value in
            (line.rpartition(" ") for line in text.splitlines())
            if name.startswith("bootseer_p2p")}


def test_a_job_of_four_nodes_reads_each_byte_from_the_store_about_once(lab) -> None:
    began = time.monotonic()
    summaries, sent = _warm_all(lab, "p2pw-once")
    seconds = time.monotonic() - began
    needed = _needed(summaries[0])
    for i, summary in enumerate(summaries):
        _assert_staged_and_verified(lab, i, summary)
        assert summary["members"] == NODES, summary
        assert _needed(summary) == needed
    peer_bytes = [_peer_bytes(summary) for summary in summaries]
    parts = [(s["image"]["seconds"], s["envs"][0]["seconds"], s["checkpoints"][0]["seconds"])
             for s in summaries]
    metrics = [_metrics(lab, i) for i in range(NODES)]
    print(f"{NODES} nodes, {needed / 2**20:.1f} MiB each, in {seconds:.1f} s: the DataNode "
          f"sent {sent / 2**20:.1f} MiB ({sent / needed:.2f}x); from peers (MiB): "
          f"{[round(b / 2**20, 1) for b in peer_bytes]}; seconds (hot pack, shards, "
          f"checkpoint): {parts}")
    # Without peers each node reads it all (4x); metadata (manifests, the hot list,
    # torrents, the checkpoint's piece hashes) is read by every node, HDFS frames its data.
    assert sent <= 1.3 * needed, (sent, needed)
    assert sum(peer_bytes) >= needed, peer_bytes  # most of 3 nodes' bytes came from peers
    assert any(m['bootseer_p2p_fetched_bytes_total{source="peer"}'] > 0 for m in metrics)
    assert sum(m["bootseer_p2p_uploaded_bytes_total"] for m in metrics) > 0, metrics
    assert all(m["bootseer_p2p_seeding"] >= 1 for m in metrics), metrics


def test_a_start_on_a_node_ends_its_seeding_soon_after(lab) -> None:
    """After the warm above every node seeds; a container's start on node 0 (its mount
    through the agent) ends node 0's uploads p2p.seed_after_start later, not the others'."""
    assert all(_metrics(lab, i)["bootseer_p2p_seeding"] >= 1 for i in range(NODES))
    start = lab.run(0, [PY, "-m", "bootseer", "image", "run", IMAGE, "--", "true"])
    _ok(start)
    wait_until(lambda: _metrics(lab, 0)["bootseer_p2p_seeding"] == 0,
          seconds=SEED_AFTER_START + 10)
    assert _metrics(lab, 1)["bootseer_p2p_seeding"] >= 1


def test_a_node_killed_mid_warm_costs_the_others_time_not_their_copies(lab) -> None:
    """The members come from the scheduler (``--peers``) this time."""
    lab.restart_agents(list(range(NODES)))  # cold nodes
    began = time.monotonic()
    summaries, sent = _warm_all(lab, "p2pw-kill", kill=NODES - 1, scheduler=True)
    seconds = time.monotonic() - began
    assert summaries[NODES - 1] is None
    for i in range(NODES - 1):
        _assert_staged_and_verified(lab, i, summaries[i])
        assert summaries[i]["members"] == NODES
    needed = _needed(summaries[0])
    print(f"node {NODES - 1} killed: {NODES - 1} nodes warmed in {seconds:.1f} s, the "
          f"DataNode sent {sent / 2**20:.1f} MiB ({sent / needed:.2f}x)")
    # The dead node's share was read again by the others, once, not once each.
    assert sent <= 2 * needed, (sent, needed)


def _start_all(lab: Lab, job: str) -> tuple[list[str], int]:
    """`bootseer image run --job J` of the image on every node at once, through each
    node's agent: their outputs, and the bytes the DataNode sent meanwhile."""
    argv = [PY, "-m", "bootseer", "image", "run", "--job", job, IMAGE, "--", "python3",
            "-c", "import email.parser, json, http.client; print(6 * 7)"]
    sent = lab.link_bytes("datanode-0")[0]
    starts = [subprocess.Popen(
        [*netns.enter_argv(lab.spec.node(i).netns), *argv], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
        env=agent_env(lab.client_env()) | {"BOOTSEER_CONFIG": str(lab.node_files(i).config)})
        for i in range(NODES)]
    outs = []
    for i, start in enumerate(starts):
        out, err = start.communicate(timeout=180)
        assert start.returncode == 0, f"node {i}: {err[-3000:]}"
        outs.append(out.splitlines()[0])
    return outs, lab.link_bytes("datanode-0")[0] - sent


def test_a_job_starting_cold_reads_its_image_through_its_peers(lab) -> None:
    """Four cold nodes start the image at once, as one job whose warm staged only its
    snapshot (so the nodes know each other): their mount servers read the packs (the hot
    pack the prefetch reads, the blocks it misses) through their agents' swarm. Then the
    same with p2p off, for the DataNode's bytes."""
    lab.restart_agents(list(range(NODES)))  # cold caches
    _warm_all(lab, "p2pw-cold", parts=("--env", ENV_KEY))
    outs, sent = _start_all(lab, "p2pw-cold")
    assert outs == ["42"] * NODES
    metrics = [_metrics(lab, i) for i in range(NODES)]
    served = sum(m["bootseer_p2p_demand_bytes_total"] for m in metrics)
    lab.spec.p2p = False
    lab.restart_agents(list(range(NODES)))
    try:
        _warm_all(lab, "p2pw-cold-off", parts=("--env", ENV_KEY))
        outs, sent_off = _start_all(lab, "p2pw-cold-off")
        assert outs == ["42"] * NODES
    finally:
        lab.spec.p2p = True
        lab.restart_agents(list(range(NODES)))
    print(f"{NODES} cold starts: the DataNode sent {sent / 2**20:.1f} MiB through peers, "
          f"{sent_off / 2**20:.1f} MiB without; {served / 2**20:.1f} MiB of reads served "
          f"by the agents; fallbacks {[m['bootseer_p2p_demand_fallbacks_total'] for m in metrics]}")
    # Each node reads its share (and pieces whose owner was slower than demand_wait: on a
    # loaded machine, more of them; measured 0.29 of sent_off alone, 0.54 in a full run
    # with encrypted peer handshakes, 0.72 in a CI run on a loaded machine). Without
    # peers it would be all of it. How much less is timing, for bench-p2p-read to
    # measure; that peers served reads, and the DataNode sent less for it, is not.
    assert served > 0 and sent < sent_off, (sent, sent_off, metrics)


def test_a_whole_image_is_warmed_through_peers_pack_by_pack(lab) -> None:
    """`warm --all` stages every block of the image: each pack goes whole through the
    swarm (its torrent from the conversion), so the DataNode sends about one image, not
    one per node; every block is then in each node's cache, verified."""
    lab.restart_agents(list(range(NODES)))  # cold caches
    summaries, sent = _warm_all(lab, "p2pw-all", parts=("--image", IMAGE, "--all"))
    image_bytes = summaries[0]["image"]["bytes"]
    for i, summary in enumerate(summaries):
        result = summary["image"]
        assert summary["complete"] and result["missing"] == 0, summary
        assert result["bytes"] == image_bytes
        entries = list(lab.node_files(i).cache_dir.glob("blocks/entries/*/*"))
        assert len(entries) >= result["blocks"], (len(entries), result)  # and the packs
        for entry in entries:
            assert hashlib.sha256(entry.read_bytes()).hexdigest() == entry.name, entry
    peer_bytes = [s["image"]["peer_bytes"] for s in summaries]
    print(f"warm --all of a {image_bytes / 2**20:.1f} MiB image on {NODES} nodes in "
          f"{max(s['image']['seconds'] for s in summaries):.1f} s: the DataNode sent "
          f"{sent / 2**20:.1f} MiB ({sent / image_bytes:.2f}x); from peers (MiB): "
          f"{[round(b / 2**20, 1) for b in peer_bytes]}")
    assert sum(peer_bytes) >= image_bytes, peer_bytes
    assert sent <= 1.5 * image_bytes, (sent, image_bytes)


def test_a_node_that_did_not_stage_the_checkpoint_reads_it_from_those_that_did(
        lab) -> None:
    """Three nodes warm the checkpoint, the fourth only the image and the snapshot (a node
    that joined late, or whose warm skipped it). A container of the job on the fourth
    mounts the checkpoint through its agent, as the runtime shim asks: its server reads
    each stripe through the agent, from the three that seed their copies. The DataNode
    sends little of the checkpoint meanwhile, and the bytes are the checkpoint's."""
    from bootseer.agents.client import AgentClient
    from bootseer.agents.mountapi import MountRequest

    lab.restart_agents(list(range(NODES)))  # cold caches
    url = f"{lab.spec.checkpoint_prefix()}{CKPT}"
    summaries, _ = _warm_all(lab, "p2pw-late",
                             parts=("--env", ENV_KEY, "--image", IMAGE, "--checkpoint", url),
                             last_parts=("--env", ENV_KEY, "--image", IMAGE))
    assert summaries[NODES - 1]["checkpoints"] == []
    late = NODES - 1
    before = _metrics(lab, late)
    source = lab.spec.state_dir / "ckpt-src"
    with AgentClient(lab.node_files(late).socket) as client:
        mount = client.mount(MountRequest("late0", IMAGE, record="never", job="p2pw-late",
                                          checkpoints={"c": url}))
        try:
            assert mount.checkpoints_dir is not None
            sent = lab.link_bytes("datanode-0")[0]
            for n in range(2):
                name = f"shard{n}.bin"
                read = (Path(mount.checkpoints_dir) / "c" / name).read_bytes()
                assert read == (source / name).read_bytes(), name
            sent = lab.link_bytes("datanode-0")[0] - sent
        finally:
            client.release("late0")
    after = _metrics(lab, late)
    served = after["bootseer_p2p_demand_bytes_total"] - \
        before["bootseer_p2p_demand_bytes_total"]
    fallbacks = after["bootseer_p2p_demand_fallbacks_total"] - \
        before["bootseer_p2p_demand_fallbacks_total"]
    print(f"a node that did not stage the checkpoint read its {2 * CKPT_SHARD_BYTES >> 20} "
          f"MiB: {served / 2**20:.1f} MiB through its peers, the DataNode sent "
          f"{sent / 2**20:.2f} MiB meanwhile; fallbacks {fallbacks:.0f}")
    assert served >= 2 * CKPT_SHARD_BYTES, (served, fallbacks)
    assert sent <= 0.1 * 2 * CKPT_SHARD_BYTES, sent  # stats and listings, not the bytes


#: Run on a node as a store writer without the key would: over each file of the checkpoint
#: directory argv[1], a torrent of other bytes under the file's name (URL, size, mtime), and
#: a peer record of job argv[2] that wants the checkpoint, naming argv[3]; the forged bytes
#: and torrents go to the directory argv[4] too, for the attacker's seeder; prints the files.
FORGE = """
import json, os, sys, time
from bootseer.config import load_config
from bootseer.p2p import rendezvous, torrents
from bootseer.p2p.sharedfile import SharedFile
from bootseer.store import open_configured_store
from bootseer.stripedfs.checkpoint_cache import object_url
from bootseer.stripedfs.files import CheckpointSource
from bootseer.stripedfs.stage import checkpoint_files
config = load_config().config
records = open_configured_store(config)
store, files = checkpoint_files(CheckpointSource(config), sys.argv[1])
forged = []
for info in files:
    url = object_url(store, info.key)
    file = SharedFile(store, records, info.key, url, info.size, info.mtime)
    bad = os.urandom(info.size)
    piece = torrents.piece_size_for(info.size)
    layer = b"".join(torrents.piece_hash(bad[i:i + piece], piece)
                     for i in range(0, info.size, piece))
    torrent = torrents.build_from_layer(file.identity, info.size, piece, layer)
    records.put(torrents.key(file.identity, addressed=False), torrent)
    for name, data in ((file.identity[7:], bad), (file.identity[7:] + ".torrent", torrent)):
        with open(os.path.join(sys.argv[4], name), "wb") as out:
            out.write(data)
        os.chmod(os.path.join(sys.argv[4], name), 0o644)
    forged.append({"url": url, "key": info.key, "size": info.size, "mtime": info.mtime})
address, port = sys.argv[3].rsplit(":", 1)
records.put(rendezvous.peers_dir(sys.argv[2]) + "/evil.json", json.dumps({
    "node": "evil", "address": address, "port": int(port), "time": time.time(),
    "wants": [rendezvous.interest(sys.argv[1])], "auth": "0" * 64}).encode())
print(json.dumps(forged))
"""


#: The attacker's seeder (no key): a libtorrent session on argv[1] (ADDRESS:PORT) serving
#: the forged files of the directory argv[3] (seed mode, as the torrents say) until the file
#: argv[2] exists; prints "ready", then the bytes it uploaded and the peers it ever had.
SEEDER = """
import glob, os, sys, time
import libtorrent as lt
ses = lt.session({"listen_interfaces": sys.argv[1], "enable_dht": False,
                  "enable_lsd": False, "enable_upnp": False, "enable_natpmp": False}, 0)
handles = []
for path in glob.glob(os.path.join(sys.argv[3], "*.torrent")):
    params = lt.add_torrent_params()
    params.ti = lt.torrent_info(path)
    params.save_path = sys.argv[3]
    params.flags = lt.torrent_flags.seed_mode
    handles.append(ses.add_torrent(params))
while not ses.is_listening():
    time.sleep(0.01)
print("ready", flush=True)
peers = 0
while not os.path.exists(sys.argv[2]):
    peers = max(peers, sum(h.status().num_peers for h in handles))
    time.sleep(0.1)
print(sum(h.status().total_payload_upload for h in handles), peers)
"""


def test_a_store_writer_cannot_make_nodes_serve_forged_checkpoint_bytes(lab) -> None:
    """The attack as it was made: torrents over forged bytes published under the names of
    a checkpoint's files, and a peer record that wants the checkpoint and names the
    attacker's address. The job's warm stages the true bytes on every node (`ckpt get`
    reads them), and, with the forgery published again, a fresh node's agent answers a
    checkpoint mount's demand read with nothing (the server reads the store): no forged
    byte reaches a copy or a reader, and no node dials the attacker."""
    from bootseer.agents.client import AgentClient
    from bootseer.store.base import ObjectInfo

    lab.restart_agents(list(range(NODES)))  # cold caches
    url = f"{lab.spec.checkpoint_prefix()}{CKPT}"
    job, attacker = "p2pw-forged", f"{lab.spec.node(NODES - 1).address}:6999"
    made = lab.spec.state_dir / "forged"
    made.mkdir(exist_ok=True)
    forge = [PY, "-c", FORGE, url, job, attacker, str(made)]
    evil = Path(tempfile.mkdtemp(prefix="bootseer-evil-"))  # nobody's seeder reads it
    try:
        forged = json.loads(_ok(lab.run(0, forge)))
        assert len(forged) == 2
        shutil.copytree(made, evil, dirs_exist_ok=True)
        evil.chmod(0o755)
        stop = evil / "stop"
        seeder = subprocess.Popen(  # another uid, on the attacker's address
            [*netns.enter_argv(lab.spec.node(NODES - 1).netns), "setpriv",
             "--reuid=65534", "--regid=65534", "--clear-groups", PY, "-c", SEEDER, attacker,
             str(stop), str(evil)], stdout=subprocess.PIPE, text=True)
        assert seeder.stdout is not None and seeder.stdout.readline() == "ready\n"
        try:
            summaries, _ = _warm_all(lab, job, parts=("--checkpoint", url),
                                     last_parts=("--env", ENV_KEY))
        finally:
            stop.touch()
        # Never dialed, never served: its record is not the key's.
        assert seeder.communicate(timeout=30)[0].split() == ["0", "0"]
    finally:
        shutil.rmtree(evil)
    source = lab.spec.state_dir / "ckpt-src"
    for i in range(NODES - 1):
        assert summaries[i]["complete"], summaries[i]
        got = lab.spec.state_dir / f"got{i}"
        _ok(lab.run(i, [PY, "-m", "bootseer", "ckpt", "get", url, str(got)]))
        for n in range(2):
            assert (got / f"shard{n}.bin").read_bytes() == \
                (source / f"shard{n}.bin").read_bytes()
    forged = json.loads(_ok(lab.run(0, forge)))  # again, for the fresh node's reads
    with AgentClient(lab.node_files(NODES - 1).socket) as client:
        for item in forged:
            info = ObjectInfo(item["key"], item["size"], item["mtime"])
            assert client.peer_read_file(job, item["url"], info, 0, 1 << 20) is None
    metrics = [_metrics(lab, i) for i in range(NODES)]
    assert all(m.get("bootseer_p2p_banned_peers", 0) == 0 for m in metrics), metrics


def test_with_p2p_off_every_node_reads_the_store_and_nothing_listens(lab) -> None:
    lab.spec.p2p = False
    lab.restart_agents(list(range(NODES)))  # cold, and configs without [p2p]
    began = time.monotonic()
    summaries, sent = _warm_all(lab, "p2pw-off")
    seconds = time.monotonic() - began
    needed = _needed(summaries[0])
    print(f"p2p off: {NODES} nodes warmed in {seconds:.1f} s, the DataNode sent "
          f"{sent / 2**20:.1f} MiB ({sent / needed:.2f}x)")
    for i, summary in enumerate(summaries):
        _assert_staged_and_verified(lab, i, summary)
        assert summary["members"] == 0 and summary["image"]["peer_bytes"] == 0, summary
        assert summary["envs"][0]["fetched_bytes"] == summary["envs"][0]["bytes"]
        assert summary["checkpoints"][0]["fetched_bytes"] == 2 * CKPT_SHARD_BYTES
        assert summary["checkpoints"][0]["peer_bytes"] == 0
        assert _metrics(lab, i) == {}
        pid = lab.agent_record(i).pid
        assert "libtorrent" not in Path(f"/proc/{pid}/maps").read_text()
        listening = _ok(lab.run(i, ["ss", "-Htln"]))
        assert f":{P2P_PORT} " not in listening, listening
    assert sent >= NODES * needed, (sent, needed)


def test_a_forged_checkpoint_torrent_never_reaches_a_copy(tmp_path: Path,
                                                          local_swarm) -> None:
    """A store writer publishes, under a checkpoint file's name, a torrent of other bytes
    (untagged, or tagged with a key of its own): the fetch refuses it and removes it,
    nothing is kept; the next fetch hashes the file anew and gets the true bytes."""
    from bootseer.p2p.sharedfile import SharedFile, ShareError, load_torrent

    store = open_store((tmp_path / "store").as_uri())
    data, forged = os.urandom(3 << 20), os.urandom(3 << 20)
    store.put("ckpt/model.bin", data)
    info = store.stat("ckpt/model.bin")
    shared = SharedFile(store, store, "ckpt/model.bin", f"{store.url}/ckpt/model.bin",
                        info.size, info.mtime)
    piece = torrents.piece_size_for(info.size)
    layer = b"".join(torrents.piece_hash(forged[i:i + piece], piece)
                     for i in range(0, info.size, piece))
    bogus = torrents.build_from_layer(shared.identity, info.size, piece, layer)
    with local_swarm(0, piece_grace=0.2) as swarm:  # the other member never hashes
        stranger = Trust(PeerKey(os.urandom(32)), swarm.trust.networks)
        for data_published in (bogus, torrents.with_tag(bogus, stranger.key.tag("x"))):
            torrents.publish(store, shared.identity, data_published, addressed=False)
            with pytest.raises(ShareError):
                load_torrent(shared, swarm.trust)
            fanout = Fanout(swarm, (swarm.address, Peer("198.19.254.2", 6881)))
            assert fanout.fetch_file(shared, tmp_path / "copy", tmp_path / "spool") is None
            assert not (tmp_path / "copy").exists()
            assert not list(store.list("p2p/files/"))  # removed: the next start hashes
        result = Fanout(swarm, (swarm.address, Peer("198.19.254.2", 6881))).fetch_file(
            shared, tmp_path / "copy", tmp_path / "spool")
        assert result is not None and (tmp_path / "copy").read_bytes() == data
        assert load_torrent(shared, swarm.trust).size == info.size

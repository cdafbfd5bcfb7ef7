"""bootseer.p2p: torrents derived from content addresses, discovery in the store, and real
libtorrent swarms, each node a process in a network namespace of its own.

The namespaces hang off one bridge in a namespace of its own, addressed in 198.18.64.0/24
(198.18.0.0/15 is reserved for benchmarking) with no route anywhere else; the fixture
removes exactly the namespaces it made (their links go with them). Nodes are
tests/support/p2p_node.py, entered with ``nsenter --net`` so one can be killed. All share one
``file://`` store; a node counts the bytes its ``read_range`` returns.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import libtorrent as lt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.ci import require
from support.peers import LOCAL_PEERS
from support.wait import wait_until

from bootseer.config import P2PConfig, load_config
from bootseer.errors import BootseerError, IntegrityError
from bootseer.limits import TORRENT_MAX_PIECES
from bootseer.p2p import (
    Fanout,
    Peer,
    PeerAddressError,
    fetch_blob,
    fetch_object,
    open_swarm,
    parse_peers,
    rendezvous,
    torrents,
)
from bootseer.p2p.swarm import Swarm, SwarmError, parse_listen
from bootseer.p2p.torrents import TorrentError
from bootseer.p2p.trust import Networks, PeerKey, Trust
from bootseer.store import BlobStore, open_store
from bootseer.store.local import LocalStore
from bootseer_dev import netns

PY = sys.executable
NODE_SCRIPT = Path(__file__).parent.parent / "support" / "p2p_node.py"
SUBNET = "198.18.64"
NODES = 5
BLOB_SIZE = 8 << 20  # 512 KiB pieces: 16 of them
ROOT = Path(__file__).resolve().parents[2]
#: The key and networks of these tests' peer records.
TRUST = Trust(PeerKey(os.urandom(32)), Networks.parse(["198.18.0.0/15"]))


# -- a blob in a store, with its torrent ---------------------------------------------------


@dataclass
class Blob:
    url: str
    blobs: BlobStore
    digest: str
    data: bytes


def _blob(directory: Path, size: int = BLOB_SIZE, *, torrent: bool = True) -> Blob:
    url = (directory / "store").as_uri()
    blobs = BlobStore(open_store(url))
    data = os.urandom(size)
    digest = blobs.put(data).digest
    if torrent:
        src = directory / "src"
        src.write_bytes(data)
        assert torrents.publish(blobs.store, digest, torrents.build(digest, size, src))
        src.unlink()
    return Blob(url, blobs, digest, data)


# -- torrents -------------------------------------------------------------------------------


def test_piece_sizes_follow_the_blob_size() -> None:
    assert torrents.piece_size_for(BLOB_SIZE) == 512 << 10
    assert torrents.piece_size_for(1) == 16 << 10
    assert torrents.piece_size_for(10 << 30) == 1 << 20
    assert torrents.piece_size_for(200 << 30) == 4 << 20  # at most 64 Ki pieces
    with pytest.raises(TorrentError):
        torrents.piece_size_for(8 << 40)


def test_a_torrent_is_published_create_only_and_loads_checked(tmp_path: Path) -> None:
    blob = _blob(tmp_path, 3 << 20)
    t = torrents.load(blob.blobs.store, blob.digest, len(blob.data))
    assert (t.size, t.piece_size, t.num_pieces) == (3 << 20, 128 << 10, 24)
    assert t.info.info_hashes().has_v2() and not t.info.info_hashes().has_v1()
    assert not torrents.publish(blob.blobs.store, blob.digest, b"another")  # first one stays
    assert torrents.load(blob.blobs.store, blob.digest, len(blob.data)).data == t.data
    # The same blob, built from its bytes elsewhere: the same torrent.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(blob.data)
    assert torrents.build(blob.digest, len(blob.data), elsewhere) == t.data
    with pytest.raises(FileNotFoundError):
        torrents.load(blob.blobs.store, "sha256:" + "0" * 64, 10)


def test_a_blob_that_ends_inside_a_piece_has_a_torrent_and_is_fetched(
        tmp_path: Path, local_swarm) -> None:
    """libtorrent pads such a file with a pad file of its own (not in the torrent's
    bytes): loading accepts exactly that one, and a fetch completes without it."""
    for size in (1, 16385, 300_000):
        (tmp_path / str(size)).mkdir()
        blob = _blob(tmp_path / str(size), size)
        t = torrents.load(blob.blobs.store, blob.digest, size)
        assert t.size == size and t.num_pieces == -(-size // t.piece_size)
        with local_swarm() as swarm:
            fetch_blob(blob.blobs, blob.digest, tmp_path / f"{size}.got", swarm=swarm)
        assert (tmp_path / f"{size}.got").read_bytes() == blob.data
    two_files = _lt_torrent(tmp_path, {f"{blob.digest[7:]}/a": b"x" * 1000,
                                       f"{blob.digest[7:]}/b": b"y" * 1000}, 16 << 10,
                            lt.create_torrent.v2_only)
    with pytest.raises(TorrentError):
        torrents.parse(blob.digest, 2000, two_files)


def test_an_object_under_its_own_key_is_fetched_checked_against_its_digest(
        tmp_path: Path, local_swarm) -> None:
    """A pack (``packs/<hex>``): no chunk table, so a plain read hashes it whole."""
    store = open_store((tmp_path / "store").as_uri())
    data = os.urandom(200_000)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    store.put("packs/" + digest[7:], data)
    result = fetch_object(store, "packs/" + digest[7:], digest, tmp_path / "a", swarm=None)
    assert (tmp_path / "a").read_bytes() == data and result.store_bytes == len(data)
    (tmp_path / "src").write_bytes(data)
    assert torrents.publish(store, digest, torrents.build(digest, len(data), tmp_path / "src"))
    with local_swarm() as swarm:
        result = fetch_object(store, "packs/" + digest[7:], digest, tmp_path / "b",
                              swarm=swarm)
    assert (tmp_path / "b").read_bytes() == data and result.store_bytes == len(data)
    store.put("packs/" + "0" * 64, data)  # filed under a digest it does not have
    with pytest.raises(IntegrityError):
        fetch_object(store, "packs/" + "0" * 64, "sha256:" + "0" * 64, tmp_path / "c",
                     swarm=None)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("size", [(5 << 20) + 123, 3 << 20, (600 << 10) + 1, 17 << 14])
def test_a_torrent_from_piece_hashes_is_the_one_libtorrent_builds(tmp_path: Path,
                                                                   size: int) -> None:
    # Nodes that hash a checkpoint's pieces where they read them must agree, byte for
    # byte, with libtorrent hashing the whole file (sizes ending inside a block, a
    # piece, and on a piece boundary).
    data = os.urandom(size)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (tmp_path / digest[7:]).write_bytes(data)
    piece = torrents.piece_size_for(size)
    layer = b"".join(torrents.piece_hash(data[i:i + piece], piece)
                     for i in range(0, size, piece))
    built = torrents.build_from_layer(digest, size, piece, layer)
    assert built == torrents.build(digest, size, tmp_path / digest[7:])
    assert torrents.parse(digest, size, built, addressed=False).addressed is False
    with pytest.raises(TorrentError, match="piece hashes"):
        torrents.build_from_layer(digest, size, piece, layer[:-32])
    assert torrents.key(digest, addressed=False).startswith("p2p/files/")


def test_build_refuses_a_file_that_is_not_the_blob(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    path = tmp_path / "f"
    path.write_bytes(data)
    other = "sha256:" + hashlib.sha256(b"x" + data[1:]).hexdigest()
    with pytest.raises(IntegrityError):
        torrents.build(other, len(data), path)
    with pytest.raises(IntegrityError):
        torrents.build("sha256:" + hashlib.sha256(data).hexdigest(), len(data) + 1, path)


def _lt_torrent(directory: Path, files: dict[str, bytes], piece: int, flags: int) -> bytes:
    """A torrent made by libtorrent alone, of ``files`` (paths in it: contents)."""
    directory = Path(tempfile.mkdtemp(dir=directory))
    for name, content in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(content)
    ct = lt.create_torrent([lt.create_file_entry(n, len(c)) for n, c in files.items()],
                           piece, flags)
    lt.set_piece_hashes(ct, str(directory))
    return lt.bencode(ct.generate())


def _edit(data: bytes, edit) -> bytes:
    decoded = lt.bdecode(data)
    edit(decoded)
    return lt.bencode(decoded)


def test_torrents_that_lie_are_refused(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    hexd, size, piece = digest[7:], len(data), 64 << 10
    good = _lt_torrent(tmp_path, {hexd: data}, piece, lt.create_torrent.v2_only)
    assert torrents.parse(digest, size, good).num_pieces == 16
    root = next(iter(lt.bdecode(good)[b"piece layers"]))

    def set_info(key: bytes, value):
        return _edit(good, lambda d: d[b"info"].__setitem__(key, value))

    def set_leaf(key: bytes, value):
        return _edit(good, lambda d: d[b"info"][b"file tree"][hexd.encode()][b""]
                     .__setitem__(key, value))

    hostile = {
        "wrong size": set_leaf(b"length", size + 1),
        "size the caller does not expect": good,  # parsed as a blob one byte larger
        "v1 only": _lt_torrent(tmp_path, {hexd: data}, piece, lt.create_torrent.v1_only),
        "hybrid v1+v2": _lt_torrent(tmp_path, {hexd: data}, piece, 0),
        "two files": _lt_torrent(tmp_path, {f"{hexd}/{hexd}": data,
                                            f"{hexd}/extra": b"x" * 100},
                                 piece, lt.create_torrent.v2_only),
        "another name": set_info(b"name", b"0" * 64),
        "piece length not a power of two": set_info(b"piece length", 48 << 10),
        "piece length too small": set_info(b"piece length", 8 << 10),
        "piece hashes of other bytes": _edit(good, lambda d: d[b"piece layers"]
                                             .__setitem__(root, bytes(32 * 16))),
        "no piece hashes": _edit(good, lambda d: d.pop(b"piece layers")),
        "not bencoded": b"\x00garbage",
        "not a dictionary": b"i42e",
    }
    for what, bad in hostile.items():
        expect = size + 1 if what == "size the caller does not expect" else size
        with pytest.raises(TorrentError):
            torrents.parse(digest, expect, bad)
            pytest.fail(f"accepted a torrent with {what}")
    # A huge piece count for the size the store reports: refused before it is hashed.
    huge = 1 << 40

    def many_pieces(d) -> None:
        d[b"info"][b"file tree"][hexd.encode()][b""][b"length"] = huge
        d[b"info"][b"piece length"] = 16 << 10

    lying = _edit(good, many_pieces)
    with pytest.raises(TorrentError, match=f"over {TORRENT_MAX_PIECES}"):
        torrents.parse(digest, huge, lying)
    # An object larger than its blob's pieces allow is not even read.
    store = open_store((tmp_path / "store").as_uri())
    store.put(torrents.key(digest), good + b"x" * (64 << 10))
    with pytest.raises(TorrentError, match="over the"):
        torrents.load(store, digest, size)


# -- discovery ------------------------------------------------------------------------------


def test_peers_parse_as_ip_literals_only() -> None:
    assert parse_peers("198.18.64.2:6881, [FD00::2]:7000 198.18.64.1:6881") == [
        Peer("198.18.64.1", 6881), Peer("198.18.64.2", 6881), Peer("fd00::2", 7000)]
    assert str(Peer("fd00::2", 7000)) == "[fd00::2]:7000"
    for bad in ("example.com:6881", "198.18.64.2", "198.18.64.2:0", "198.18.64.2:70000",
                "fd00::2:6881", "1.2.3.4.5:1", "198.18.64.2:-1"):
        with pytest.raises(PeerAddressError):
            parse_peers(bad)
    assert parse_listen("198.18.64.2:0") == ("198.18.64.2", 0)
    assert parse_listen("[fd00::2]:6881") == ("fd00::2", 6881)
    for bad in ("0.0.0.0:6881", "[::]:6881", "198.18.64.2", "node-1:6881", ""):
        with pytest.raises(SwarmError):
            parse_listen(bad)


def test_members_come_from_the_store_and_hostile_records_are_skipped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store((tmp_path / "store").as_uri())
    rendezvous.announce(store, TRUST, "job:1", "n1", Peer("198.18.64.2", 6881))
    rendezvous.announce(store, TRUST, "job:1", "n0", Peer("198.18.64.1", 6881))
    rendezvous.announce(store, TRUST, "job:1", "n0", Peer("198.18.64.1", 6999))  # restarted
    rendezvous.announce(store, TRUST, "other", "n9", Peer("198.18.64.9", 6881))
    prefix = rendezvous.peers_dir("job:1")
    assert prefix == "p2p/jobs/job%3A1/peers"

    def record(**fields):
        base = {"node": "x", "address": "198.18.64.50", "port": 6881, "time": 1.0,
                "wants": [], "auth": "0" * 64}
        return json.dumps({**base, **fields}).encode()

    def signed(node: str, address: str, key: PeerKey = TRUST.key) -> bytes:
        """A record as an agent holding ``key`` writes it."""
        other = open_store((tmp_path / node).as_uri())
        trust = Trust(key, Networks.parse(["0.0.0.0/0", "::/0"]))
        rendezvous.announce(other, trust, "job:1", node, Peer.of(address, 6881))
        return other.get(f"{prefix}/{node}.json")

    hostile = {
        "big": record(node="big", address="198.18.64.51" + " " * 40000),
        "wantsbad": record(node="wantsbad", wants=["../x"]),
        "wantsmany": record(node="wantsmany", wants=["a" * 64] * 257),
        "wantsstr": record(node="wantsstr", wants="a" * 64),
        "json": b"{not json",
        "list": b"[1, 2]",
        "deep": b"[" * 900 + b"]" * 900,
        "bytes": b"\xff\xfe",
        "extra": json.dumps({"node": "extra", "address": "198.18.64.52", "port": 1,
                             "time": 1, "cmd": "rm"}).encode(),
        "host": record(node="host", address="evil.example.com"),
        "octets": record(node="octets", address="198.18.64.300"),
        "port0": record(node="port0", port=0),
        "porthigh": record(node="porthigh", port=65536),
        "portstr": record(node="portstr", port="6881"),
        "portbool": record(node="portbool", port=True),
        "elsewhere": record(node="n1"),  # claims to be another node
        "timestr": record(node="timestr", time="now"),
        # Well-formed, but not written by a holder of the cluster's key.
        "unsigned": json.dumps({"node": "unsigned", "address": "198.18.64.53",
                                "port": 6881, "time": 1.0, "wants": []}).encode(),
        "forged": record(node="forged"),
        "otherkey": signed("otherkey", "198.18.64.54", PeerKey(os.urandom(32))),
        "moved": signed("moved", "198.18.64.55").replace(b"64.55", b"64.56"),
        # Signed, but where no node of the job may be: off p2p.networks, loopback,
        # unspecified, multicast, broadcast, link-local.
        **{f"addr{i}": signed(f"addr{i}", address) for i, address in enumerate((
            "127.0.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "::1", "169.254.1.1",
            "10.1.2.3", "::ffff:127.0.0.1", "fe80::1"))},
    }
    for name, data in hostile.items():
        store.put(f"{prefix}/{name}.json", data)
    with caplog.at_level(logging.WARNING, logger="bootseer.p2p.rendezvous"):
        found = rendezvous.members(store, TRUST, "job:1")
    assert found == [Peer("198.18.64.1", 6999), Peer("198.18.64.2", 6881)]
    assert len([r for r in caplog.records if "skipping" in r.message]) == len(hostile)
    rendezvous.withdraw(store, "job:1", "n1")
    rendezvous.withdraw(store, "job:1", "n1")  # gone already: fine
    assert rendezvous.members(store, TRUST, "job:1") == [Peer("198.18.64.1", 6999)]
    for job, node in (("../x", "n"), ("job", "../n"), ("", "n"), ("job", "a/b")):
        with pytest.raises(BootseerError):
            rendezvous.announce(store, TRUST, job, node, Peer("198.18.64.1", 1))


def test_a_checkpoint_is_shared_among_the_members_that_want_it(tmp_path: Path, local_swarm) -> None:
    store = open_store((tmp_path / "store").as_uri())
    group = {"hdfs://nn/ckpt/a": (0, 1), "hdfs://nn/ckpt/b": (2, 3)}
    for i in range(4):
        urls = [url for url, nodes in group.items() if i in nodes]
        rendezvous.announce(store, TRUST, "j", f"n{i}", Peer(f"198.18.64.{i + 1}", 6881), urls)
    roster = rendezvous.gather(store, TRUST, "j", 4)
    assert [m.peer.address for m in roster] == [f"198.18.64.{i + 1}" for i in range(4)]
    for url, nodes in group.items():
        wanted = rendezvous.wanting(roster, url)
        assert wanted == [Peer(f"198.18.64.{i + 1}", 6881) for i in nodes]
    assert rendezvous.wanting(roster, "hdfs://nn/ckpt/c") == []
    # A demand read names a file; the records name the directory a warm was given.
    assert rendezvous.wanting_within(roster, "hdfs://nn/ckpt/a/model-0.safetensors") == \
        rendezvous.wanting(roster, "hdfs://nn/ckpt/a")
    assert rendezvous.wanting_within(roster, "hdfs://nn/ckpt/ab/x") == []
    with local_swarm() as swarm:
        fanout = Fanout(swarm, tuple(m.peer for m in roster),
                        {url: tuple(rendezvous.wanting(roster, url)) for url in group})
        assert fanout.among("hdfs://nn/ckpt/a").peers == fanout.wanting["hdfs://nn/ckpt/a"]
        assert fanout.among("hdfs://nn/ckpt/a").results is fanout.results
        assert fanout.among("hdfs://other") is fanout  # not in the records: every member
    with pytest.raises(BootseerError):
        rendezvous.announce(store, TRUST, "j", "n9", Peer("198.18.64.9", 1),
                            [f"u{i}" for i in range(rendezvous.MAX_WANTS + 1)])


def test_members_read_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store((tmp_path / "store").as_uri())
    for i in range(5):
        rendezvous.announce(store, TRUST, "j", f"n{i}", Peer(f"198.18.64.{i + 1}", 6881))
    monkeypatch.setattr(rendezvous, "MAX_MEMBERS", 3)
    assert len(rendezvous.members(store, TRUST, "j")) == 3


def test_the_p2p_section_of_the_config(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[p2p]\nenabled = true\nlisten = "198.18.64.2:6881"\n'
                    'upload_rate = "100m"\nseed_time = 30\n')
    loaded = load_config(files=[path], environ={"BOOTSEER_P2P_PIECE_GRACE": "0.5"})
    p2p = loaded.config.p2p
    assert (p2p.enabled, p2p.listen, p2p.upload_rate, p2p.seed_time, p2p.piece_grace) == \
        (True, "198.18.64.2:6881", 100 << 20, 30.0, 0.5)
    off = load_config(files=[], environ={}).config.p2p
    assert off.enabled is False and open_swarm(off) is None


# -- one session, no network: store fallback, seeding limits ---------------------------------


def test_without_peers_every_piece_comes_from_the_store(tmp_path: Path, local_swarm) -> None:
    blob = _blob(tmp_path, 1 << 20)
    with local_swarm() as swarm:
        result = fetch_blob(blob.blobs, blob.digest, tmp_path / "got", swarm=swarm)
        assert (tmp_path / "got").read_bytes() == blob.data
        assert (result.store_bytes, result.peer_bytes, result.peers) == (1 << 20, 0, 0)
        assert swarm.stats().store_bytes == 1 << 20


def test_a_torrent_that_lies_about_its_blob_costs_a_fetch_not_a_byte(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, local_swarm) -> None:
    blob = _blob(tmp_path, 1 << 20, torrent=False)
    # A well-formed torrent, named after the blob, whose hashes are of other bytes.
    lying = _lt_torrent(tmp_path, {blob.digest[7:]: os.urandom(1 << 20)}, 64 << 10,
                        lt.create_torrent.v2_only)
    torrents.publish(blob.blobs.store, blob.digest, lying)
    torrent = torrents.load(blob.blobs.store, blob.digest, 1 << 20)
    with local_swarm() as swarm:
        with pytest.raises(IntegrityError, match="does not describe the blob"):
            swarm.fetch(torrent, tmp_path / "a", [],
                        lambda o, n: blob.blobs.read_range(blob.digest, o, n))
        assert not (tmp_path / "a").exists()
        with caplog.at_level(logging.WARNING, logger="bootseer.p2p.blobfetch"):
            result = fetch_blob(blob.blobs, blob.digest, tmp_path / "b", swarm=swarm)
    assert (tmp_path / "b").read_bytes() == blob.data and result.peer_bytes == 0
    assert "does not describe the blob" in caplog.text
    # No torrent at all: the plain read.
    (tmp_path / "x").mkdir()
    other = _blob(tmp_path / "x", 1000, torrent=False)
    with local_swarm() as swarm:
        fetch_blob(other.blobs, other.digest, tmp_path / "c", swarm=swarm)
    assert (tmp_path / "c").read_bytes() == other.data


def test_the_session_keeps_files_through_mmap_and_its_torrents_private(
        tmp_path: Path, local_swarm) -> None:
    """libtorrent 2.1.1's default disk back end (pread) crashes the process, now and then,
    when a torrent that lies is removed after its store pieces failed twice (the test
    above, about 1 run in 150): the session keeps its files through mmap_disk_io, whose
    mark is the file mapped into this process while a torrent reads it."""
    blob = _blob(tmp_path, 1 << 20)
    torrent = torrents.load(blob.blobs.store, blob.digest, 1 << 20)
    assert torrent.keyed(TRUST).priv() and not torrent.info.priv()
    part = tmp_path / "part"
    with local_swarm() as swarm:
        got = swarm.read(torrent, part, 0, 100, [],
                         lambda o, n: blob.blobs.read_range(blob.digest, o, n), 0.1)
        assert got == blob.data[:100]
        assert str(part) in Path("/proc/self/maps").read_text()


def test_seeding_stops_when_told_after_seed_time_or_after_a_start(
        tmp_path: Path, local_swarm) -> None:
    blob = _blob(tmp_path, 1 << 20)
    path = tmp_path / blob.digest[7:]
    path.write_bytes(blob.data)
    os.chmod(path, 0o444)
    torrent = torrents.load(blob.blobs.store, blob.digest, 1 << 20)
    with local_swarm(seed_time=0.5) as swarm:
        assert swarm.seed(torrent, path)
        assert not swarm.seed(torrent, path)  # seeded already
        assert swarm.stats().seeding == 1
        deadline = time.monotonic() + 5
        while swarm.stats().seeding and time.monotonic() < deadline:
            time.sleep(0.05)
        assert swarm.stats().seeding == 0
    with local_swarm() as swarm:
        assert swarm.seed(torrent, path)
        swarm.stop_seeding(blob.digest)
        assert swarm.stats().seeding == 0
    with local_swarm(seed_time=0) as swarm:
        assert not swarm.seed(torrent, path)
    with local_swarm() as swarm:  # seed_time 600 s, but a container started here
        assert swarm.seed(torrent, path)
        swarm.wind_down(0.3)
        deadline = time.monotonic() + 5
        while swarm.stats().seeding and time.monotonic() < deadline:
            time.sleep(0.05)
        assert swarm.stats().seeding == 0
    assert path.read_bytes() == blob.data  # only ever read


def test_a_listen_address_this_host_does_not_have_is_an_error(local_peer_key: Path) -> None:
    def swarm(listen: str, networks: tuple[str, ...] = ("198.18.0.0/15",)) -> Swarm:
        return Swarm(P2PConfig(enabled=True, listen=listen, key_file=local_peer_key,
                               networks=networks))

    with pytest.raises(SwarmError, match="cannot listen"):
        swarm("198.18.99.99:0")
    with pytest.raises(SwarmError, match="not in p2p.networks"):
        swarm("127.0.0.1:0", ("0.0.0.0/0",))  # never loopback
    with pytest.raises(SwarmError, match="not in p2p.networks"):
        swarm("198.19.254.1:0", ("10.0.0.0/8",))


# -- swarms of nodes in network namespaces ---------------------------------------------------


@dataclass(frozen=True)
class Lan:
    prefix: str

    def netns(self, i: int) -> str:
        return f"{self.prefix}-n{i}"

    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{i + 1}"


@pytest.fixture(scope="module")
def lan():
    require(netns.netns_available(), "the p2p swarm tests (network namespaces)")
    lan = Lan(f"bsp2p{os.getpid()}")
    switch = f"{lan.prefix}-sw"
    made: list[str] = []
    try:
        netns.add(switch)
        made.append(switch)
        netns.ip("link", "add", "br0", "type", "bridge", netns=switch)
        netns.ip("link", "set", "br0", "up", netns=switch)
        for i in range(NODES):
            name = lan.netns(i)
            netns.add(name)
            made.append(name)
            subprocess.run([*netns.enter_argv(name), "sysctl", "-qw",
                            "net.ipv6.conf.all.disable_ipv6=1"], check=True, timeout=30)
            netns.ip("link", "add", "name", "eth0", "netns", name, "type", "veth", "peer",
                     "name", f"p{i}", "netns", switch)
            netns.ip("link", "set", f"p{i}", "master", "br0", "up", netns=switch)
            netns.ip("addr", "add", f"{lan.address(i)}/24", "dev", "eth0", netns=name)
            netns.ip("link", "set", "eth0", "up", netns=name)
        yield lan
    finally:
        for name in reversed(made):
            netns.delete(name)


class Node:
    """A p2p_node.py process in namespace i; its output lines, read as they come."""

    def __init__(self, lan: Lan, i: int, spec: dict, work: Path) -> None:
        self.i = i
        self.stderr = work / f"node{i}.stderr"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "dev")])}
        # A uid of its own (setpriv's exec of this venv's Python, under root's home,
        # still passes root's checks).
        who = ["setpriv", f"--reuid={spec['uid']}", f"--regid={spec['uid']}",
               "--clear-groups"] if "uid" in spec else []
        self.proc = subprocess.Popen(
            [*netns.enter_argv(lan.netns(i)), *who, PY, str(NODE_SCRIPT), json.dumps(spec)],
            stdout=subprocess.PIPE, stderr=self.stderr.open("w"), text=True, env=env)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout: float = 30.0) -> dict:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"node {self.i}: no answer in {timeout} s\n"
                        f"{self.stderr.read_text()[-3000:]}")
        if line is None:
            pytest.fail(f"node {self.i} ended (rc={self.proc.wait()}):\n"
                        f"{self.stderr.read_text()[-3000:]}")
        return json.loads(line)


@pytest.fixture
def cluster(lan, tmp_path: Path):
    """Start nodes on the LAN (``start(i, role, **spec)``); all are killed at the end."""
    started: list[Node] = []
    go, stop, key = tmp_path / "go", tmp_path / "stop", tmp_path / "p2p.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)

    def start(blob: Blob, i: int, role: str, job: str, **spec) -> Node:
        full = {"role": role, "store": blob.url, "digest": blob.digest, "job": job,
                "node": f"n{i}", "listen": f"{lan.address(i)}:0", "go": str(go),
                "stop": str(stop), "work": str(tmp_path / f"n{i}-{len(started)}"),
                "key_file": str(key), "networks": [f"{SUBNET}.0/24"], **spec}
        node = Node(lan, i, full, tmp_path)
        started.append(node)
        return node

    start.go, start.stop = go, stop  # type: ignore[attr-defined]
    yield start
    stop.touch()
    for node in started:
        try:
            node.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait()


def _fetched(node: Node, blob: Blob) -> dict:
    result = node.next()
    assert result["sha256"] == blob.digest, result
    assert result["store_bytes"] == result["result_store_bytes"], result
    return result


def test_four_nodes_read_the_blob_from_the_store_about_once(cluster, tmp_path: Path) -> None:
    blob = _blob(tmp_path)
    nodes = [cluster(blob, i, "fetch", "four") for i in range(4)]
    assert all("ready" in n.next() for n in nodes)
    cluster.go.touch()
    results = [_fetched(n, blob) for n in nodes]
    store_bytes = sum(r["store_bytes"] for r in results)
    assert all(r["members"] == 4 and r["peers"] >= 1 for r in results), results
    assert store_bytes <= 1.2 * BLOB_SIZE, (store_bytes, results)
    assert all(r["peer_bytes"] >= BLOB_SIZE // 2 for r in results), results
    # A node that starts once they have it reads nothing from the store.
    late = cluster(blob, 4, "fetch", "four")
    assert "ready" in late.next()
    result = _fetched(late, blob)
    assert result["store_bytes"] == 0 and result["members"] == 5, result
    cluster.stop.touch()
    # What the five needed from peers (3/4 of it for the four, all of it for the late
    # one), the four uploaded (libtorrent's payload counters, as /metrics shows them).
    uploaded = [n.next()["uploaded"] for n in nodes]
    assert sum(uploaded) >= 4 * BLOB_SIZE * 3 // 4 + BLOB_SIZE, uploaded
    print(f"four nodes: {store_bytes / BLOB_SIZE:.3f}x the blob from the store, "
          f"{max(r['seconds'] for r in results):.2f} s; late node {result['seconds']:.2f} s")


def test_a_node_killed_mid_transfer_costs_time_not_correctness(cluster, tmp_path) -> None:
    blob = _blob(tmp_path)
    # Slow enough that the transfer takes seconds: 2 MiB/s out of each node.
    spec = {"store_delay": 0.05, "upload_rate": 2 << 20, "piece_grace": 1.0}
    nodes = [cluster(blob, i, "fetch", "kill", **spec) for i in range(4)]
    assert all("ready" in n.next() for n in nodes)
    cluster.go.touch()
    time.sleep(1.0)
    victim = nodes[3]
    assert victim.lines.empty(), "node 3 finished before it could be killed"
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    results = [_fetched(n, blob) for n in nodes[:3]]
    assert max(r["seconds"] for r in results) > 1.0  # it was mid-transfer for them too
    # Node 3's share that nobody had yet is read again, split among the three.
    store_bytes = sum(r["store_bytes"] for r in results)
    assert store_bytes <= 1.5 * BLOB_SIZE, results
    print(f"node killed: survivors {store_bytes / BLOB_SIZE:.3f}x the blob from the store, "
          f"{max(r['seconds'] for r in results):.2f} s")


def test_a_peer_sending_bad_pieces_is_banned_and_nothing_bad_is_kept(cluster, tmp_path) -> None:
    blob = _blob(tmp_path)
    attacker = cluster(blob, 0, "attacker", "bad")
    assert "ready" in attacker.next()
    victim = cluster(blob, 1, "fetch", "bad")
    assert "ready" in victim.next()
    cluster.go.touch()
    result = _fetched(victim, blob)
    assert result["banned"] == [Lan.address(0)], result
    assert result["peer_bytes"] > 0  # the attacker did send its pieces
    # Every piece came from the store (one may be read twice: a store piece that met a
    # block of the attacker's in libtorrent's buffers fails its hash and is read again).
    assert BLOB_SIZE <= result["store_bytes"] <= BLOB_SIZE + 2 * (512 << 10), result
    print(f"bad peer banned; the victim done in {result['seconds']:.2f} s")
    cluster.stop.touch()
    assert attacker.next()["uploaded"] > 0


def _shared_object(tmp_path: Path, size: int = BLOB_SIZE) -> tuple[Blob, str, str]:
    """A blob (the cluster's spec needs one) and an object with no digest or torrent (a
    checkpoint file) under a key of its own: (blob, key, the object's sha256)."""
    blob = _blob(tmp_path, torrent=False)
    data = os.urandom(size)
    blob.blobs.store.put("ckpt/model.bin", data)
    return blob, "ckpt/model.bin", "sha256:" + hashlib.sha256(data).hexdigest()


def test_four_nodes_hash_a_file_together_and_read_it_from_the_store_once(
        cluster, tmp_path: Path) -> None:
    blob, key, digest = _shared_object(tmp_path)
    nodes = [cluster(blob, i, "share", "ckpt", key=key) for i in range(4)]
    assert all("ready" in n.next() for n in nodes)
    cluster.go.touch()
    results = [n.next() for n in nodes]
    assert all(r["shared"] and r["sha256"] == digest for r in results), results
    store_bytes = sum(r["store_bytes"] for r in results)
    # Each reads its quarter once, to hash it and to give it to the swarm.
    assert store_bytes <= 1.2 * BLOB_SIZE, results
    store = blob.blobs.store
    assert [i.key.rsplit("/", 1)[1] for i in store.list("p2p/files/")
            if ".layers/" in i.key] == ["4-0", "4-1", "4-2", "4-3"]
    # The next restart of the same checkpoint finds its torrent: no hashing, and the
    # late node's bytes come from the four seeds.
    late = cluster(blob, 4, "share", "ckpt", key=key)
    assert "ready" in late.next()
    result = late.next()
    assert result["shared"] and result["sha256"] == digest, result
    assert result["store_bytes"] == 0 and result["peer_bytes"] >= BLOB_SIZE, result


def test_a_member_that_never_hashes_its_share_costs_time_not_correctness(
        cluster, tmp_path: Path) -> None:
    blob, key, digest = _shared_object(tmp_path)
    # Members 198.18.64.250 is listed but never answers: its share is read by the others.
    spec = {"key": key, "extra": "198.18.64.250:6881", "piece_grace": 0.5}
    nodes = [cluster(blob, i, "share", "gone", **spec) for i in range(3)]
    assert all("ready" in n.next() for n in nodes)
    cluster.go.touch()
    results = [n.next(timeout=60) for n in nodes]
    assert all(r["shared"] and r["sha256"] == digest for r in results), results
    assert sum(r["store_bytes"] for r in results) <= 3.5 * BLOB_SIZE, results


def test_hashes_a_store_writer_forged_never_reach_a_copy(cluster, tmp_path) -> None:
    from bootseer.p2p.sharedfile import SharedFile

    blob, key, digest = _shared_object(tmp_path)
    store = blob.blobs.store
    info = store.stat(key)
    shared = SharedFile(store, store, key, f"{store.url}/{key}", info.size, info.mtime)
    pieces = BLOB_SIZE // torrents.piece_size_for(BLOB_SIZE)
    # Member 1 of 2's hashes and their tag, forged (the right size) before either starts:
    # whoever writes the store, without the cluster's key.
    store.put(torrents.key(shared.identity, addressed=False) + ".layers/2-1",
              os.urandom(32 * (pieces // 2) + 32))
    nodes = [cluster(blob, i, "share", "liar", key=key) for i in range(2)]
    assert all("ready" in n.next() for n in nodes)
    cluster.go.touch()
    results = [n.next(timeout=60) for n in nodes]
    # A node that meets the record refuses it (and removes it): no copy, the caller reads
    # plainly. One that comes after hashes the share itself. No copy is of other bytes.
    assert any(not r["shared"] for r in results), results
    for r in results:
        assert (not r["shared"] and not r["exists"]) or r["sha256"] == digest, results


def test_a_share_record_of_the_wrong_size_is_refused_and_removed(
        tmp_path: Path, local_swarm) -> None:
    from bootseer.p2p.sharedfile import SharedFile

    blob, key, _ = _shared_object(tmp_path)
    store = blob.blobs.store
    info = store.stat(key)
    shared = SharedFile(store, store, key, f"{store.url}/{key}", info.size, info.mtime)
    layers = torrents.key(shared.identity, addressed=False) + ".layers/"
    with local_swarm() as swarm:
        other = Peer(LOCAL_PEERS[2], 6881)  # listed, never answers; sorts after this node
        for record in (b"x" * 5, b"x" * (1 << 20)):  # short; far larger than a share
            store.put(layers + "2-1", record)
            fanout = Fanout(swarm, (swarm.address, other))
            dest = tmp_path / "copy"
            assert fanout.fetch_file(shared, dest, tmp_path / "spool") is None
            assert not dest.exists()
            assert not list(store.list("p2p/files/"))  # the hashes went with it


def test_the_upload_cap_holds(cluster, tmp_path: Path) -> None:
    blob = _blob(tmp_path)
    cap = 4 << 20
    seeder = cluster(blob, 0, "seed", "cap", upload_rate=cap)
    assert "ready" in seeder.next()
    fetcher = cluster(blob, 1, "fetch", "cap")
    assert "ready" in fetcher.next()
    cluster.go.touch()
    result = _fetched(fetcher, blob)
    assert result["store_bytes"] == 0, result  # the seeder had every piece
    assert result["peer_bytes"] / result["seconds"] <= 1.3 * cap, result
    assert result["seconds"] >= 0.7 * BLOB_SIZE / cap, result  # uncapped: a tenth of it
    print(f"capped at {cap >> 20} MiB/s: {result['peer_bytes'] / result['seconds'] / 2**20:.2f}"
          f" MiB/s")


def test_a_peer_without_the_cluster_key_gets_no_byte(cluster, tmp_path: Path) -> None:
    """Anyone who can read the store (its torrents are world-readable) and reach a node's
    port, as another uid and without the key: whatever encryption it tries, a seeding
    node names nothing it holds to it. A key holder fetches from the same seed."""
    blob = _blob(tmp_path)
    seed = cluster(blob, 0, "seed", "keyed")
    address = seed.next()["ready"]
    work = Path(tempfile.mkdtemp(prefix="bootseer-outsider-"))
    try:
        work.chmod(0o777)
        torrent = blob.blobs.store.get(torrents.key(blob.digest))
        outsider = cluster(blob, 1, "outsider", "keyed", uid=65534, target=address,
                           torrent=torrent.hex(), seconds=3, work=str(work))
        assert outsider.next(timeout=60) == {"downloaded": 0, "uid": 65534}
        assert not any(p.stat().st_size for p in work.rglob("*") if p.is_file())
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=True)
    member = cluster(blob, 2, "fetch", "keyed")
    assert "ready" in member.next()
    cluster.go.touch()
    result = _fetched(member, blob)
    assert result["peer_bytes"] >= BLOB_SIZE // 2, result  # the seed served it


def test_off_means_no_listener_and_a_plain_store_read(cluster, tmp_path: Path) -> None:
    blob = _blob(tmp_path)
    node = cluster(blob, 0, "off", "off")
    result = node.next()
    assert result == {"swarm": False, "libtorrent": False, "listening": [],
                      "store_bytes": BLOB_SIZE, "peer_bytes": 0, "sha256": blob.digest}


def test_a_demand_read_is_served_by_a_peer_that_has_its_pieces(tmp_path: Path, local_swarm) -> None:
    blob = _blob(tmp_path)  # 16 pieces of 512 KiB
    torrent = torrents.load(blob.blobs.store, blob.digest, BLOB_SIZE)
    key = blob.blobs.blob_key(blob.digest)
    counted: dict[str, int] = {"a": 0, "b": 0}

    def reader(name: str):
        def read_range(offset: int, length: int) -> bytes:
            counted[name] += length
            return blob.blobs.store.read_range(key, offset, length)
        return read_range

    a = local_swarm(0)
    b = local_swarm(1)
    with a, b:
        peers = (a.address, b.address)
        piece = torrent.piece_size
        for swarm, name in ((a, "a.part"), (b, "b.part")):  # as a mount opens its packs
            swarm.open(torrent, tmp_path / name, peers)
        wait_until(lambda: a.stats().peers and b.stats().peers)
        # Piece 0 is a's (members sorted: a first): a reads it from the store.
        span = (100, piece + 5000)  # into piece 1, b's: a waits for b, then the store
        got = a.read(torrent, tmp_path / "a.part", *span, peers, reader("a"), wait=0.5)
        assert got == blob.data[100:100 + piece + 5000]
        assert counted["a"] == 2 * piece
        # b finds both pieces at a (once a's HAVE messages came): none from its store.
        time.sleep(0.5)
        got = b.read(torrent, tmp_path / "b.part", *span, peers, reader("b"), wait=0.5)
        assert got == blob.data[100:100 + piece + 5000]
        assert counted["b"] == 0, counted
        # The partial files hold only what was read (sparse), and are served on.
        assert os.stat(tmp_path / "b.part").st_blocks * 512 <= 2 * piece + (64 << 10)
        with pytest.raises(ValueError):
            b.read(torrent, tmp_path / "b.part", BLOB_SIZE - 1, 2, peers, reader("b"), 0.5)
        a.wind_down(0)
        wait_until(lambda: not (tmp_path / "a.part").exists())  # expired: removed


class _CountingStore(LocalStore):
    """A local store that counts the bytes its ranged reads return."""

    read_bytes = 0

    def _read_range(self, key: str, offset: int, length: int) -> bytes:
        data = super()._read_range(key, offset, length)
        self.read_bytes += len(data)
        return data


def test_a_demand_read_of_a_checkpoint_file_is_served_by_the_members_that_staged_it(
        tmp_path: Path, local_swarm, request: pytest.FixtureRequest) -> None:
    """A node that did not stage the checkpoint reads a range of one of its files through
    the job's swarm: from the member that staged it (and seeds it), checked against the
    piece hashes the job's warms published, and not at all from the store."""
    from bootseer.p2p.demand import DemandReads, NotShared
    from bootseer.p2p.rendezvous import Member, interest
    from bootseer.p2p.sharedfile import SharedFile, load_torrent, publish_torrent

    records = open_store((tmp_path / "records").as_uri())
    # Where every user may read (pytest's own directories are root's alone): shared only so.
    public = Path(tempfile.mkdtemp(prefix="bootseer-p2p-"))
    public.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(public))
    ckpt = _CountingStore((public / "ckpt").as_uri())
    data = os.urandom((4 << 20) + 1234)
    ckpt.put("model.bin", data)
    ckpt.put("small.bin", data[:1000])
    info = ckpt.stat("model.bin")
    url = f"{ckpt.url}/model.bin"
    file = SharedFile(ckpt, records, "model.bin", url, info.size, info.mtime)
    piece = torrents.piece_size_for(info.size)
    layer = b"".join(torrents.piece_hash(data[i:i + piece], piece)
                     for i in range(0, info.size, piece))
    # Forged first: a torrent of the same pieces without the key's tag is no one's.
    torrents.publish(records, file.identity,
                     torrents.build_from_layer(file.identity, info.size, piece, layer),
                     addressed=False)
    (tmp_path / "copy").write_bytes(data)  # the staging member's verified copy
    ckpt.read_bytes = 0
    a = local_swarm(0)
    b = local_swarm(1)
    with a, b:
        forged = DemandReads(b, records, tmp_path / "partial", "n1", 0.5, lambda url: True)
        forged.met("j", [Member(a.address, frozenset({interest(ckpt.url)})),
                         Member(b.address)])
        with pytest.raises(NotShared):
            forged.read_file("j", file, 0, 100)
        records.delete(torrents.key(file.identity, addressed=False))
        publish_torrent(file, a.trust.key, piece, layer)  # as the job's warms do
        torrent = load_torrent(file, a.trust)
        assert a.seed(torrent, tmp_path / "copy", [b.address])
        for shares, mode in ((False, 0o644), (True, 0o600)):  # not shared, or not public
            os.chmod(public / "ckpt" / "model.bin", mode)
            refused = DemandReads(b, records, tmp_path / "partial", "n1", 0.5,
                                  lambda url, shares=shares: shares)
            refused.met("j", forged._met["j"])
            with pytest.raises(NotShared):
                refused.read_file("j", file, 0, 100)
        os.chmod(public / "ckpt" / "model.bin", 0o644)
        demand = DemandReads(b, records, tmp_path / "partial", "n1", 0.5, lambda url: True)
        # a warmed the checkpoint's directory; b warmed something else of the job.
        demand.met("j", [Member(a.address, frozenset({interest(ckpt.url)})),
                         Member(b.address)])
        span = (piece - 100, piece + 5000)  # across two pieces
        assert demand.read_file("j", file, *span) == data[span[0]:span[0] + span[1]]
        assert ckpt.read_bytes == 0, ckpt.read_bytes
        assert demand.snapshot().reads == 1
        other = SharedFile(ckpt, records, "model.bin", url, info.size, info.mtime + 1)
        small = ckpt.stat("small.bin")
        for refused in (other,  # rewritten since: no torrent for this version
                        SharedFile(ckpt, records, "small.bin", f"{ckpt.url}/small.bin",
                                   small.size, small.mtime)):
            with pytest.raises(NotShared):
                demand.read_file("j", refused, 0, 100)
        with pytest.raises(NotShared):
            demand.read_file("j", file, info.size - 10, 100)  # past its end
        assert demand.snapshot().fallbacks == 3


def test_no_record_or_list_makes_a_node_dial_outside_its_networks(
        tmp_path: Path, local_swarm) -> None:
    """Peers named by a root's list (records are checked the same, above): loopback,
    unspecified, multicast, broadcast, link-local and off-network addresses are never
    dialed, whether the node fetches, seeds or reads on demand."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    bad = [Peer("127.0.0.1", port), Peer("0.0.0.0", port), Peer("224.0.0.1", port),
           Peer("255.255.255.255", port), Peer("169.254.1.1", port), Peer("10.9.9.9", port),
           Peer("::1", port), Peer.of("::ffff:127.0.0.1", port)]
    blob = _blob(tmp_path)
    torrent = torrents.load(blob.blobs.store, blob.digest, BLOB_SIZE)
    with local_swarm() as swarm:
        assert swarm.members(bad) == [swarm.address]
        result = swarm.fetch(torrent, tmp_path / "got", bad,
                             lambda o, n: blob.blobs.read_range(blob.digest, o, n))
        assert result.store_bytes == BLOB_SIZE
        assert (tmp_path / "got").read_bytes() == blob.data
        assert swarm.seed(torrent, tmp_path / "got", bad)
    with local_swarm(1) as swarm:  # a demand read: its own pieces, from the store
        got = swarm.read(torrent, tmp_path / "part", 0, 100, bad,
                         lambda o, n: blob.blobs.read_range(blob.digest, o, n), wait=0.2)
        assert got == blob.data[:100]
        time.sleep(1.5)  # past a redial
    accepted = 0
    while True:
        try:
            listener.accept()[0].close()
            accepted += 1
        except TimeoutError:
            break
    listener.close()
    assert accepted == 0


def test_a_file_has_at_most_max_hashers_hash_records_and_none_empty(
        tmp_path: Path, local_swarm) -> None:
    """Thousands of members (a list or records naming them): the first MAX_HASHERS hash,
    a silent share is read by those there, and no empty share gets a record."""
    from bootseer.p2p.sharedfile import MAX_HASHERS, SharedFile

    store = open_store((tmp_path / "store").as_uri())
    data = os.urandom(2 << 20)  # 16 pieces of 128 KiB: fewer pieces than members
    store.put("ckpt.bin", data)
    info = store.stat("ckpt.bin")
    shared = SharedFile(store, store, "ckpt.bin", f"{store.url}/ckpt.bin", info.size,
                        info.mtime)
    with local_swarm(piece_grace=0.2, networks=("198.19.0.0/16",)) as swarm:
        many = tuple(Peer(f"198.19.{i // 250}.{i % 250 + 1}", 6881) for i in range(4096))
        result = Fanout(swarm, many).fetch_file(shared, tmp_path / "copy",
                                                tmp_path / "spool")
    assert result is not None and (tmp_path / "copy").read_bytes() == data
    records = [i.key for i in store.list("p2p/files/") if ".layers/" in i.key]
    assert 0 < len(records) <= min(MAX_HASHERS, 16), records
    assert all(r.rsplit("/", 1)[1].startswith("16-") for r in records), records


# -- hostile records, fuzzed ------------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=24)
_FIELD = {"node": st.just("fz") | st.text(max_size=12), "address": st.sampled_from(
    ["198.18.64.7", "127.0.0.1", "::1", "0.0.0.0", "x"]) | st.text(max_size=12),
    "port": st.integers(-2, 70000) | _JSON, "time": st.floats() | _JSON,
    "wants": st.lists(st.sampled_from(["a" * 64, "../x"]), max_size=3) | _JSON,
    "auth": st.sampled_from(["0" * 64, "zz"]) | _JSON}
_RECORDS = st.one_of(
    st.binary(max_size=4096),
    _JSON.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({}, optional=_FIELD).map(lambda d: json.dumps(d).encode()),
    st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),  # nested: no RecursionError
    st.integers(1, 200_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n))
_FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


@_FUZZ
@given(record=_RECORDS)
def test_fuzzed_peer_records_are_skipped_in_bounded_memory(tmp_path: Path,
                                                          record: bytes) -> None:
    store = LocalStore((tmp_path / "fuzz").as_uri())
    store.put(f"{rendezvous.peers_dir('j')}/fz.json", record)
    tracemalloc.start()
    try:
        assert rendezvous.roster(store, TRUST, "j") == []  # none is authenticated
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


@_FUZZ
@given(record=_RECORDS, name=st.sampled_from(["2-1", "2-0", "64-3", "x"]))
def test_fuzzed_hash_records_and_torrents_are_refused_cleanly(
        tmp_path: Path, record: bytes, name: str) -> None:
    """A share's hashes or a checkpoint's torrent, as any store writer may leave them: a
    ShareError (the fetch reads the store) or absence, nothing else, in bounded memory."""
    from bootseer.p2p import sharedfile

    store = LocalStore((tmp_path / "fuzz").as_uri())
    shared = sharedfile.SharedFile(store, store, "f", "file:///f", 4 << 20, 1.0)
    prefix = torrents.key(shared.identity, addressed=False)
    store.put(f"{prefix}.layers/{name}", record)
    store.put(prefix, record)
    tracemalloc.start()
    try:
        with pytest.raises(sharedfile.ShareError):
            sharedfile.load_torrent(shared, TRUST)
        hashes: dict[int, bytes] = {}
        if name != "x":
            hashers, k = map(int, name.split("-"))
            with pytest.raises(sharedfile.ShareError):
                sharedfile._load_share(shared, TRUST.key, f"{prefix}.layers/{name}", k,
                                       hashers, 16, hashes)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert hashes == {} and peak < 4 << 20, peak


def test_the_peer_key_and_networks_are_refused_unless_safe(tmp_path: Path) -> None:
    """The key file is the operator's: a missing one, a link, a directory, one another user
    owns or may read, or one too short starts no swarm, saying how to make one."""
    from bootseer.errors import ConfigError
    from bootseer.p2p.trust import PeerKeyError

    good = tmp_path / "p2p.key"
    good.write_bytes(os.urandom(32))
    good.chmod(0o600)
    assert PeerKey.load(good).tag("x", 1) == PeerKey.load(good).tag("x", 1)
    link, short, shared, theirs = (tmp_path / n for n in ("link", "short", "shared", "theirs"))
    link.symlink_to(good)
    short.write_bytes(b"k" * 31)
    shared.write_bytes(os.urandom(32))
    theirs.write_bytes(os.urandom(32))
    for path, mode in ((short, 0o600), (shared, 0o640), (theirs, 0o600)):
        path.chmod(mode)
    os.chown(theirs, 65534, 65534)
    for bad, why in ((tmp_path / "none", "no peer key"), (link, "not a link"),
                     (tmp_path, "regular file"), (short, "31 bytes"),
                     (shared, "readable by its owner only"),
                     (theirs, "readable by its owner only")):
        with pytest.raises(PeerKeyError, match=why):
            PeerKey.load(bad)
    with pytest.raises(ConfigError, match="p2p.networks is empty"):
        Trust.from_config(P2PConfig(enabled=True, key_file=good))
    with pytest.raises(ConfigError, match="p2p.networks"):
        Networks.parse(["10.0.0.0/33"])
    nets = Networks.parse(["10.0.3.0/24", "fd00::/64"])
    assert [nets.allows(a) for a in ("10.0.3.7", "10.0.4.1", "fd00::9", "fe80::1",
                                     "127.0.0.1", "::ffff:10.0.3.7", "host")] == \
        [True, False, True, False, False, True, False]

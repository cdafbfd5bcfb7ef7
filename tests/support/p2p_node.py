"""One node of a peer-to-peer test, run in its network namespace by tests/system/test_p2p.py.

``python p2p_node.py SPEC_JSON``; the spec's ``role``:

* ``fetch``: a Swarm on ``listen``; announce in the job; print ``{"ready": ADDRESS}``;
  wait for the file ``go``; fetch the blob from the job's members (store reads counted
  at ``read_range``, each delayed by ``store_delay``), keep it where a cache would and
  seed it from there; print the result; wait for ``stop``.
* ``seed``: the blob read plainly from the store, seeded; announce; ready; wait for stop.
* ``attacker``: a bare libtorrent session with hash checks off seeding a corrupted copy
  (every byte flipped) in seed mode, so it serves bad pieces; it holds the cluster's key
  (a node gone bad: it connects and announces like one); announce; ready; stop.
* ``outsider``: anyone who can read the store but holds no key (run as another uid, no
  store access: the torrent's bytes come in the spec as ``torrent``): a plain libtorrent
  session that dials ``target`` for ``seconds`` with the store's torrent, every
  encryption setting libtorrent has tried in turn; prints the payload bytes it got.
* ``share``: like ``fetch``, for the store object at ``key`` (no digest, no torrent
  published beforehand: a checkpoint file) through ``Fanout.fetch_file``, with ``extra``
  peers that never answer added to the members; prints the result (or ``shared: false``).
* ``off``: p2p disabled: ``open_swarm`` and ``fetch_blob`` as a node would call them;
  prints the result, whether libtorrent was loaded, and the sockets listening in the
  namespace.

Every line printed is one JSON object; errors go to stderr.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from bootseer.config import P2PConfig
from bootseer.p2p import Peer, fetch_blob, open_swarm, rendezvous
from bootseer.store import BlobStore, open_store


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.01)


def sha256_of(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def listening_sockets() -> list[str]:
    found = []
    for name in ("tcp", "tcp6"):
        with open(f"/proc/self/net/{name}") as f:
            found += [line.split()[1] for line in f.readlines()[1:] if line.split()[3] == "0A"]
    return found


def main(spec: dict) -> None:
    store = open_store(spec["store"])
    blobs = BlobStore(store)
    digest, work = spec["digest"], Path(spec["work"])
    work.mkdir(parents=True, exist_ok=True)
    if spec["role"] == "outsider":
        return outsider(spec)
    config = P2PConfig(enabled=spec["role"] != "off", listen=spec["listen"],
                       upload_rate=spec.get("upload_rate", 0),
                       seed_time=spec.get("seed_time", 600.0),
                       piece_grace=spec.get("piece_grace", 2.0),
                       key_file=Path(spec["key_file"]), networks=tuple(spec["networks"]))
    if spec["role"] == "off":
        swarm = open_swarm(config)
        result = fetch_blob(blobs, digest, work / "blob", swarm=swarm)
        say(swarm=swarm is not None, libtorrent="libtorrent" in sys.modules,
            listening=listening_sockets(), store_bytes=result.store_bytes,
            peer_bytes=result.peer_bytes, sha256=sha256_of(work / "blob"))
        return
    if spec["role"] == "attacker":
        return attacker(spec, blobs, work)
    if spec["role"] == "share":
        return share(spec, config, store, work)
    from bootseer.p2p import torrents  # loads libtorrent: not for the "off" role

    swarm = open_swarm(config)
    assert swarm is not None
    size = blobs.stat(digest).size
    torrent = torrents.load(store, digest, size)
    final = work / "cache" / digest[7:]
    final.parent.mkdir(parents=True, exist_ok=True)
    if spec["role"] == "seed":
        fetch_blob(blobs, digest, final, swarm=None)
        swarm.seed(torrent, final)
    rendezvous.announce(store, swarm.trust, spec["job"], spec["node"], swarm.address)
    say(ready=str(swarm.address))
    if spec["role"] == "fetch":
        wait_for(spec["go"])
        peers = rendezvous.members(store, swarm.trust, spec["job"])
        counted = [0]
        lock = threading.Lock()

        def read_range(offset: int, length: int) -> bytes:
            time.sleep(spec.get("store_delay", 0.0))
            with lock:
                counted[0] += length
            return blobs.read_range(digest, offset, length)

        result = swarm.fetch(torrent, work / "tmp", peers, read_range)
        os.replace(work / "tmp", final)
        swarm.seed(torrent, final, peers)
        say(store_bytes=counted[0], result_store_bytes=result.store_bytes,
            peer_bytes=result.peer_bytes, peers=result.peers, banned=list(result.banned),
            seconds=result.seconds, members=len(peers), sha256=sha256_of(final))
    wait_for(spec["stop"])
    stats = swarm.stats()
    swarm.close()
    say(stopped=True, uploaded=stats.uploaded_bytes, seeding=stats.seeding)


def share(spec: dict, config: P2PConfig, store, work: Path) -> None:
    from bootseer.p2p import Fanout, parse_peers
    from bootseer.p2p.sharedfile import SharedFile

    swarm = open_swarm(config)
    assert swarm is not None
    key = spec["key"]
    counted = [0]
    lock = threading.Lock()
    read_range = store.read_range

    def counting(k: str, offset: int, length: int) -> bytes:
        time.sleep(spec.get("store_delay", 0.0))
        if k == key:
            with lock:
                counted[0] += length
        return read_range(k, offset, length)

    store.read_range = counting  # every store read of the object, the hashing's included
    rendezvous.announce(store, swarm.trust, spec["job"], spec["node"], swarm.address)
    say(ready=str(swarm.address))
    wait_for(spec["go"])
    peers = rendezvous.members(store, swarm.trust, spec["job"]) + \
        parse_peers(spec.get("extra", ""))
    info = store.stat(key)
    shared = SharedFile(store, store, key, f"{store.url}/{key}", info.size, info.mtime)
    fanout = Fanout(swarm, tuple(peers))
    dest, spool = work / "copy", work / "spool"
    result = fanout.fetch_file(shared, dest, spool)
    if result is None:
        say(shared=False, store_bytes=counted[0], exists=dest.exists())
    else:
        final = work / "cache" / "copy"
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(dest, final)
        fanout.seed_file(shared, final)
        say(shared=True, store_bytes=counted[0], peer_bytes=result.peer_bytes,
            seconds=result.seconds, members=len(peers), sha256=sha256_of(final))
    wait_for(spec["stop"])
    swarm.close()
    say(stopped=True)


def attacker(spec: dict, blobs: BlobStore, work: Path) -> None:
    import libtorrent as lt

    from bootseer.p2p import torrents
    from bootseer.p2p.trust import Trust

    trust = Trust.from_config(P2PConfig(key_file=Path(spec["key_file"]),
                                        networks=tuple(spec["networks"])))
    digest = spec["digest"]
    size = blobs.stat(digest).size
    torrent = torrents.load(blobs.store, digest, size)
    bad = work / "bad"
    bad.mkdir(exist_ok=True)
    (bad / digest[7:]).write_bytes(bytes(b ^ 0xFF for b in blobs.get(digest)))
    host, _, _ = spec["listen"].rpartition(":")
    ses = lt.session({"listen_interfaces": spec["listen"], "enable_dht": False,
                      "enable_lsd": False, "enable_upnp": False, "enable_natpmp": False,
                      "enable_incoming_utp": False, "enable_outgoing_utp": False,
                      "disable_hash_checks": True, "unchoke_slots_limit": -1,
                      "in_enc_policy": 0, "out_enc_policy": 0}, 0)  # forced, as nodes are
    params = lt.add_torrent_params()
    params.ti = torrent.keyed(trust)
    params.save_path = str(bad)
    params.flags = lt.torrent_flags.seed_mode
    ses.add_torrent(params)
    deadline = time.monotonic() + 10
    while not ses.is_listening() or ses.listen_port() == 0:
        assert time.monotonic() < deadline, "the attacker cannot listen"
        time.sleep(0.01)
    rendezvous.announce(blobs.store, trust, spec["job"], spec["node"],
                        Peer(host, ses.listen_port()))
    say(ready=f"{host}:{ses.listen_port()}")
    wait_for(spec["stop"])
    uploaded = ses.get_torrents()[0].status().total_payload_upload
    del ses
    say(stopped=True, uploaded=uploaded)


def outsider(spec: dict) -> None:
    import libtorrent as lt

    work = Path(spec["work"])
    got = 0
    for enc in (2, 1, 0):  # plaintext, encryption allowed, encryption forced
        ses = lt.session({"listen_interfaces": spec["listen"], "enable_dht": False,
                          "enable_lsd": False, "enable_upnp": False, "enable_natpmp": False,
                          "in_enc_policy": enc, "out_enc_policy": enc}, 0)
        params = lt.add_torrent_params()
        params.ti = lt.torrent_info(bytes.fromhex(spec["torrent"]))
        params.save_path = str(work)
        handle = ses.add_torrent(params)
        host, _, port = spec["target"].rpartition(":")
        deadline = time.monotonic() + spec["seconds"]
        while time.monotonic() < deadline:
            handle.connect_peer((host, int(port)))
            time.sleep(0.2)
        got += handle.status().total_payload_download
        del ses
    say(downloaded=got, uid=os.getuid())


if __name__ == "__main__":
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                        format="%(relativeCreated)6d %(name)s %(message)s")
    main(json.loads(sys.argv[1]))

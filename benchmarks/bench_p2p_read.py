"""Demand reads served by a peer vs the same reads from an idle store (issue #17).

A fleet lab of two nodes with peer-to-peer on, one DataNode: every link capped (no
latency added: the kernel has no ``netem``). A 64 MiB object stands for an image pack
(``packs/<sha256>``, its torrent published as a conversion publishes it). Both nodes are
members of one job.

* ``store_idle``: node 1 reads K ranges of ``--read-size`` straight from the store (its
  own HDFS client, connected; the DataNode otherwise idle): what a mount server does
  without peers.
* ``first_reader``: node 0 reads the same ranges through its agent (``/v1/p2p/read``):
  its own pieces from the store, node 1's after ``p2p.demand_wait`` (node 1 is connected
  and has none): the cost of being first, for the record.
* ``peer_served``: node 1 reads the same ranges through its agent: every piece from
  node 0. The goal: its median no slower than ``store_idle``'s.

Before each timed case one untimed read (another range) opens the connections, as a
mount's early open of its image's packs does. Physical limit: a range over the node's
link, ``read_size / node_link``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import textwrap
from pathlib import Path

from benchlib import Recording, busy_fraction, cpu_times, figure

from bootseer_dev.cluster import parse_link
from bootseer_dev.fleet import Lab, LabSpec
from bootseer_dev.fleet.spec import P2P_PORT

log = logging.getLogger("bench-p2p-read")
PY = sys.executable
JOB = "p2p-read"
OBJECT_BYTES = 64 << 20

#: Run on node 0: the object and its torrent into the store; prints its key.
SETUP = textwrap.dedent("""
    import hashlib, os, sys
    from bootseer.config import load_config
    from bootseer.p2p.publish import leaf_hasher, publish_layer
    from bootseer.store import open_configured_store
    store = open_configured_store(load_config().config)
    data = os.urandom(int(sys.argv[1]))
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    key = "packs/" + digest[7:]
    store.put(key, data)
    hasher = leaf_hasher()
    hasher.update(data)
    assert publish_layer(store, digest, hasher)  # as a conversion publishes a pack's
    print(key)
""")

#: Run on a node: announce it in the job, then time reads; prints the seconds of each.
READS = textwrap.dedent("""
    import json, sys, time
    from bootseer.agents.client import AgentClient
    from bootseer.config import load_config
    from bootseer.p2p import Peer, rendezvous
    from bootseer.p2p.trust import Trust
    from bootseer.store import open_configured_store
    args = json.loads(sys.argv[1])
    config = load_config().config
    store = open_configured_store(config)
    rendezvous.announce(store, Trust.from_config(config.p2p), args["job"], args["node"],
                        Peer(args["address"], args["port"]))
    agent = AgentClient(config.agent.socket, answer_timeout=60)
    def read(offset):
        if args["via"] == "store":
            return store.read_range(args["key"], offset, args["size"])
        data = agent.peer_read(args["job"], args["key"], offset, args["size"])
        assert data is not None and len(data) == args["size"], "the agent did not serve it"
        return data
    read(args["warmup"])
    seconds = []
    for offset in args["offsets"]:
        began = time.perf_counter()
        read(offset)
        seconds.append(time.perf_counter() - began)
    print(json.dumps(seconds))
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench-results/p2p-read.json")
    parser.add_argument("--reads", type=int, default=31, help="Timed reads per case.")
    parser.add_argument("--read-size", type=int, default=2 << 20,
                        help="Bytes per read (a run of 2 MiB blocks).")
    parser.add_argument("--node-link", default="25MB/s")
    parser.add_argument("--datanode-link", default="40MB/s")
    parser.add_argument("--hdfs-base-port", type=int, default=19800)
    parser.add_argument("--state-dir", default="/var/tmp/bootseer-bench-p2p-read")
    parser.add_argument("--keep-state", action="store_true",
                        help="Keep the lab's state dir (logs, caches, HDFS's blocks).")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    spec = LabSpec(nodes=2, datanodes=1, name="p2pr", origins=False, p2p=True,
                   node_link=parse_link(args.node_link),
                   datanode_link=parse_link(args.datanode_link),
                   hdfs_base_port=args.hdfs_base_port, state_dir=Path(args.state_dir))
    lab = Lab(spec)
    recording = Recording("p2p-read")
    try:
        lab.up(timeout_s=120)
        setup = lab.run(0, [PY, "-c", SETUP, str(OBJECT_BYTES)])
        if setup.returncode != 0:
            raise SystemExit(f"setup failed: {setup.stderr[-2000:]}")
        key = setup.stdout.strip().splitlines()[-1]
        # K ranges spread over the object, and one more each case opens connections with.
        stride = (OBJECT_BYTES - args.read_size) // (args.reads + 2)
        offsets = [stride * (k + 1) + 12345 for k in range(args.reads)]
        cases = {}
        for case, node, via, warmup in (("store_idle", 1, "store", 0),
                                        ("first_reader", 0, "agent", stride // 2),
                                        ("peer_served", 1, "agent", stride // 2)):
            body = {"job": JOB, "node": spec.node(node).role, "address": spec.node(node).address,
                    "port": P2P_PORT, "key": key, "size": args.read_size, "via": via,
                    "offsets": offsets, "warmup": warmup}
            before = cpu_times()
            run = lab.run(node, [PY, "-c", READS, json.dumps(body)], timeout=600)
            busy = busy_fraction(before, cpu_times())
            if run.returncode != 0:
                raise SystemExit(f"{case} failed: {run.stderr[-2000:]}")
            seconds = json.loads(run.stdout.strip().splitlines()[-1])
            cases[case] = figure(seconds, 4) | {"cpu_busy": round(busy, 3)}
            log.info("%-12s median %.1f ms (cpu %.2f)", case, 1000 * cases[case]["median"],
                     busy)
    finally:
        lab.down()
        if not args.keep_state:  # HDFS's blocks and the nodes' caches: ~0.9 GB
            shutil.rmtree(spec.state_dir, ignore_errors=True)
    limit = args.read_size / spec.node_link.rate_bytes_per_s
    result = {
        **recording.header(runs=args.reads, caps={
            "node_Bps": spec.node_link.rate_bytes_per_s,
            "datanode_Bps": spec.datanode_link.rate_bytes_per_s,
            "latency": "none added (the kernel has no netem)"}),
        "peer_read_vs_idle_store": round(cases["peer_served"]["median"]
                                         / cases["store_idle"]["median"], 3),
        "peer_read_vs_limit": round(cases["peer_served"]["median"] / limit, 3),
        "store_read_vs_limit": round(cases["store_idle"]["median"] / limit, 3),
        "limit_s": round(limit, 4),
        "cases": cases,
        "read_bytes": args.read_size, "reads": args.reads, "object_bytes": OBJECT_BYTES,
        "first_reader_vs_idle_store": round(cases["first_reader"]["median"]
                                            / cases["store_idle"]["median"], 3),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "cases"}, indent=2))


if __name__ == "__main__":
    main()

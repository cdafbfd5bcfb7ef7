"""`python -m bootseer_dev.fleet up|status|down`: the multi-node lab from a shell.

status and down read the spec `up` saved in the state dir, so only `up` takes lab
options; every command takes --state-dir.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import click

from bootseer_dev import log_to_stderr
from bootseer_dev.cgroups import CgroupError
from bootseer_dev.cluster import ClusterError, LinkCapError, parse_link, parse_size
from bootseer_dev.netns import NetnsError

from .lab import Lab, LabError
from .nodes import AgentStartError
from .origins import OriginStartError
from .spec import LabSpec, default_state_dir
from .topology import TopologyError

_ERRORS = (LabError, AgentStartError, CgroupError, ClusterError, LinkCapError,
           NetnsError, OriginStartError, TopologyError, ValueError)

state_dir_option = click.option(
    "--state-dir", type=click.Path(path_type=Path), default=None,
    help="The lab's record, configs, caches and logs. Default: the per-user state dir.")


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """A multi-node lab on one machine (root): N emulated GPU nodes, each a network
    namespace with a tc-capped link and its own node agent, and an HDFS dev cluster whose
    NameNode and DataNodes (each capped), a docker-registry and a wheel index (each
    capped) live in namespaces of their own, all on one lab
    switch in 198.18.0.0/15 with no route out. No added latency (no sch_netem here)."""
    log_to_stderr(verbose)


@main.command()
@state_dir_option
@click.option("--nodes", "-n", type=int, default=2, show_default=True,
              help="Emulated GPU nodes, each with its own agent.")
@click.option("--datanodes", "-m", type=int, default=1, show_default=True,
              help="HDFS DataNodes (0: no HDFS; the nodes share a file:// store).")
@click.option("--node-link", default="25MB/s", show_default=True,
              help="Each node's NIC cap, both directions (e.g. 25MB/s, 200mbit).")
@click.option("--datanode-link", default="40MB/s", show_default=True,
              help="Each DataNode's link cap, both directions.")
@click.option("--origins/--no-origins", default=True, show_default=True,
              help="Also run a docker-registry and a wheel index, each on its own link.")
@click.option("--origin-link", default="40MB/s", show_default=True,
              help="The registry's and the index's link caps, both directions.")
@click.option("--store", default="", help="The agents' store URL. Default: the lab's HDFS "
              "(hdfs://198.18.0.1:PORT/bootseer).")
@click.option("--name", default="lab", show_default=True,
              help="Prefix of the lab's namespace names (bsl-NAME-...): 1-8 letters/digits.")
@click.option("--hdfs-base-port", type=int, default=9000, show_default=True,
              help="NameNode rpc port (the dev cluster's --base-port layout).")
@click.option("--block-size", default="8m", show_default=True, help="HDFS block size.")
@click.option("--engines/--no-engines", default=False, show_default=True,
              help="Also run a Docker engine per node, with Bootseer's runtime as deployed.")
@click.option("--p2p/--no-p2p", default=False, show_default=True,
              help="Agents with peer-to-peer on ([p2p] enabled, listening on the node's "
                   "address, port 6881): a job's nodes warm from each other.")
@click.option("--node-cpu", type=float, default=None,
              help="Each node's CPU quota in cores (its cgroup's), the same at every lab "
                   "size. Default: no quota (each node's CPU is still counted).")
@click.option("--origin-cpu", type=float, default=None,
              help="Each origin's CPU quota in cores (the NameNode, each DataNode, the "
                   "registry, the index: a cgroup each). Default: no quota (counted).")
@click.option("--timeout", type=float, default=120.0, show_default=True,
              help="Seconds HDFS and the agents may take to come up.")
def up(state_dir, nodes, datanodes, node_link, datanode_link, origins, origin_link, store,
       name, hdfs_base_port, block_size, engines, p2p, node_cpu, origin_cpu, timeout) -> None:
    """Build the lab and start its HDFS and agents (a failure takes down what was made)."""
    try:
        spec = LabSpec(nodes=nodes, datanodes=datanodes, node_link=parse_link(node_link),
                       datanode_link=parse_link(datanode_link), origins=origins,
                       origin_link=parse_link(origin_link), name=name,
                       state_dir=state_dir or default_state_dir(),
                       hdfs_base_port=hdfs_base_port, block_size=parse_size(block_size),
                       store=store, engines=engines, p2p=p2p, node_cpu=node_cpu,
                       origin_cpu=origin_cpu)
        lab = Lab(spec)
        lab.up(timeout_s=timeout)
    except _ERRORS as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(lab.status().format())


@main.command()
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(state_dir, as_json) -> None:
    """Members, caps, bytes through each cap, agents, HDFS. Exit 1 if unhealthy."""
    try:
        lab = Lab.attach(state_dir or default_state_dir())
        if not lab.state.path.is_file():
            click.echo(f"the lab in {lab.spec.state_dir} is down")
            sys.exit(1)
        st = lab.status()
    except _ERRORS as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(asdict(st) | {"healthy": st.healthy}, indent=2) if as_json
               else st.format())
    sys.exit(0 if st.healthy else 1)


@main.command()
@state_dir_option
def down(state_dir) -> None:
    """Remove every process, mount, tc qdisc, link, namespace and cgroup the lab made."""
    try:
        lab = Lab.attach(state_dir or default_state_dir())
        click.echo("down" if lab.down() else "was not up")
    except _ERRORS as exc:
        raise click.ClickException(str(exc)) from exc


if __name__ == "__main__":
    main()

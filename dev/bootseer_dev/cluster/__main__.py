"""`python -m bootseer_dev.cluster start|stop|status|env`: the dev cluster from a shell.

stop/status/env read the spec that `start` saved in the state dir, so only `start` takes
cluster options; every command takes --state-dir (or $BOOTSEER_HDFS_STATE).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

import click

from bootseer_dev import log_to_stderr

from .cluster import Cluster, ClusterError
from .jars import JarsError
from .linkcap import LinkCapError
from .paths import default_state_dir
from .spec import ClusterSpec, SpecError
from .units import parse_link, parse_size

_ERRORS = (ClusterError, JarsError, LinkCapError, SpecError, ValueError)

state_dir_option = click.option(
    "--state-dir", type=click.Path(path_type=Path), default=None,
    help="Cluster state (conf, data, logs, PIDs). Default: $BOOTSEER_HDFS_STATE or the "
         "per-user state dir.")


def _attach(state_dir: Path | None) -> Cluster:
    return Cluster.from_state_dir(state_dir or default_state_dir())


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """A local Apache Hadoop 2.7.3 HDFS cluster (NameNode + DataNodes on 127.0.0.1)."""
    log_to_stderr(verbose)


@main.command()
@state_dir_option
@click.option("--datanodes", "-n", type=int, default=1, show_default=True)
@click.option("--block-size", default="128m", show_default=True,
              help="Cluster default dfs.blocksize: bytes or 64k/1m/...; multiple of 512.")
@click.option("--replication", type=int, default=1, show_default=True)
@click.option("--link", default=None,
              help="Per-DataNode egress cap RATE[,DELAY], e.g. 40mbit or 40MB/s,2ms (tc on lo).")
@click.option("--base-port", type=int, default=None,
              help="Move all ports: NameNode rpc=B, http=B+1, DataNode i at B+10+10i (xfer), "
                   "B+8+10i (http), B+11+10i (ipc).")
@click.option("--namenode-port", type=int, default=None, help="NameNode RPC port [9000].")
@click.option("--namenode-http-port", type=int, default=None, help="NameNode HTTP port [9870].")
@click.option("--datanode-port-base", type=int, default=None,
              help="DataNode i xfer port = BASE+10i, http BASE-2+10i, ipc BASE+1+10i [9866].")
@click.option("--timeout", type=float, default=90.0, show_default=True,
              help="Seconds to wait for all DataNodes to be live.")
def start(state_dir, datanodes, block_size, replication, link, base_port, namenode_port,
          namenode_http_port, datanode_port_base, timeout) -> None:
    """Start the cluster (a no-op if it already runs with the same options)."""
    try:
        kwargs = dict(datanodes=datanodes, state_dir=state_dir or default_state_dir(),
                      block_size=parse_size(block_size), replication=replication,
                      link=parse_link(link) if link else None, start_timeout_s=timeout)
        spec = (ClusterSpec.with_base_port(base_port, **kwargs) if base_port
                else ClusterSpec(**kwargs))
        for attr, val in (("namenode_rpc_port", namenode_port),
                          ("namenode_http_port", namenode_http_port),
                          ("datanode_port_base", datanode_port_base)):
            if val is not None:
                setattr(spec, attr, val)
        spec.validate()
        cluster = Cluster(spec)
        started = cluster.start()
    except _ERRORS as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(("started" if started else "already running") + f": {cluster.namenode_rpc_url} "
               f"{cluster.webhdfs_url}")
    click.echo(f"logs: {cluster.log_dir}")
    click.echo(f"client env: eval \"$(python -m bootseer_dev.cluster env --state-dir "
               f"{shlex.quote(str(cluster.state_dir))})\"")


@main.command()
@state_dir_option
def stop(state_dir) -> None:
    """Stop the cluster's processes (by recorded PID) and remove its tc rules."""
    try:
        cluster = _attach(state_dir)
    except ClusterError as exc:
        click.echo(str(exc))
        return
    click.echo("stopped" if cluster.stop() else "was not running")


@main.command()
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(state_dir, as_json) -> None:
    """NameNode up/down, live DataNodes (from JMX), ports, log paths. Exit 1 if unhealthy."""
    try:
        st = _attach(state_dir).status()
    except ClusterError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(asdict(st) | {"healthy": st.healthy}, indent=2) if as_json
               else st.format())
    sys.exit(0 if st.healthy else 1)


@main.command()
@state_dir_option
def env(state_dir) -> None:
    """Print `export K=V` lines for clients (hdfs:// stores, Hadoop's Java tools)."""
    try:
        variables = _attach(state_dir).env()
    except _ERRORS as exc:
        raise click.ClickException(str(exc)) from exc
    for k, v in variables.items():
        click.echo(f"export {k}={shlex.quote(v)}")


if __name__ == "__main__":
    main()

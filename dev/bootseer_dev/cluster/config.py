"""Write the Hadoop configuration (core-site.xml, hdfs-site.xml, log4j.properties).

Two conf dirs per cluster: `conf/` for the servers (INFO logging into the log files) and
`client-conf/` for clients (hdfs:// stores, FsShell) (same site files, WARN logging, so a client's
read does not spray Hadoop INFO lines on stderr). Clients need the site files because
dfs.blocksize and dfs.replication are applied by the *client* when it creates a file.
"""

from __future__ import annotations

import os
from pathlib import Path
from xml.sax.saxutils import escape

from .spec import ClusterSpec

__all__ = ["write_configs", "core_site", "hdfs_site", "datanode_overrides"]

_LOG4J = """\
log4j.rootLogger={level},console
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.target=System.err
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d{{ISO8601}} %p %c{{2}}: %m%n
log4j.logger.org.apache.hadoop.util.NativeCodeLoader=ERROR
"""


def core_site(spec: ClusterSpec) -> dict[str, str]:
    return {
        "fs.defaultFS": f"hdfs://{spec.namenode_host}:{spec.namenode_rpc_port}",
        "hadoop.tmp.dir": str(spec.state_dir / "tmp"),
    }


def hdfs_site(spec: ClusterSpec) -> dict[str, str]:
    return {
        "dfs.replication": str(spec.replication),
        "dfs.namenode.replication.min": "1",
        "dfs.blocksize": str(spec.block_size),
        # Allow tiny test blocks; the block size must stay a multiple of the checksum chunk.
        "dfs.namenode.fs-limits.min-block-size": "0",
        "dfs.bytes-per-checksum": "512",
        "dfs.namenode.name.dir": (spec.state_dir / "name").as_uri(),
        "dfs.namenode.rpc-address": f"{spec.namenode_host}:{spec.namenode_rpc_port}",
        "dfs.namenode.http-address": f"{spec.namenode_host}:{spec.namenode_http_port}",
        # Never started, but keep it off the default 0.0.0.0:50090 in case something does.
        "dfs.namenode.secondary.http-address": "127.0.0.1:0",
        "dfs.permissions.enabled": "false",
        "dfs.namenode.safemode.extension": "0",
        "dfs.heartbeat.interval": "1",
        "dfs.namenode.heartbeat.recheck-interval": str(spec.heartbeat_recheck_ms),
        # Stale must come before dead (2*recheck + 10*heartbeat), or the NameNode warns.
        "dfs.namenode.stale.datanode.interval": str(max(3000, spec.heartbeat_recheck_ms)),
        "dfs.namenode.datanode.registration.ip-hostname-check": "false",
        "dfs.client.use.datanode.hostname": "false",
        "dfs.webhdfs.enabled": "true",
        "dfs.datanode.du.reserved": "0",
    }


def datanode_overrides(spec: ClusterSpec, i: int) -> dict[str, str]:
    """Per-DataNode settings, passed as -D options so all DataNodes share one conf dir."""
    p, host = spec.datanode_ports(i), spec.datanode_host(i)
    return {
        "dfs.datanode.data.dir": (spec.state_dir / "data" / f"dn{i}").as_uri(),
        "dfs.datanode.address": f"{host}:{p.xfer}",
        "dfs.datanode.http.address": f"{host}:{p.http}",
        "dfs.datanode.ipc.address": f"{host}:{p.ipc}",
        # WebHDFS redirects to the DataNode's *hostname*; the machine name may resolve to
        # an address the DataNode is not listening on.
        "dfs.datanode.hostname": host,
    }


def _xml(props: dict[str, str]) -> str:
    body = "".join(f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n"
                   for k, v in props.items())
    return f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n'


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_configs(spec: ClusterSpec) -> tuple[Path, Path]:
    """Write conf/ and client-conf/ under the state dir; return (server, client) conf dirs."""
    server, client = spec.state_dir / "conf", spec.state_dir / "client-conf"
    for conf, level in ((server, "INFO"), (client, "WARN")):
        _write(conf / "core-site.xml", _xml(core_site(spec)))
        _write(conf / "hdfs-site.xml", _xml(hdfs_site(spec)))
        _write(conf / "log4j.properties", _LOG4J.format(level=level))
        # An empty metrics2 config: no sinks, and no "Cannot locate configuration" warning.
        _write(conf / "hadoop-metrics2.properties", "")
    return server, client

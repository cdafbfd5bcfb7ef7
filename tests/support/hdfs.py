"""What the test HDFS cluster itself saw: the NameNode's audit log."""

from __future__ import annotations


def audited_users(cluster, command: str, path: str) -> set[str]:
    """Who the NameNode's audit log says ran ``command`` on ``path`` (an HDFS path): the
    user a client acted as, seen from the server."""
    users = set()
    for line in cluster.log_path("namenode").read_text(errors="replace").splitlines():
        fields = dict(f.split("=", 1) for f in line.split("\t") if "=" in f)
        if fields.get("cmd") == command and fields.get("src") == path:
            users.add(fields["ugi"].split(" ")[0])
    return users

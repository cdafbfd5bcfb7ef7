"""A multi-node lab on one machine: N emulated GPU nodes and an HDFS dev cluster.

Bootseer exists for jobs that restart on many nodes at once against one store; this lab
puts that on one machine. Each node is a network namespace with a capped veth to a lab
switch and a node agent of its own; each HDFS server (NameNode, DataNodes) is a namespace
too, every DataNode with a cap of its own, and so are the baselines' origins (a
docker-registry and a wheel index), each capped. All addresses are in 198.18.0.0/15 and nothing
routes out of it. See README.md beside this file.

    from bootseer_dev.fleet import Lab, LabSpec
    lab = Lab(LabSpec(nodes=4, datanodes=2, state_dir=tmp))
    lab.up()
    lab.run(0, ["python", "-c", "..."])   # in node 0's namespace, with the store's env
    lab.link_bytes("node-0")              # (sent, received) through its caps
    lab.down()

Command line: python -m bootseer_dev.fleet up|status|down.
"""

from .lab import Lab, LabError, LabStatus, MemberStatus
from .nodes import AgentStartError, NodeFiles
from .origins import OriginStartError, index_dir
from .spec import LAB_NET, LabSpec, LabSpecError, Member

__all__ = ["LAB_NET", "AgentStartError", "Lab", "LabError", "LabSpec", "LabSpecError",
           "LabStatus", "Member", "MemberStatus", "NodeFiles", "OriginStartError",
           "index_dir"]

"""A real, local Apache Hadoop 2.7.3 HDFS cluster for tests and benchmarks.

HDFS is Bootseer's store at scale, and checkpoint striping only means something against a
real NameNode and real DataNodes. This package brings one up on 127.0.0.1 from jars cached
out of the pyspark 2.4.8 sdist (no Hadoop on the registries), and can cap each
DataNode's egress with tc so loopback behaves like a network.

    from bootseer_dev.cluster import Cluster, ClusterSpec, parse_link
    cluster = Cluster(ClusterSpec.with_base_port(19000, datanodes=2, state_dir=tmp,
                                                 block_size=1 << 20, link=parse_link("20MB/s")))
    cluster.start()
    os.environ.update(cluster.env())      # HADOOP_CONF_DIR for hdfs:// stores
    ...
    cluster.stop()

Command line: python -m bootseer_dev.cluster start|stop|status|env.
"""

from .cluster import BlockLocation, Cluster, ClusterError, ClusterStatus, DataNodeStatus
from .jars import JarsError
from .linkcap import LinkCapError, tc_available
from .paths import cache_dir, default_state_dir, java_home
from .spec import ClusterSpec, DataNodePorts, SpecError
from .units import LinkCap, parse_link, parse_rate, parse_size

__all__ = [
    "BlockLocation", "Cluster", "ClusterError", "ClusterSpec", "ClusterStatus", "DataNodePorts",
    "DataNodeStatus", "JarsError", "LinkCap", "LinkCapError", "SpecError",
    "cache_dir", "default_state_dir", "java_home", "parse_link", "parse_rate", "parse_size",
    "tc_available",
]

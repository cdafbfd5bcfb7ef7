"""The fleet lab's spec: where each origin's and node's processes are counted, and what
survives a round trip through the state dir's JSON (``down`` and ``status`` read it)."""

from __future__ import annotations

import pytest

from bootseer_dev.cluster import ClusterSpec
from bootseer_dev.fleet import Lab, LabSpec
from bootseer_dev.fleet.spec import LabSpecError


def test_every_origin_has_a_cgroup_of_its_own_below_the_labs(tmp_path) -> None:
    spec = LabSpec(nodes=2, datanodes=2, name="t", state_dir=tmp_path, origin_cpu=0.5)
    assert spec.origin_roles() == ["namenode", "datanode-0", "datanode-1", "registry",
                                   "index"]
    groups = [spec.origin_cgroup(r) for r in spec.origin_roles()] + [
        spec.node_cgroup(i) for i in range(spec.nodes)]
    assert len(set(groups)) == len(groups)
    assert all(g.startswith(spec.cgroup + "/") for g in groups)  # `down` removes the lab's
    assert LabSpec(datanodes=0, origins=False, state_dir=tmp_path).origin_roles() == []


def test_the_dev_cluster_starts_each_hdfs_server_in_its_origin_group(tmp_path) -> None:
    spec = LabSpec(nodes=1, datanodes=2, name="t", state_dir=tmp_path)
    cluster = Lab(spec).cluster
    assert cluster is not None
    assert cluster.spec.cgroups == {"namenode": "bsl-t/namenode",
                                    "datanode-0": "bsl-t/datanode-0",
                                    "datanode-1": "bsl-t/datanode-1"}
    again = ClusterSpec.from_json(cluster.spec.to_json())
    assert again.cgroups == cluster.spec.cgroups and again.same_cluster_as(cluster.spec)


def test_the_quotas_survive_the_state_dirs_json(tmp_path) -> None:
    spec = LabSpec(nodes=3, state_dir=tmp_path, node_cpu=0.1, origin_cpu=0.4)
    again = LabSpec.from_json(spec.to_json())
    assert (again.node_cpu, again.origin_cpu) == (0.1, 0.4)


@pytest.mark.parametrize("field", ["node_cpu", "origin_cpu"])
@pytest.mark.parametrize("cores", [0.0, -1.0, 2000.0])
def test_a_quota_out_of_range_is_refused(tmp_path, field, cores) -> None:
    with pytest.raises(LabSpecError, match=field.replace("_", "-")):
        LabSpec(state_dir=tmp_path, **{field: cores})

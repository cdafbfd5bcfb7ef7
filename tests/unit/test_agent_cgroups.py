"""agent.servers_cgroup's checks, before any cgroup is touched (the move itself:
tests/system/test_agent_mounts.py::test_servers_outlive_the_agents_cgroup_killed_whole)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootseer.agents import cgroups
from bootseer.errors import BootseerError


@pytest.mark.parametrize("group", ["", "/", "../escape", "/a/../../b", "a//b", "-x", "a b"])
def test_a_group_that_is_no_plain_cgroup_path_is_refused(group: str) -> None:
    with pytest.raises(BootseerError, match="servers_cgroup"):
        cgroups.make(group, Path("/sys/fs/cgroup"))


def test_a_root_without_hierarchies_says_which_setting(tmp_path: Path) -> None:
    assert cgroups.hierarchies(tmp_path) == []
    with pytest.raises(BootseerError, match="agent.cgroup_root"):
        cgroups.enter("/bootseer-servers", tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing made

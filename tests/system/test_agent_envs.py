"""A container's environments from the node agent: snapshots it names are mounted in its
root over the image, from one tree per node that every container shares; each writes into
its own layer, the tree never changes, and nothing is extracted.

Real processes: the agent, runc, overlayfs, the image's FUSE server (and, warmed, the
image's metadata image).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from support.containers import run_in, stop_agents
from support.images import bootseer

from bootseer.agents.client import AgentClient, AgentError
from bootseer.agents.mountapi import MountRequest
from bootseer.mounts import overlay_at, overlays_reading
from bootseer.nodecache import CacheFull, NodeCache
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.run import capture_command
from bootseer.snapshot.tree import EnvTree
from bootseer.store import BlobStore, open_store
from bootseer_dev.engines import start_agent


@pytest.fixture
def node(dirs, python_layout, tmp_path: Path):
    """The python image in the store, a snapshot "answers" of a directory below /tmp (a
    new one: the image has /tmp only), and an agent; yields (socket, target, restart)."""
    bootseer("image", "convert", str(python_layout), "--name", "py", store=dirs["store"],
             cache=dirs["cache"])
    target = tmp_path / "env"
    script = (f"mkdir -p {target}/sub && echo 42 > {target}/sub/answer && "
              f"ln -s sub/answer {target}/link")
    blobs = BlobStore(open_store(f"file://{dirs['store']}"))
    assert capture_command(blobs, "answers", ["sh", "-c", script], [target],
                           environ=os.environ, options=SnapshotOptions()).published
    sock = tmp_path / "run" / "agent.sock"
    env = {"BOOTSEER_STORE": f"file://{dirs['store']}",
           "BOOTSEER_CACHE_DIR": str(dirs["agent-cache"])}
    procs = [start_agent(sock, env)]
    try:
        yield sock, target, procs, lambda: procs.append(start_agent(sock, env))
    finally:
        stop_agents(procs, dirs["agent-cache"])


def _tree(dirs) -> EnvTree:
    return EnvTree(NodeCache(dirs["agent-cache"] / "snapshots", 1 << 30), "answers")


def test_two_containers_share_one_tree_and_write_only_into_their_own_roots(node,
                                                                         dirs) -> None:
    sock, target, _, _ = node
    with AgentClient(sock) as client:
        one = client.mount(MountRequest("e1", "py", record="never", envs=("answers",)))
        two = client.mount(MountRequest("e2", "py", record="never", envs=("answers",)))
        first = run_in(one, f"cat {target}/link; echo 1 > {target}/sub/answer; "
                            f"cat {target}/sub/answer; echo $BOOTSEER_ENVS_MOUNTED")
        assert (first.returncode, first.stdout) == (0, "42\n1\nanswers\n"), first.stderr
        second = run_in(two, f"cat {target}/sub/answer; ls /")
        assert second.returncode == 0 and second.stdout.startswith("42\n"), second.stderr
        assert "usr" in second.stdout.split()  # the image is there, under the snapshot
        tree = _tree(dirs).find()
        assert tree is not None
        assert (tree / target.relative_to("/") / "sub" / "answer").read_text() == "42\n"
        for mount in (one, two):  # both roots read the one tree
            assert str(tree) in overlay_at(Path(mount.rootfs)).lowers[0]
        assert overlays_reading(tree.parent)
        client.release("e1")
        client.release("e2")
    assert not overlays_reading(tree.parent)  # released: the cache may evict it again


def test_a_warmed_image_and_environment_mount_nothing_but_directories(node, dirs) -> None:
    """``warm`` unpacked the snapshot and wrote the image's metadata image: the root is an
    overlay over both, and the start reads nothing from the store for the snapshot."""
    sock, target, _, _ = node
    warmed = json.loads(bootseer("warm", "--json", "--image", "py", "--env", "answers",
                                 store=dirs["store"], cache=dirs["cache"],
                                 env={"BOOTSEER_AGENT_SOCKET": str(sock)}).stdout)
    assert warmed["via"] == "agent" and warmed["envs"][0]["tree"] is True
    (dirs["store"] / "refs" / "env").rename(dirs["store"] / "refs" / "env-gone")
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("e3", "py", record="never", envs=("answers",)))
        assert run_in(mount, f"cat {target}/sub/answer").stdout == "42\n"
        client.release("e3")


def test_the_tree_outlives_an_agent_restart_and_is_not_evicted_under_a_container(
        node, dirs) -> None:
    sock, target, procs, restart = node
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("e4", "py", record="never", envs=("answers",)))
    procs[-1].send_signal(signal.SIGKILL)
    procs[-1].wait()
    restart()
    tree = _tree(dirs)
    small = NodeCache(dirs["agent-cache"] / "snapshots", 1, in_use=overlays_reading)
    with pytest.raises(CacheFull):  # room only by evicting the tree the container reads
        small.put("ab" * 32, b"x")
    assert tree.find() is not None
    assert run_in(mount, f"cat {target}/sub/answer").stdout == "42\n"
    with AgentClient(sock) as client:
        (listed,) = client.mounts()
        assert listed["id"] == "e4"
        client.release("e4")


def test_a_snapshot_the_store_does_not_have_fails_the_start_and_leaves_nothing(
        node, dirs) -> None:
    sock, _, _, _ = node
    with AgentClient(sock) as client:
        with pytest.raises(AgentError, match="no snapshot missing"):
            client.mount(MountRequest("e5", "py", record="never", envs=("missing",)))
        assert client.mounts() == []
    assert not list((dirs["agent-cache"] / "containers").iterdir())


def test_an_image_whose_path_to_a_target_is_a_symlink_gets_no_environment(
        tmp_path: Path) -> None:
    """The image is the container's: where a directory above the snapshot's target is a
    symlink in it (out to the host's ``/``), the agent refuses before it looks anything
    up through it or makes anything in the container's layer."""
    from bootseer.agents.envs import layers
    from bootseer.errors import BootseerError
    from bootseer.mounts import overlays_reading
    from bootseer.nodecache import NodeCache

    target = tmp_path / "env"
    blobs = BlobStore(open_store(f"file://{tmp_path / 'store'}"))
    assert capture_command(blobs, "answers", ["sh", "-c", f"mkdir -p {target}"], [target],
                           environ=os.environ, options=SnapshotOptions()).published
    image, upper = tmp_path / "image", tmp_path / "upper"
    image.mkdir()
    upper.mkdir()
    top = target.relative_to("/").parts[0]
    (image / top).symlink_to("/")
    cache = NodeCache(tmp_path / "cache" / "snapshots", 1 << 30, in_use=overlays_reading)
    with pytest.raises(BootseerError, match="not a directory in the image"):
        layers(("answers",), blobs, cache, SnapshotOptions(), image, upper)
    assert list(upper.iterdir()) == []

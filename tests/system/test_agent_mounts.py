"""Containers' lazy roots owned by the node agent: mounted for a container, released when
it stops, surviving an agent restart, and a dead FUSE server seen by the watcher.

Real processes throughout: the agent, its FUSE servers, overlayfs, runc.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from support.containers import run_in, stop_agents
from support.images import bootseer
from support.wait import wait_until

from bootseer.agents import cgroups
from bootseer.agents.client import AgentClient, AgentError
from bootseer.agents.mountapi import ContainerMount, MountRequest
from bootseer.mounts import is_mounted
from bootseer_dev.engines import start_agent


@pytest.fixture
def node(dirs, python_layout, tmp_path: Path):
    """A store with the python image converted, and an agent serving it."""
    bootseer("image", "convert", str(python_layout), "--name", "py", store=dirs["store"],
             cache=dirs["cache"])
    sock = tmp_path / "run" / "agent.sock"
    env = {"BOOTSEER_STORE": f"file://{dirs['store']}",
           "BOOTSEER_CACHE_DIR": str(dirs["agent-cache"]),
           # The operator's grants: containers of every image record, may mount the
           # checkpoints under the test's own ckpt/ directory, and may join job "train".
           "BOOTSEER_IMAGE_RECORD_IMAGES": "*",
           "BOOTSEER_CHECKPOINT_ALLOWED": f"file://{tmp_path}/ckpt/",
           "BOOTSEER_AGENT_JOBS": "train"}
    procs = [start_agent(sock, env)]

    def restart() -> None:
        procs.append(start_agent(sock, env))

    yield sock, procs, restart
    stop_agents(procs, dirs["agent-cache"])


def test_a_container_runs_on_its_mount_and_release_completes_its_start(node) -> None:
    sock, _, _ = node
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("c1", "py", job="train", runtime="test"))
        assert client.mount(MountRequest("c1", "py")) == mount  # asked twice: the same
        assert is_mounted(Path(mount.rootfs)) and mount.recording
        result = run_in(mount, 'python3 -c "print(6 * 7)" && touch "$BOOTSEER_READY_FILE"')
        assert (result.returncode, result.stdout) == (0, "42\n"), result.stderr
        start = client.release("c1", exit_code=0)
        assert not is_mounted(Path(mount.rootfs))
        assert not Path(mount.rootfs).parent.exists()
        assert list(start.phases) == ["created", "image_ready", "ready", "exited"]
        assert (start.job, start.runtime, start.detail["exit_code"]) == ("train", "test", 0)
        report = start.detail["image"]
        assert report["blocks_fetched"] > 0
        assert report["recording"]["hot_blocks"] > 0
        # What the start cost the server: the manifest it loaded (from the store, the
        # node's cache being empty), and the requests python3's start sent it.
        assert report["manifest"]["entries"] > 1000 and not report["manifest"]["cached"]
        assert report["manifest"]["bytes"] > 0 and report["manifest"]["decode_s"] > 0
        requests = report["fuse_requests"]
        assert requests["read"] > 0 and requests["lookup"] > 0 and requests["init"] == 1
        assert requests["total"] == sum(n for k, n in requests.items() if k != "total")
        # python3 looks for files the image does not have: misses are counted apart, and
        # what answering each kind cost the server is part of its CPU since the mount.
        assert requests["lookup_negative"] > 0
        cpu = report["fuse_cpu_s"]
        assert set(cpu) == set(requests) and cpu["read"] > 0
        assert 0 < cpu["total"] <= report["server_cpu_s"]
        with pytest.raises(AgentError, match="no container c1"):
            client.release("c1")
        # The second start of the image prefetches what the first one recorded (this
        # node has every block already: the prefetch finds them local).
        second = client.mount(MountRequest("c2", "py"))
        assert run_in(second, 'python3 -c "print(1)"').returncode == 0
        report = client.release("c2").detail["image"]
        assert report["manifest"]["cached"]  # the first start left it in the node's cache
        prefetch = report["prefetch"]
        assert prefetch["hot_blocks"] > 0 and prefetch["done"]
        assert prefetch["already_local"] == prefetch["hot_blocks"]


def test_a_release_without_waiting_answers_unmounted_and_the_record_follows(node) -> None:
    """What the engines' runtime shim and hook ask: the answer comes once the mounts are
    gone; the server's report (a recording stored) completes the start's record after,
    even if the agent is stopped at once (it waits for the records it owes)."""
    sock, procs, restart = node
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("c3", "py", runtime="test"))
        assert mount.recording
        assert run_in(mount, 'python3 -c "print(6 * 7)"').returncode == 0
        assert client.release("c3", exit_code=0, wait=False) is None
        assert not is_mounted(Path(mount.rootfs))
        with pytest.raises(AgentError, match="no container c3"):
            client.release("c3", wait=False)
    procs[-1].terminate()
    assert procs[-1].wait(60) == 0
    restart()
    with AgentClient(sock) as client:
        (start,) = client.starts()
    assert list(start.phases) == ["created", "image_ready", "exited"]
    assert start.detail["exit_code"] == 0
    assert start.detail["image"]["recording"]["hot_blocks"] > 0
    assert not Path(mount.rootfs).parent.exists()


def test_a_containers_root_is_volatile_since_its_upper_goes_with_the_release(node) -> None:
    """A root's overlay never syncs its upper's file system: at unmount that sync would
    wait for every dirty page there, the node cache's writes of the start included. Its
    upper is removed at release, so no sync could keep anything."""
    sock, _, _ = node
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("c5", "py", record="never"))
        assert run_in(mount, "echo kept > /written && cat /written").stdout == "kept\n"
        with open("/proc/mounts") as mounts:
            (options,) = [line.split()[3].split(",") for line in mounts
                          if line.split()[1] == mount.rootfs]
        # Newer kernels show it as fsync=volatile (6.18 here).
        assert {"volatile", "fsync=volatile"} & set(options), options
        assert {"nosuid", "nodev"} <= set(options)
        client.release("c5")
    assert not Path(mount.rootfs).parent.exists()


def test_bad_mount_requests_are_refused_and_leave_nothing(node, dirs) -> None:
    sock, _, _ = node
    with AgentClient(sock) as client:
        with pytest.raises(AgentError, match="'id' must match"):
            client._call("POST", "/v1/mounts", json_body={"id": "../x", "image": "py"})
        with pytest.raises(AgentError, match="no-such-image"):
            client.mount(MountRequest("c3", "no-such-image"))
        assert client.mounts() == []
    assert list((dirs["agent-cache"] / "containers").iterdir()) == []


def _wait_for_file_then(name: str, code: str) -> str:
    return (f"while [ ! -e /run/bootseer/{name} ]; do sleep 0.05; done\n"
            f"python3 -c \"{code}\" && touch /run/bootseer/{name}.done\n")


# Two pauses: each import reads modules the container has not read yet (through the mount).
TWO_PAUSES = (_wait_for_file_then("go1", "import json, email.parser; print('one')")
              + _wait_for_file_then("go2", "import http.client, decimal; print('two')"))


def _go1(mount: ContainerMount) -> None:
    """Let the container do its first part; return when it has."""
    (Path(mount.signal_dir) / "go1").touch()
    deadline = time.monotonic() + 60
    while not (Path(mount.signal_dir) / "go1.done").exists():
        assert time.monotonic() < deadline, "the container's first part did not end"
        time.sleep(0.05)


def _replaced(client: AgentClient, dead_pid: int) -> dict:
    deadline = time.monotonic() + 20
    while True:
        (listed,) = client.mounts()
        if listed["pid"] != dead_pid and listed["serving"]:
            return listed
        assert not listed["failed"] and time.monotonic() < deadline, listed
        time.sleep(0.1)


def test_a_killed_fuse_server_is_replaced_and_the_container_reads_on(node) -> None:
    sock, _, _ = node
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("c5", "py"))
        results = []
        container = threading.Thread(target=lambda: results.append(run_in(mount, TWO_PAUSES)))
        container.start()
        _go1(mount)
        (listed,) = client.mounts()
        os.kill(listed["pid"], signal.SIGKILL)  # between the container's two reads
        replaced = _replaced(client, listed["pid"])
        assert replaced["server_deaths"] == 1
        (Path(mount.signal_dir) / "go2").touch()
        container.join(120)
        assert results and (results[0].returncode, results[0].stdout) == (0, "one\ntwo\n"), \
            results
        start = client.release("c5", exit_code=0)
    assert start.detail["server_deaths"] == 1 and not start.detail["server_failed"]
    assert start.detail["image"]["blocks_fetched"] > 0  # the replacement's report
    assert not is_mounted(Path(mount.rootfs))


def test_a_killed_agent_leaves_the_container_served_and_the_next_one_adopts_it(
        node, dirs) -> None:
    sock, procs, restart = node
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("c4", "py"))
    results = []
    container = threading.Thread(target=lambda: results.append(run_in(mount, TWO_PAUSES)))
    container.start()
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    _go1(mount)  # the container reads on while no agent runs
    restart()
    blocks_before = sorted((dirs["agent-cache"] / "blocks" / "entries").rglob("*"))
    with AgentClient(sock) as client:
        (listed,) = client.mounts()
        assert (listed["id"], listed["serving"], listed["failed"]) == ("c4", True, False)
        # The new agent took the connection back from the server: it can replace it too.
        os.kill(listed["pid"], signal.SIGKILL)
        _replaced(client, listed["pid"])
        (Path(mount.signal_dir) / "go2").touch()
        container.join(120)
        assert results and (results[0].returncode, results[0].stdout) == (0, "one\ntwo\n"), \
            results
        start = client.release("c4", exit_code=0)
    assert "exited" in start.phases and start.detail["server_deaths"] == 1
    blocks_after = sorted((dirs["agent-cache"] / "blocks" / "entries").rglob("*"))
    assert set(blocks_before) <= set(blocks_after)  # the cache survived the kill
    assert not list((dirs["agent-cache"] / "blocks" / "tmp").iterdir())


def test_an_upgraded_agent_adopts_the_mounts_an_earlier_release_left(node, tmp_path) -> None:
    """An agent of the release before served connections wrote ``state.json`` as pids and
    fds without specs; the agent that replaces it (an upgrade while containers run) still
    adopts those mounts: it replaces their servers and releases them."""
    sock, procs, restart = node
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.bin").write_bytes(os.urandom(1 << 20))
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("c8", "py",
                                          checkpoints={"step": f"file://{tmp_path}/ckpt"}))
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    state = Path(mount.rootfs).parent / "state.json"
    body = json.loads(state.read_text())
    image = body["image"]
    state.write_text(json.dumps({  # what 7daf6da's agents/mounts.py _Mounted.to_json wrote
        "request": body["request"], "mount": body["mount"], "created": body["created"],
        "pid": image["pid"], "server_fd": image["fd"], "server_deaths": 0, "failed": False,
        "checkpoints": {name: {"pid": c["pid"], "fd": c["fd"], "deaths": 0, "failed": False}
                        for name, c in body["checkpoints"].items()}}))
    restart()
    with AgentClient(sock) as client:
        (listed,) = client.mounts()
        assert (listed["id"], listed["serving"], listed["failed"]) == ("c8", True, False)
        assert listed["checkpoints"]["step"]["serving"]
        os.kill(listed["pid"], signal.SIGKILL)  # it holds the fd back: it can replace it
        _replaced(client, listed["pid"])
        start = client.release("c8", exit_code=0)
    assert start.detail["server_deaths"] == 1
    assert not is_mounted(Path(mount.rootfs)) and not Path(mount.checkpoints_dir).exists()


def test_the_watcher_claims_starting_while_prefetching_and_demand_while_reads_fetch(
        tmp_path: Path) -> None:
    """The agent's warm work waits on these claims (bootseer.agents.priority); the watcher derives
    them from each mount server's statistics file."""
    from bootseer.agents.mounts import MountManager, _Container
    from bootseer.agents.priority import Priority
    from bootseer.agents.served import Served
    from bootseer.config import Config
    from bootseer.prefetch.serverspec import ImageServerSpec, stats_path

    manager = MountManager(Config(cache_dir=tmp_path), lambda start: start)
    mount = ContainerMount("c6", "py", "sha256:x", str(tmp_path / "rootfs"), "/nowhere")
    spec = ImageServerSpec.of(manager.config, "py", manager.root / "c6" / "lower")
    image = Served(spec, tmp_path / "server.log", os.getpid(), -1,
                   failed=True)  # failed: the watcher does not replace it
    manager._mounts["c6"] = _Container(MountRequest("c6", "py"), mount, 0.0, image)
    stats = stats_path(tmp_path, manager.root / "c6" / "lower")
    stats.parent.mkdir(parents=True, exist_ok=True)

    def look(fetch_requests: int, prefetch_done: bool | None) -> dict[Priority, int]:
        prefetch = None if prefetch_done is None else {"done": prefetch_done}
        stats.write_text(json.dumps({"fetch_requests": fetch_requests, "prefetch": prefetch}))
        manager._look()
        return manager.gate.busy()

    assert look(0, False) == {Priority.DEMAND: 0, Priority.STARTING: 1, Priority.WARM: 0}
    assert look(3, False)[Priority.DEMAND] == 1  # reads fetched since the last look
    assert look(3, False)[Priority.DEMAND] == 0  # and then did not
    assert look(3, True)[Priority.STARTING] == 0
    assert look(3, None)[Priority.STARTING] == 0  # no hot list: nothing to prefetch
    look(5, False)
    manager._mounts["c6"].image.pid = 2**22 + 1  # the server is gone: its claims go with it
    manager._look()
    assert set(manager.gate.busy().values()) == {0}


def test_checkpoint_mounts_are_the_agents_too_and_come_back_after_a_crash(
        node, tmp_path: Path) -> None:
    """A container's checkpoint directory, mounted by the agent (striped reads), seen at
    /mnt/checkpoints/<name>; its server killed, a new one takes the connection over and the
    running container reads on, the same mount."""
    import hashlib

    sock, _, _ = node
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    data = os.urandom(3 << 20)
    (ckpt / "model.bin").write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    read = "sha256sum /mnt/checkpoints/step/model.bin | cut -c1-64"
    script = ("while [ ! -e /run/bootseer/go1 ]; do sleep 0.05; done\n"
              f"{read} && touch /run/bootseer/go1.done\n"
              "while [ ! -e /run/bootseer/go2 ]; do sleep 0.05; done\n" + read + "\n")
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("c7", "py",
                                          checkpoints={"step": f"file://{ckpt}"}))
        assert mount.checkpoints_dir and mount.checkpoints_target == "/mnt/checkpoints"
        results = []
        container = threading.Thread(target=lambda: results.append(_run_with_checkpoints(
            mount, script)))
        container.start()
        _go1(mount)
        (listed,) = client.mounts()
        os.kill(listed["checkpoints"]["step"]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while (listed := client.mounts()[0])["checkpoints"]["step"]["server_deaths"] == 0 \
                or not listed["checkpoints"]["step"]["serving"]:
            assert time.monotonic() < deadline, listed
            time.sleep(0.1)
        (Path(mount.signal_dir) / "go2").touch()
        container.join(120)
        assert results and results[0].returncode == 0, results
        assert results[0].stdout.split() == [want, want]
        start = client.release("c7")
    assert start.detail["checkpoint_server_deaths"] == 1
    assert not is_mounted(Path(mount.checkpoints_dir))
    assert not Path(mount.checkpoints_dir).exists()


def _run_with_checkpoints(mount: ContainerMount, script: str):
    """``run_in`` with the checkpoint directory bound as the runtime shim binds it."""
    from bootseer.agents.oci import add_checkpoints_mount
    from bootseer.prefetch.container import run_rootfs

    spec: dict = {"mounts": []}
    add_checkpoints_mount(mount)(spec)
    (bind,) = spec["mounts"]
    assert "rslave" in bind["options"]
    return run_rootfs(mount.rootfs, ["sh", "-c", script], env=mount.env, timeout=120,
                      binds={mount.signal_target: Path(mount.signal_dir),
                             bind["destination"]: Path(bind["source"])})


def _spares_of(agent_pid: int) -> set[int]:
    """The agent's spare servers (``python -m bootseer.agents.runserver spare``): its
    children that wait for a mount or serve one."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if int(stat[1]) == agent_pid and b"spare" in cmdline and stat[0] != "Z":
            found.add(int(proc.name))
    return found


def _wait_for_spares(agent_pid: int, count: int, but: set[int] = frozenset()) -> set[int]:
    deadline = time.monotonic() + 60
    while len(spares := _spares_of(agent_pid) - but) < count:
        assert time.monotonic() < deadline, f"the agent has spares {spares}"
        time.sleep(0.1)
    return spares


def test_servers_are_spares_started_ahead_and_a_restarted_agent_takes_them_over(
        node, tmp_path: Path) -> None:
    """The agent keeps two spare servers (agent.spare_servers): a mount with a checkpoint
    is served by both, the pool starts two more, and the spares turned servers keep their
    connections where a restarted agent finds them (it replaces a killed one)."""
    sock, procs, restart = node
    spares = _wait_for_spares(procs[0].pid, 2)
    deadline = time.monotonic() + 60
    with AgentClient(sock) as client:  # warm: each told the agent it is ready
        while (health := client.health())["spares"] != {"ready": 2, "size": 2} or \
                not health["store_connected"]:  # and the agent's own store connection made
            assert time.monotonic() < deadline, f"spares never warm: {health}"
            time.sleep(0.1)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "w.bin").write_bytes(b"w" * 5000)
    with AgentClient(sock) as client:
        mount = client.mount(MountRequest("c9", "py", checkpoints={
            "ck": f"file://{tmp_path}/ckpt"}))
        (listed,) = client.mounts()
    servers = {listed["pid"], listed["checkpoints"]["ck"]["pid"]}
    assert servers == spares
    assert len(_wait_for_spares(procs[0].pid, 2, but=servers)) == 2  # the pool refilled
    result = _run_with_checkpoints(mount, "wc -c < /mnt/checkpoints/ck/w.bin")
    assert (result.returncode, result.stdout.strip()) == (0, "5000"), result.stderr
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    restart()
    with AgentClient(sock) as client:
        (listed,) = client.mounts()
        assert listed["serving"] and listed["pid"] in servers
        os.kill(listed["pid"], signal.SIGKILL)  # replaceable: its connection was taken back
        _replaced(client, listed["pid"])
        assert run_in(mount, 'python3 -c "print(6 * 7)"').stdout == "42\n"
        client.release("c9")


def test_servers_outlive_the_agents_cgroup_killed_whole(dirs, python_layout,
                                                        tmp_path: Path) -> None:
    """As a DaemonSet's agent container ends (its runtime kills every process of the
    container's cgroup): with ``agent.servers_cgroup``, the mount's servers (spares
    started ahead included) are elsewhere, the container's root is served on, and the
    next agent adopts it."""
    bootseer("image", "convert", str(python_layout), "--name", "py", store=dirs["store"],
             cache=dirs["cache"])
    root, tag = Path("/sys/fs/cgroup"), f"bootseer-test-{os.getpid()}"
    pod, servers = f"/{tag}-pod", f"/{tag}-servers"
    sock = tmp_path / "run" / "agent.sock"
    env = {"BOOTSEER_STORE": f"file://{dirs['store']}",
           "BOOTSEER_CACHE_DIR": str(dirs["agent-cache"]),
           "BOOTSEER_AGENT_SERVERS_CGROUP": servers, "BOOTSEER_AGENT_CGROUP_ROOT": str(root)}
    pod_dirs = cgroups.make(pod, root)
    into_pod = ["sh", "-c", " && ".join(f"echo $$ > {d}/cgroup.procs" for d in pod_dirs)
                + ' && exec "$@"', "sh"]
    procs = [start_agent(sock, env, prefix=into_pod)]
    try:
        with AgentClient(sock) as client:
            mount = client.mount(MountRequest("c1", "py"))
            (listed,) = client.mounts()
        groups = Path(f"/proc/{listed['pid']}/cgroup").read_text().splitlines()
        assert all(line.endswith(f":{servers}") for line in groups), groups
        in_pod = {int(pid) for d in pod_dirs for pid in (d / "cgroup.procs").read_text().split()}
        assert procs[0].pid in in_pod and listed["pid"] not in in_pod
        for pid in in_pod:  # runc kill --all, as the container ends
            os.kill(pid, signal.SIGKILL)
        procs[0].wait(30)
        result = run_in(mount, 'python3 -c "import json; print(6 * 7)"')
        assert (result.returncode, result.stdout) == (0, "42\n"), result.stderr
        procs.append(start_agent(sock, env))
        with AgentClient(sock) as client:
            (adopted,) = client.mounts()
            assert (adopted["pid"], adopted["serving"]) == (listed["pid"], True)
            client.release("c1")
    finally:
        stop_agents(procs, dirs["agent-cache"])
        for group in (pod, servers):
            for path in cgroups.make(group, root):
                wait_until(lambda p=path: not (p / "cgroup.procs").read_text().strip(), 30)
                path.rmdir()

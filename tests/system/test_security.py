"""Multi-tenant safety: each attack of docs/SECURITY.md, tried as an attacker would.

Real components throughout: the node agent (root) with its operator's policy, runc through
``bootseer-runtime``, dockerd and podman with ``bootseer-hook``, the agent's FUSE servers
and overlays. Each attacker brings only what they control: a container's annotations, an
image's ``ENV``, files written into the signal directory or the container's root, bodies
sent to the agent's socket as a member of its group (``nobody`` in ``nogroup``), bytes
written into the store. Each attack must fail with a clear error and change nothing
outside the attacker's own container.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from support.engines import HOOK, RUNTIME, run_tool, write_bundle
from support.images import bootseer
from support.users import as_nobody
from support.wait import wait_until

from bootseer.agents.client import AgentClient, AgentError
from bootseer.agents.mountapi import ContainerMount, MountRequest, mount_key
from bootseer.agents.warm import WarmRequest
from bootseer.mounts import is_mounted, unmount
from bootseer.p2p import Peer
from bootseer_dev.engines import start_agent


class Node:
    """An agent with the operator's policy: checkpoints only under ``allowed/``, recording
    only for "py", the socket's group ``nogroup``. Its cache and ``allowed/`` lie in a
    directory everyone may traverse (0755), as ``/var/cache`` is, so that what keeps
    ``nobody`` out is Bootseer's own modes. It listens on ``lazy["sock"]`` (the engines'
    path) unless ``private_socket``: then in that directory, reachable by ``nobody``."""

    def __init__(self, lazy: dict[str, Path], *, private_socket: bool = False,
                 **env: str) -> None:
        import tempfile

        self.base = Path(tempfile.mkdtemp(prefix="bootseer-security-"))
        self.base.chmod(0o755)
        self.lazy, self.cache = lazy, self.base / "node"
        self.allowed = self.base / "allowed"
        self.allowed.mkdir()
        self.allowed.chmod(0o755)
        self.sock = self.base / "run" / "agent.sock" if private_socket else lazy["sock"]
        self.sock.parent.mkdir(parents=True, exist_ok=True)
        self.sock.parent.chmod(0o755)
        self.proc = start_agent(self.sock, {
            "BOOTSEER_STORE": f"file://{lazy['store']}", "BOOTSEER_CACHE_DIR": str(self.cache),
            "BOOTSEER_AGENT_GROUP": "nogroup",
            "BOOTSEER_CHECKPOINT_ALLOWED": f"file://{self.allowed}/",
            "BOOTSEER_IMAGE_RECORD_IMAGES": "py", **env})
        self.client = AgentClient(self.sock, answer_timeout=120)

    @property
    def containers(self) -> Path:
        return self.cache / "containers"

    def mounts(self) -> list[dict]:
        return self.client.mounts()

    def stop(self) -> None:
        try:
            for mount in self.client.mounts():
                self.client.release(mount["id"])
        finally:
            self.client.__exit__()
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
            for leftover in self.containers.glob("*"):  # a failed test's
                unmount(leftover / "rootfs")
                unmount(leftover / "lower")
            subprocess.run(["rm", "-rf", str(self.base)], check=False)


@pytest.fixture
def node(lazy):
    node = Node(lazy)
    yield node
    node.stop()


def _nothing_left(node: Node) -> None:
    """No mount, no container directory, no record of a refused start. (The runtime shim
    and the hook release without waiting: a directory goes once its server reported.)"""
    assert node.mounts() == []
    wait_until(lambda: not list(node.containers.iterdir()), 60)
    with open("/proc/mounts") as mounts:
        assert str(node.containers) not in mounts.read()


def _nobody_asks(sock: Path, method: str, path: str, body: object | None = None):
    """An agent request made by ``nobody`` (a member of the socket's group)."""
    probe = ("import json, sys, httpx\n"
             "c = httpx.Client(transport=httpx.HTTPTransport(uds=sys.argv[1]), timeout=60)\n"
             "r = c.request(sys.argv[2], 'http://agent' + sys.argv[3],"
             " json=json.loads(sys.argv[4]))\n"
             "print(json.dumps([r.status_code, r.text]))")
    out = as_nobody(sys.executable, "-c", probe, sock, method, path, json.dumps(body),
                     exec_from_shell=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _run_in(mount: ContainerMount, script: str, *, binds: dict[str, Path] | None = None,
            timeout: float = 120):
    """``script`` in runc on the agent's mount, the signal directory bound as the shim
    binds it."""
    from bootseer.prefetch.container import run_rootfs

    env = dict(i.split("=", 1) for i in mount.image_config.get("Env", []))
    return run_rootfs(mount.rootfs, ["sh", "-c", script], env=env | mount.env, timeout=timeout,
                      binds={mount.signal_target: Path(mount.signal_dir), **(binds or {})})


# -- 1. a container reads host files through a checkpoint mount ----------------------------


@pytest.mark.parametrize("where, value", [
    ("annotation", "x=file:///etc"),
    ("annotation", "x=/etc"),
    ("annotation", "x=file:///"),
    ("annotation", "x=file://localhost/etc"),
    ("annotation", "x=file://{allowed}/../../../etc"),
    ("annotation", "x=file://{allowed}/%2e%2e/etc"),
    ("annotation", "x=file://{allowed}/escape"),  # a symlink in the allowed dir to /etc
    ("annotation", "x=hdfs://127.0.0.1:9/etc"),
    ("env", "x=file:///etc"),  # what an image's ENV becomes: the config's process.env
])
def test_a_container_cannot_mount_a_host_path_as_a_checkpoint(node, tmp_path, where,
                                                              value) -> None:
    (node.allowed / "escape").symlink_to("/etc")
    value = value.format(allowed=node.allowed)
    empty = tmp_path / "empty"
    empty.mkdir()
    annotations = {"io.bootseer.image": "py"}
    env = {}
    if where == "annotation":
        annotations["io.bootseer.checkpoints"] = value
    else:
        env["BOOTSEER_CHECKPOINTS"] = value
    bundle = write_bundle(tmp_path / "bundle", empty, ["cat", "/mnt/checkpoints/x/shadow"], env,
                     annotations)
    before = (bundle / "config.json").read_bytes()
    run = run_tool(RUNTIME, "--root", tmp_path / "state", "run", "--bundle", bundle, "evil",
               check=False, env={"BOOTSEER_AGENT_SOCKET": str(node.sock)})
    assert run.returncode == 1 and "root:" not in run.stdout
    assert "checkpoint.allowed" in run.stderr, run.stderr
    assert (bundle / "config.json").read_bytes() == before
    _nothing_left(node)


def test_an_images_env_cannot_mount_a_host_path_through_docker(node, dockerd) -> None:
    """A real image whose ENV asks for the host's /etc, run by Docker with the shim."""
    from bootseer.prefetch.dockerstub import build_stub, load_into_docker

    stub = build_stub("py", "evil/env:1", {"config": {
        "Env": ["PATH=/usr/bin:/bin", "BOOTSEER_CHECKPOINTS=x=file:///etc"],
        "Cmd": ["cat", "/mnt/checkpoints/x/shadow"]}})
    load_into_docker(stub, dockerd)
    run = run_tool("docker", "-H", dockerd, "run", "--rm", "--runtime", "bootseer", "--network",
               "none", "evil/env:1", check=False)
    assert run.returncode != 0 and "root:" not in run.stdout
    assert "checkpoint.allowed" in run.stderr, run.stderr
    _nothing_left(node)


def test_an_allowed_checkpoint_shows_no_links_out_and_no_wider_modes(node, tmp_path) -> None:
    """Under an allowed prefix, symlinks planted by whoever writes checkpoints lead
    nowhere, and files keep their owner and at most their own read bits."""
    step = node.allowed / "step"
    step.mkdir()
    (step / "model.bin").write_bytes(b"weights" * 1000)
    (step / "model.bin").chmod(0o600)  # root's alone at the source
    (step / "public.bin").write_bytes(b"shared")
    (step / "public.bin").chmod(0o644)
    (step / "shadow").symlink_to("/etc/shadow")
    (step / "etc").symlink_to("/etc")
    mount = node.client.mount(MountRequest("c1", "py", checkpoints={
        "step": f"file://{step}"}))
    script = ("ls /mnt/checkpoints/step; stat -c '%n %a %u' /mnt/checkpoints/step/*.bin;"
              "cat /mnt/checkpoints/step/shadow /mnt/checkpoints/step/etc/shadow;"
              "setpriv --reuid=65534 --regid=65534 --clear-groups "
              "cat /mnt/checkpoints/step/model.bin >/dev/null || echo denied;"
              "setpriv --reuid=65534 --regid=65534 --clear-groups "
              "cat /mnt/checkpoints/step/public.bin; echo")
    result = _run_in(mount, script, binds={"/mnt/checkpoints": Path(mount.checkpoints_dir)})
    assert result.stdout.split("\n")[:2] == ["model.bin", "public.bin"], result
    assert "/mnt/checkpoints/step/model.bin 400 0" in result.stdout
    assert "/mnt/checkpoints/step/public.bin 444 0" in result.stdout
    assert "root:" not in result.stdout and "No such file" in result.stderr
    assert "denied" in result.stdout and "shared" in result.stdout
    node.client.release("c1")


# -- 2. a local user becomes root through a container's root -------------------------------


def test_container_directories_are_roots_alone_and_mounts_are_nosuid(node) -> None:
    mount = node.client.mount(MountRequest("c2", "py"))
    result = _run_in(mount, "cp /usr/bin/id /idsuid && chmod 4755 /idsuid && echo ok")
    assert result.stdout.strip() == "ok", result.stderr
    directory = node.containers / mount.id
    assert node.containers.stat().st_mode & 0o777 == 0o700
    assert directory.stat().st_mode & 0o777 == 0o700
    for path in (Path(mount.rootfs) / "idsuid", directory / "upper" / "idsuid"):
        denied = as_nobody(path, "-u")
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied
    with open("/proc/mounts") as mounts:
        options = {line.split()[1]: line.split()[3].split(",") for line in mounts
                   if line.split()[1].startswith(str(directory))}
    for target in (mount.rootfs, str(directory / "lower")):
        assert {"nosuid", "nodev"} <= set(options[target]), (target, options[target])
    # Even with the directories opened up, the bit does nothing through the root.
    try:
        node.containers.chmod(0o755)
        directory.chmod(0o755)
        assert as_nobody(Path(mount.rootfs) / "idsuid", "-u").stdout.strip() == "65534"
    finally:
        directory.chmod(0o700)
        node.containers.chmod(0o700)
    node.client.release("c2")


# -- 3. a socket-group member reads root-only files -----------------------------------------


def test_a_group_member_cannot_stage_or_read_what_it_cannot_read(lazy) -> None:
    node = Node(lazy, private_socket=True)
    try:
        _group_member_attacks(node)
    finally:
        node.stop()


def _group_member_attacks(node: Node) -> None:
    sock = node.sock
    status, text = _nobody_asks(sock, "POST", "/v1/warm", {"checkpoints": ["file:///etc/shadow"]})
    assert status == 403 and "checkpoint.allowed" in text
    assert not (node.cache / "checkpoints" / "copies" / "entries").exists()
    # Under an allowed prefix: a root-only file is staged root-only, a public one public.
    (node.allowed / "secret.bin").write_bytes(b"s" * 4096)
    (node.allowed / "secret.bin").chmod(0o600)
    (node.allowed / "public.bin").write_bytes(b"p" * 4096)
    for name in ("secret.bin", "public.bin"):
        status, text = _nobody_asks(sock, "POST", "/v1/warm",
                                    {"checkpoints": [f"file://{node.allowed}/{name}"]})
        assert status == 200 and '"complete": true' in text, text
    entries = node.cache / "checkpoints" / "copies" / "entries"
    copies = {p.stat().st_mode & 0o777 for p in entries.rglob("*") if p.is_file()}
    assert copies == {0o400, 0o444}
    reader = ("import sys, bootseer.checkpoint as c\n"
              "try:\n    print(len(c.open(sys.argv[1]).read()))\n"
              "except PermissionError as e:\n    print('denied')")
    for name, want in (("secret.bin", "denied"), ("public.bin", "4096")):
        out = as_nobody(sys.executable, "-c", reader, f"file://{node.allowed}/{name}",
                         env={"BOOTSEER_CACHE_DIR": str(node.cache),
                              "XDG_CONFIG_HOME": "/nonexistent"}, exec_from_shell=False)
        assert out.stdout.strip() == want, (name, out.stderr)
    # The group may warm and read; mounting, releasing and recording are root's.
    for method, path, body in (("POST", "/v1/mounts", {"id": "x", "image": "py"}),
                               ("GET", "/v1/mounts", None), ("DELETE", "/v1/mounts/x", None),
                               ("POST", "/v1/starts", {"id": "x"})):
        status, text = _nobody_asks(sock, method, path, body)
        assert status == 403 and "only root" in text, (method, path, status, text)
    assert _nobody_asks(sock, "GET", "/v1/health")[0] == 200
    _nothing_left(node)


# -- 4. a container hangs or kills the agent through /run/bootseer -------------------------


HOSTILE_SIGNALS = (
    "mkfifo /run/bootseer/phase.env_ready /run/bootseer/fifo && "
    "ln -s /dev/zero /run/bootseer/phase.ready && ln -s /dev/zero /run/bootseer/ready && "
    "ln -s /etc/shadow /run/bootseer/phase.checkpoint_first_byte && "
    "i=0; while [ $i -lt 2000 ]; do : > /run/bootseer/junk.$i; i=$((i+1)); done; echo ok")


def test_hostile_signal_files_neither_block_nor_feed_the_agent(node) -> None:
    """FIFOs, symlinks to /dev/zero and /etc/shadow, thousands of files: more of these
    exits at once than the agent has release threads; the agent stays responsive."""
    mounts = [node.client.mount(MountRequest(f"s{n}", "py")) for n in range(10)]
    for mount in mounts:
        result = _run_in(mount, HOSTILE_SIGNALS)
        assert result.stdout.strip() == "ok", result.stderr
    records: list = []

    def release(mount_id: str) -> None:
        with AgentClient(node.sock, answer_timeout=120) as client:
            records.append(client.release(mount_id))

    threads = [threading.Thread(target=release, args=(m.id,)) for m in mounts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(150)
    assert len(records) == 10, "a release hung on the signal directory"
    for record in records:
        assert set(record.phases) == {"created", "image_ready", "exited"}, record.phases
    fresh = node.client.mount(MountRequest("after", "py"))  # nothing is used up
    assert _run_in(fresh, "python3 -c 'print(1)'").stdout.strip() == "1"
    node.client.release("after")
    _nothing_left(node)


# -- 5. a container releases another container's mount --------------------------------------


def test_a_container_naming_anothers_mount_releases_only_its_own(node, tmp_path) -> None:
    """Through the shim (runc) and through precreate: the annotation io.bootseer.mount a
    container brings names nothing."""
    victim = node.client.mount(MountRequest("victim", "py"))
    assert _run_in(victim, "echo precious > /data.txt && echo ok").stdout.strip() == "ok"
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"BOOTSEER_AGENT_SOCKET": str(node.sock)}
    bundle = write_bundle(tmp_path / "bundle", empty, ["true"], {},
                     {"io.bootseer.image": "py", "io.bootseer.mount": "victim"})
    run = run_tool(RUNTIME, "--root", tmp_path / "state", "run", "--bundle", bundle, "evil",
               env=env)
    assert run.returncode == 0
    precreate = subprocess.run(
        [str(HOOK), "precreate"], capture_output=True, text=True, timeout=60, env={
            **os.environ, **env}, input=json.dumps({"annotations": {
                "io.bootseer.mount": "victim", "io.bootseer.image": ""}, "root": {}}))
    assert json.loads(precreate.stdout)["annotations"] == {"io.bootseer.image": ""}
    (listed,) = node.mounts()
    assert listed["id"] == "victim" and listed["serving"]
    assert (Path(victim.rootfs) / "data.txt").read_text() == "precious\n"
    # A release must show the root the engine ran the container on.
    with pytest.raises(AgentError, match="not releasing another container's mount"):
        node.client.release("victim", rootfs=str(tmp_path / "some-other-root"))
    node.client.release("victim", rootfs=victim.rootfs)
    _nothing_left(node)


def test_the_same_container_id_in_two_namespaces_gets_two_mounts(node, tmp_path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "BOOTSEER_AGENT_SOCKET": str(node.sock)}
    roots = [tmp_path / "ns1", tmp_path / "ns2"]
    try:
        for n, root in enumerate(roots):
            bundle = write_bundle(tmp_path / f"bundle{n}", empty, ["true"], {},
                             {"io.bootseer.image": "py"})
            with open(tmp_path / f"create{n}.log", "w") as log:  # the created container
                created = subprocess.run(  # keeps its stdio: no pipes to wait on
                    [str(RUNTIME), "--root", str(root), "create", "--bundle", str(bundle),
                     "same"], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                    timeout=120)
            assert created.returncode == 0, (tmp_path / f"create{n}.log").read_text()
        keys = {m["id"] for m in node.mounts()}
        assert keys == {mount_key("same", str(root)) for root in roots}
        run_tool(RUNTIME, "--root", roots[0], "delete", "--force", "same", env=env)
        (left,) = node.mounts()
        assert left["id"] == mount_key("same", str(roots[1])) and left["serving"]
        run_tool(RUNTIME, "--root", roots[1], "delete", "--force", "same", env=env)
        _nothing_left(node)
    finally:
        for root in roots:
            subprocess.run(["runc", "--root", str(root), "delete", "--force", "same"],
                           capture_output=True, check=False)


def test_podman_a_container_naming_anothers_mount_leaves_it_alone(node, podman,
                                                                 tmp_path) -> None:
    stub = tmp_path / "stub.tar"
    bootseer("image", "docker-stub", "py", "--tag", "localhost/bootseer/py:1", "--output",
             str(stub), store=node.lazy["store"], cache=tmp_path / "stub-cache")
    podman("load", "-i", stub)
    victim = node.client.mount(MountRequest("victim", "py"))
    run = podman("run", "--rm", "--annotation", "io.bootseer.image=py", "--annotation",
                 "io.bootseer.mount=victim", "localhost/bootseer/py:1", "true")
    assert run.returncode == 0
    deadline = time.monotonic() + 30  # the evil container's own mount is released
    while [m["id"] for m in node.mounts()] != ["victim"]:
        assert time.monotonic() < deadline, node.mounts()
        time.sleep(0.1)
    assert is_mounted(Path(victim.rootfs))
    node.client.release("victim")


# -- 6. concurrent warms deadlock the agent -------------------------------------------------


def test_warms_during_a_start_never_starve_mounts_or_the_watcher(node, tmp_path) -> None:
    """A container is starting (its server's prefetch not yet done); more warms than the
    agent has threads of any kind wait their turn. Meanwhile mounts, releases and health
    answer; once the start is over, the watcher frees the warms and all complete."""
    from bootseer.agents.agent import MAX_WARMS
    from bootseer.agents.warm import WarmRequest
    from bootseer.prefetch.serverspec import stats_path

    starting = node.client.mount(MountRequest("starting", "py"))
    (listed,) = node.mounts()
    os.kill(listed["pid"], signal.SIGSTOP)  # a slow start: its prefetch stays unfinished
    stats = stats_path(node.cache, node.containers / starting.id / "lower")
    try:
        stats.write_text(json.dumps({"prefetch": {"done": False}, "fetch_requests": 0}))
        deadline = time.monotonic() + 10
        while node.client.health()["busy"]["starting"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        results: list = []

        def warm() -> None:
            with AgentClient(node.sock) as client:
                results.append(client.warm(WarmRequest(image="py")))

        warms = [threading.Thread(target=warm) for _ in range(MAX_WARMS)]
        for thread in warms:
            thread.start()
        time.sleep(1)
        assert results == []  # they wait for the start
        with pytest.raises(AgentError, match="already in progress"):
            node.client.warm(WarmRequest(image="py"))  # one more than admitted
        other = node.client.mount(MountRequest("other", "py"))
        assert _run_in(other, "python3 -c 'print(2)'").stdout.strip() == "2"
        node.client.release("other")
        assert node.client.health()["busy"]["starting"] >= 1
    finally:
        os.kill(listed["pid"], signal.SIGCONT)  # the start ends: its stats say so
    for thread in warms:
        thread.join(120)
    assert len(results) == MAX_WARMS and all(r.complete for r in results)
    node.client.release("starting")


# -- 7. memory without bound -----------------------------------------------------------------


def _vm(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) << 10
    raise AssertionError(field)


def test_a_checkpoint_server_holds_its_cap_with_a_hundred_open_files(tmp_path) -> None:
    """100 handles, each read sequentially (their read-ahead windows grow to 16 MiB): the
    server's peak RSS stays within its cap (checkpoint.mount_memory) over its baseline."""
    ckpt, mnt = tmp_path / "ckpt", tmp_path / "mnt"
    ckpt.mkdir()
    mnt.mkdir()
    for n in range(100):
        with open(ckpt / f"shard-{n:03}.bin", "wb") as f:
            f.truncate(16 << 20)
    cap = 64 << 20
    out = bootseer("ckpt", "mount", f"file://{ckpt}", str(mnt), "--memory", "64m",
                   store=tmp_path / "store", cache=tmp_path / "cache").stderr
    try:
        pid = int(out.rsplit("pid ", 1)[1].split(")")[0])
        baseline = _vm(pid, "VmRSS")
        files = [open(mnt / f"shard-{n:03}.bin", "rb", buffering=0) for n in range(100)]
        try:
            for offset in range(0, 2 << 20, 128 << 10):
                for f in files:
                    assert len(os.pread(f.fileno(), 128 << 10, offset)) == 128 << 10
            peak = _vm(pid, "VmHWM")
        finally:
            for f in files:
                f.close()
        print(f"checkpoint server, 100 open files: baseline {baseline >> 20} MiB, "
              f"peak {peak >> 20} MiB, cap {cap >> 20} MiB")
        assert peak - baseline <= cap + (32 << 20), (baseline >> 20, peak >> 20)
    finally:
        unmount(mnt)


def _published_snapshot(store: Path, shard: bytes, entries: list[dict], key: str) -> None:
    """A snapshot in the store whose shard and manifest are whoever wrote them."""
    import zstandard

    from bootseer.snapshot.manifest import FORMAT_V1
    from bootseer.store import BlobStore, open_store

    blobs = BlobStore(open_store(f"file://{store}"))
    info = blobs.put(shard)
    manifest = {"format": FORMAT_V1, "key": key, "targets": [str(store.parent / "venv")],
                "created": {}, "shards": [{"digest": info.digest, "size": info.size,
                                           "input_bytes": 0}],
                "deleted": [], "entries": entries}
    digest = blobs.put(zstandard.ZstdCompressor().compress(json.dumps(manifest).encode())).digest
    blobs.set_ref(f"env/{key}", digest)


#: Runs a command in a fork of itself (a small process) and prints its exit code and peak
#: RSS: ``wait4`` from the test process would also count the test process's own pages.
_LAUNCH = ("import os, sys\npid = os.fork()\nif pid == 0:\n    os.execvp(sys.argv[1], sys.argv[1:])"
           "\n_, status, usage = os.wait4(pid, 0)\n"
           "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss << 10)")


def _peak_rss_of(argv: list[str], env: dict[str, str]) -> tuple[int, str, int]:
    """Exit status, stderr and peak RSS (bytes) of a command."""
    out = subprocess.run([sys.executable, "-c", _LAUNCH, *argv], capture_output=True,
                         text=True, env={**os.environ, **env}, timeout=300)
    code, peak = out.stdout.split()[-2:]
    return int(code), out.stderr, int(peak)


def test_a_hostile_shard_or_manifest_is_refused_before_it_is_allocated(tmp_path) -> None:
    """A 6 KB shard whose PAX header claims 400 MB; a manifest that expands to 2 GiB; one
    that does not say how large it is. Each restore fails naming the limit, and its peak
    RSS is that of a Python process (the old reader held the whole PAX header)."""
    import zstandard

    store = tmp_path / "store"
    pax = (b"%d path=x\n" % 10).ljust(512, b"\0")
    header = bytearray(b"\0" * 512)
    header[0:9] = b"PaxHeader"
    header[124:136] = b"%011o\0" % (400 << 20)
    header[156:157] = b"x"
    header[257:263] = b"ustar\0"
    header[148:156] = b"%06o\0 " % (sum(header) + 8 * 32)
    # The header's 400 MB follow (zeros: the whole shard compresses to a few KB).
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    shard = compressor.compress(bytes(header) + pax)
    zeros = bytes(1 << 20)
    for _ in range(400):
        shard += compressor.compress(zeros)
    shard += compressor.flush()
    assert len(shard) < 64 << 10
    entries = [{"target": 0, "path": ".", "kind": "dir", "mode": 0o755, "uid": 0, "gid": 0,
                "mtime_ns": 0},
               {"target": 0, "path": "x", "kind": "file", "mode": 0o644, "uid": 0, "gid": 0,
                "mtime_ns": 0, "size": 1, "digest": "sha256:" + "0" * 64, "shard": 0}]
    _published_snapshot(store, shard, entries, "pax")
    env = {"BOOTSEER_STORE": f"file://{store}", "BOOTSEER_CACHE_DIR": str(tmp_path / "c")}
    code, stderr, peak = _peak_rss_of([sys.executable, "-m", "bootseer", "env", "restore",
                                       "pax"], env)
    print(f"restore of a hostile 6 KB shard: peak RSS {peak >> 20} MiB")
    assert code == 1 and "PAX header of 419430400 bytes" in stderr, stderr
    assert peak < 200 << 20
    assert not (tmp_path / "venv").exists()
    from bootseer.store import BlobStore, open_store

    blobs = BlobStore(open_store(f"file://{store}"))
    undeclared = zstandard.ZstdCompressor(write_content_size=False).compress(b"{}")
    blobs.set_ref("env/undeclared", blobs.put(undeclared).digest)
    blobs.set_ref("env/huge", blobs.put(_frame_declaring(2 << 30)).digest)
    for key, message in (("huge", "over the 1073741824 bytes its format allows"),
                         ("undeclared", "does not declare its size")):
        code, stderr, peak = _peak_rss_of([sys.executable, "-m", "bootseer", "env", "show",
                                           key], env)
        assert code == 1 and message in stderr, stderr
        assert peak < 200 << 20


def _frame_declaring(size: int) -> bytes:
    """A zstd frame header that declares ``size`` bytes of content (and holds none)."""
    import struct

    # Magic, frame header descriptor (8-byte content size, single segment), window
    # descriptor omitted by single segment, content size; then an empty last raw block.
    return (struct.pack("<I", 0xFD2FB528) + bytes([0xE0]) + struct.pack("<Q", size)
            + bytes([0x01, 0x00, 0x00]))


def test_the_agent_keeps_no_warmed_blocks_in_memory(node, tmp_path) -> None:
    """A warm of every block of the image: once it ends, the agent holds none of them (it
    used to keep up to 512 MiB of warmed blocks per image, for good)."""
    from bootseer.agents.warm import WarmRequest
    from bootseer.nodecache import NodeCache
    from bootseer.prefetch.lazyimage import load_manifest, resolve_image
    from bootseer.store import BlobStore, open_store

    blobs = BlobStore(open_store(f"file://{node.lazy['store']}"))
    manifest = load_manifest(blobs, resolve_image(blobs, "py"), NodeCache(tmp_path, 1 << 30))
    block_bytes = sum(b.size for b in manifest.blocks)  # what warming decompresses
    pid = node.proc.pid
    before = _vm(pid, "VmRSS")
    summary = node.client.warm(WarmRequest(image="py", all_blocks=True))
    assert summary.complete and summary.image.fetched == len(manifest.blocks)
    after = _vm(pid, "VmRSS")
    print(f"agent RSS {before >> 20} -> {after >> 20} MiB after warming "
          f"{block_bytes >> 20} MiB of blocks ({summary.image.store_bytes >> 20} MiB "
          f"compressed)")
    assert after - before < block_bytes // 2


# -- 8. smaller leaks -------------------------------------------------------------------------


def test_recording_needs_the_operators_grant(lazy, tmp_path) -> None:
    """A container forcing record=always on an image the operator has not granted
    records nothing: no hot list appears in the store."""
    from bootseer.store import BlobStore, open_store

    node = Node(lazy, BOOTSEER_IMAGE_RECORD_IMAGES="other-team/")
    try:
        blobs = BlobStore(open_store(f"file://{lazy['store']}"))
        before = set(blobs.list_refs("hot/"))
        mount = node.client.mount(MountRequest("r1", "py", record="always"))
        assert not mount.recording
        assert _run_in(mount, "python3 -c 'print(3)' && touch $BOOTSEER_READY_FILE"
                       ).stdout.strip() == "3"
        node.client.release("r1")
        assert set(blobs.list_refs("hot/")) == before
    finally:
        node.stop()


def test_server_logs_are_the_agents_and_no_log_goes_to_tmp(node) -> None:
    step = node.allowed / "logs"
    step.mkdir()
    (step / "a.bin").write_bytes(b"a")
    before = {p.name for p in Path("/tmp").glob("bootseer-mount-*")}
    mount = node.client.mount(MountRequest("l1", "py", checkpoints={"a": f"file://{step}"}))
    directory = node.containers / mount.id
    assert (directory / "checkpoint-a.log").is_file()
    assert (directory / "checkpoint-a.log").stat().st_mode & 0o777 == 0o600
    assert {p.name for p in Path("/tmp").glob("bootseer-mount-*")} == before
    node.client.release("l1")


def test_a_mount_that_fails_after_mounting_leaves_nothing(lazy, tmp_path) -> None:
    """The last step of a mount (recording its start) fails: the live FUSE mount, the
    overlay and the directory all go, and the error reaches the caller."""
    from bootseer.agents.mounts import MountManager
    from bootseer.config import Config

    def broken_timeline(start):
        raise OSError("the timeline's disk is full")

    config = Config(store=f"file://{lazy['store']}", cache_dir=tmp_path / "node")
    manager = MountManager(config, broken_timeline)
    with pytest.raises(OSError, match="disk is full"):
        manager.mount(MountRequest("doomed", "py"))
    assert manager.list() == []
    assert list((tmp_path / "node" / "containers").iterdir()) == []
    with open("/proc/mounts") as mounts:
        assert str(tmp_path / "node") not in mounts.read()


# -- 9. peer-to-peer: whom a node serves, and what ---------------------------------------------


def test_p2p_serves_no_private_checkpoint_and_only_root_names_peers(
        lazy, local_peer_key) -> None:
    """An agent with p2p on, its checkpoints shareable under ``allowed/``. The socket's
    group names a job or peers (its own peer, to download a root-only checkpoint from the
    node's seed): refused, nothing staged. Root's warm of the job (with a second member,
    so files are shared) stages both files, but only the one every user may read is
    hashed, published and seeded: the root-only one never leaves the node."""
    from support.peers import LOCAL_PEER_NET, LOCAL_PEERS

    node = Node(lazy, private_socket=True, BOOTSEER_P2P_ENABLED="true",
                BOOTSEER_P2P_LISTEN=f"{LOCAL_PEERS[2]}:0",
                BOOTSEER_P2P_KEY_FILE=str(local_peer_key),
                BOOTSEER_P2P_NETWORKS=LOCAL_PEER_NET, BOOTSEER_P2P_PIECE_GRACE="0.2",
                BOOTSEER_P2P_CHECKPOINTS="file:///tmp/")  # the node's allowed/ is there
    try:
        (node.allowed / "secret.bin").write_bytes(os.urandom(2 << 20))
        (node.allowed / "secret.bin").chmod(0o600)
        (node.allowed / "public.bin").write_bytes(os.urandom(2 << 20))
        urls = [f"file://{node.allowed}/{n}" for n in ("secret.bin", "public.bin")]
        attacker = f"{LOCAL_PEERS[3]}:6881"
        for body in ({"checkpoints": urls[:1], "job": "x", "peers": [attacker]},
                     {"checkpoints": urls[:1], "job": "x"},
                     {"checkpoints": urls[:1], "peers": [attacker]}):
            status, text = _nobody_asks(node.sock, "POST", "/v1/warm", body)
            assert status == 403 and "only root" in text, (body, status, text)
        assert not (node.cache / "checkpoints" / "copies" / "entries").exists()
        assert not (lazy["store"] / "p2p" / "jobs").exists()  # no record, no hash
        assert not (lazy["store"] / "p2p" / "files").exists()
        # Root's warm (the scheduler's), naming a second member.
        summary = node.client.warm(WarmRequest(checkpoints=tuple(urls), job="x",
                                               peers=(Peer.parse(attacker),)))
        assert summary.complete, summary
        torrents = [p for p in (lazy["store"] / "p2p" / "files").rglob("*")
                    if p.is_file() and ".layers" not in str(p)]
        assert len(torrents) == 1, torrents  # the public file's only
        metrics = httpx.Client(transport=httpx.HTTPTransport(uds=str(node.sock))).get(
            "http://agent/metrics").text
        assert "bootseer_p2p_seeding 1.0" in metrics, metrics
    finally:
        node.stop()


def test_a_container_joins_a_granted_job_or_the_one_root_warmed_its_node_for(node) -> None:
    """The operator grants no job here (``agent.jobs`` unset): a container naming one (an
    annotation, as a tenant's pod may) joins none, or, once root warmed the node for a
    job (the scheduler readying it), that job, whatever the container named."""
    def joined(container_id: str, job: str | None) -> str | None:
        node.client.mount(MountRequest(container_id, "py", job=job))
        return node.client.release(container_id).job

    assert joined("t1", "tenant-b-train") is None
    assert node.client.warm(WarmRequest(job="train-7")).complete  # root: the scheduler
    assert joined("t2", "tenant-b-train") == "train-7"
    assert joined("t3", None) == "train-7"
    _nothing_left(node)

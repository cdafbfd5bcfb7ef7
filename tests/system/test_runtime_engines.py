"""bootseer-runtime and bootseer-hook with real engines: runc, dockerd, containerd, podman.

One real lazy image (debootstrap minbase + python3) in one store for the module; each
engine has a workload of its own and starts twice, each time on a fresh node agent (own
cache, own timeline): the first start records the hot list, the second, finding nothing
local, prefetches it. Every start must run from the agent's lazy root; a container that
did not ask for Bootseer must not notice the shim or the hook.

The engines are real and private (own roots, sockets, storage). If one cannot start, its
tests fail in CI (CI=true) with the reason, and are skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.ci import require
from support.engines import HOOK, REPO, RUNTIME, run_tool, write_bundle
from support.images import bootseer

from bootseer.agents.client import AgentClient
from bootseer.agents.mountapi import mount_key
from bootseer.agents.timeline import StartRecord
from bootseer.config import tomllib  # tomli before Python 3.11
from bootseer.store import BlobStore, open_store
from bootseer_dev.engines import start_agent

# The workload's start: python3 runs, then it says it is up (the recording ends there).
SCRIPT = ('python3 -c "import json, sys; print(6 * 7, sys.version_info[0])"; '
          'touch "$BOOTSEER_READY_FILE"')
PLAIN = "echo plain $(cat /etc/debian_version | cut -c1-2); ls /run/bootseer 2>&1; exit 3"


class Nodes:
    """Node agents on the module's socket (the engines know that path), one at a time, each
    with a cache of its own: a start on a new node finds nothing local but the store's
    hot list. Stopping one checks that no container's mount was left behind."""

    def __init__(self, lazy: dict[str, Path], tmp_path: Path) -> None:
        self.lazy, self.tmp_path = lazy, tmp_path
        self.proc: subprocess.Popen | None = None
        self.client: AgentClient | None = None

    def start(self, name: str) -> AgentClient:
        self.stop()
        self.proc = start_agent(self.lazy["sock"], {
            "BOOTSEER_STORE": f"file://{self.lazy['store']}",
            "BOOTSEER_CACHE_DIR": str(self.tmp_path / f"node-{name}"),
            "BOOTSEER_IMAGE_RECORD_IMAGES": "py"})  # the operator lets "py" record
        self.client = AgentClient(self.lazy["sock"])
        return self.client

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            left = self.client.mounts()
            for mount in left:
                self.client.release(mount["id"])
            assert left == [], "containers' mounts were not released"
        finally:
            self.client.__exit__()
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
            self.proc = None


@pytest.fixture
def nodes(lazy, tmp_path: Path):
    nodes = Nodes(lazy, tmp_path)
    yield nodes
    nodes.stop()


def _start(client: AgentClient, timeout: float = 60) -> StartRecord:
    """The node's one start, once it has exited (the poststop hook released it)."""
    deadline = time.monotonic() + timeout
    while True:
        starts = client.starts()
        if starts and "exited" in starts[0].phases:
            (start,) = starts
            return start
        assert time.monotonic() < deadline, f"start not complete: {starts}"
        time.sleep(0.2)


def _check_start(client: AgentClient, lazy: dict[str, Path], workload: str, runtime: str,
                 first: bool) -> None:
    """The start ran on the lazy root and reached every phase; the first one recorded the
    hot list, a later one (on another node) prefetched it."""
    start = _start(client)
    assert list(start.phases) == ["created", "image_ready", "ready", "exited"], start
    assert start.image == "py" and start.workload == workload
    assert start.runtime == runtime
    image = start.detail["image"]
    if first:
        assert image["blocks_fetched"] > 0  # read from the lazy image, on demand
        assert image.get("prefetch") is None  # no hot list yet
        assert image["recording"]["hot_blocks"] > 0 and image["recording"]["recordings"] == 1
        refs = BlobStore(open_store(f"file://{lazy['store']}")).list_refs("hot/")
        assert any(f"/{workload}/" in ref for ref in refs), refs  # hot/<image>/<wl>/<n>
    else:
        assert image["prefetch"]["blocks_fetched"] > 0  # the hot list, from the store
        # and the start found it: put in the page cache once a file was looked up (those
        # reads never reach the server), or by its reads
        assert image["pages_pushed"]["pushes"] + image["prefetch_hits"] > 0, image


# -- runc through bootseer-runtime ------------------------------------------------------


def test_runc_through_the_shim(lazy, nodes, tmp_path: Path) -> None:
    empty = tmp_path / "empty"  # the engine's root: the shim replaces it
    empty.mkdir()
    state = tmp_path / "runc-state"
    env = {"BOOTSEER_AGENT_SOCKET": str(lazy["sock"])}
    for n in range(2):
        client = nodes.start(str(n))
        bundle = write_bundle(tmp_path / f"bundle{n}", empty, ["sh", "-c", SCRIPT], {},
                         {"io.bootseer.image": "py", "io.bootseer.workload": "runc"})
        run = run_tool(RUNTIME, "--root", state, "--log", tmp_path / "log.json", "--log-format",
                   "json", "run", "--bundle", bundle, f"shim-{n}", env=env)
        assert run.stdout.strip() == "42 3"
        config = json.loads((bundle / "config.json").read_text())
        # The mount is the container's id qualified by runc's root (its namespace).
        assert config["annotations"]["io.bootseer.mount"] == mount_key(f"shim-{n}", str(state))
        assert config["root"]["path"] != str(empty)
        _check_start(client, lazy, "runc", "bootseer-runtime", first=n == 0)
    assert list(empty.iterdir()) == []


def test_runc_unlabelled_is_passed_through_untouched(lazy, tmp_path: Path) -> None:
    """No agent at all: a container that did not ask never needs one."""
    results = []
    for runtime in (RUNTIME, "runc"):
        bundle = write_bundle(tmp_path / f"bundle-{Path(runtime).name}", lazy["base"],
                         ["sh", "-c", PLAIN], {"BOOTSEER_WORKLOAD": "x"}, {"other": "1"})
        before = (bundle / "config.json").read_bytes()
        results.append(run_tool(runtime, "--root", tmp_path / "state", "run", "--bundle", bundle,
                            f"plain-{Path(runtime).name}", check=False,
                            env={"BOOTSEER_AGENT_SOCKET": str(tmp_path / "none.sock")}))
        assert (bundle / "config.json").read_bytes() == before
    shim, plain = results
    assert (shim.returncode, shim.stdout) == (plain.returncode, plain.stdout) == (
        3, "plain 12\nls: cannot access '/run/bootseer': No such file or directory\n")


def test_runc_without_an_agent_fails_the_create_clearly(lazy, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    bundle = write_bundle(tmp_path / "bundle", empty, ["true"], {"BOOTSEER_IMAGE": "py"}, {})
    before = (bundle / "config.json").read_bytes()
    log = tmp_path / "log.json"
    run = run_tool(RUNTIME, "--root", tmp_path / "state", "--log", log, "--log-format", "json",
               "create", "--bundle", bundle, "nope", check=False,
               env={"BOOTSEER_AGENT_SOCKET": str(tmp_path / "none.sock")})
    assert run.returncode == 1
    assert "no agent answers" in run.stderr and "bootseer agent" in run.stderr
    assert json.loads(log.read_text().splitlines()[-1])["level"] == "error"
    assert (bundle / "config.json").read_bytes() == before
    assert run_tool("runc", "--root", tmp_path / "state", "list", "-q").stdout.strip() == ""


# -- Docker ---------------------------------------------------------------------------


def test_docker_runs_the_lazy_image_through_a_stub(lazy, dockerd, nodes) -> None:
    out = bootseer("image", "docker-stub", "py", "--tag", "bootseer/py:1", "--docker-host",
                   dockerd, store=lazy["store"], cache=lazy["root"] / "stub-cache")
    image_id = out.stdout.strip()
    inspect = json.loads(run_tool("docker", "-H", dockerd, "image", "inspect", image_id).stdout)
    assert "BOOTSEER_IMAGE=py" in inspect[0]["Config"]["Env"]
    assert inspect[0]["Size"] == 0  # nothing of the image is in Docker
    for n in range(2):
        client = nodes.start(str(n))
        run = run_tool("docker", "-H", dockerd, "run", "--rm", "--runtime", "bootseer",
                   "--network", "none", "-e", "BOOTSEER_WORKLOAD=docker", "bootseer/py:1",
                   "sh", "-c", SCRIPT)
        assert run.stdout.strip() == "42 3"
        _check_start(client, lazy, "docker", "bootseer-runtime", first=n == 0)


def test_docker_unlabelled_runs_as_with_plain_runc(dockerd, tmp_path: Path) -> None:
    results = [run_tool("docker", "-H", dockerd, "run", "--rm", "--runtime", runtime,
                    "--network", "none", "plain:1", "sh", "-c", PLAIN, check=False)
               for runtime in ("bootseer", "runc")]
    shim, plain = results
    assert (shim.returncode, shim.stdout) == (plain.returncode, plain.stdout)
    assert shim.returncode == 3 and shim.stdout.startswith("plain 12\n")


def test_docker_without_an_agent_says_why(lazy, dockerd) -> None:
    bootseer("image", "docker-stub", "py", "--tag", "bootseer/py:1", "--docker-host",
             dockerd, store=lazy["store"], cache=lazy["root"] / "stub-cache")
    run = run_tool("docker", "-H", dockerd, "run", "--rm", "--runtime", "bootseer", "--network",
               "none", "bootseer/py:1", "true", check=False)
    assert run.returncode != 0
    assert "bootseer-runtime" in run.stderr and "no agent answers" in run.stderr, run.stderr


# -- containerd -----------------------------------------------------------------------

CONTAINERD_SNIPPET = REPO / "deploy" / "containerd-bootseer.toml"
#: Where every containerd 1.6 shim puts its socket, whatever the daemon's state directory.
SHIM_SOCKETS = Path("/run/containerd/s")
#: The stub of lazy image "py" (ctr names Docker archives' tags in full) and a plain image.
STUB, PLAIN_IMAGE = "docker.io/bootseer/py:1", "localhost/plain:1"


def containerd_config(root: Path) -> str:
    """containerd's config: private paths, then the text of deploy/containerd-bootseer.toml
    itself (not a copy), its BinaryName pointing at this venv's shim."""
    snippet, found = re.subn(r'(?m)^(\s*BinaryName\s*=\s*)"[^"\n]*"',
                             lambda m: f'{m[1]}"{RUNTIME}"', CONTAINERD_SNIPPET.read_text())
    assert found == 1, f"{CONTAINERD_SNIPPET} sets BinaryName {found} times, not once"
    return (f'version = 2\nroot = "{root}/root"\nstate = "{root}/state"\n'
            f'[grpc]\n  address = "{root}/containerd.sock"\n'
            f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{root}/opt"\n'
            f'[plugins."io.containerd.grpc.v1.cri".cni]\n'
            f'  conf_dir = "{root}/cni"\n  bin_dir = "{root}/cni"\n{snippet}')


@dataclass(frozen=True)
class Containerd:
    """A private containerd, reached with ``ctr``. ``ctr`` does not go through the CRI
    plugin, so :meth:`run` names a runtime as the CRI plugin's table (loaded from the
    module's config) defines it: its type, and its BinaryName as ``--runc-binary``."""

    address: Path
    namespace: str
    runtimes: dict[str, dict]
    runc_root: Path  # the shim runs runc --root runc_root/namespace
    fifo_dir: Path

    @property
    def runc_state(self) -> Path:
        return self.runc_root / self.namespace

    def ctr(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess:
        return run_tool("ctr", "--address", self.address, "--namespace", self.namespace, *args,
                    check=check)

    def run(self, runtime: str, image: str, container_id: str, *cmd: str,
            annotations: dict[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        section = self.runtimes[runtime]
        args: list[str | Path] = ["--runtime", section["runtime_type"],
                                  "--runc-root", self.runc_root]
        if binary := section.get("options", {}).get("BinaryName"):
            args += ["--runc-binary", binary]
        for key, value in (annotations or {}).items():
            args += ["--annotation", f"{key}={value}"]
        return self.ctr("run", "--rm", "--fifo-dir", self.fifo_dir, *args, image,
                        container_id, *cmd, check=check)


def _mounts_under(root: Path) -> list[str]:
    points = (line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    return [point for point in points if point.startswith(f"{root}/")]


@pytest.fixture(scope="module")
def containerd(lazy):
    """containerd (Debian's 1.6) with private root, state, socket, runc root and FIFOs,
    knowing the module's agent socket; its config is built from the deploy snippet (runc
    the default runtime, "bootseer" this venv's shim). The stub of "py" and a plain image
    (the lazy image's own layout) are imported. Teardown removes what setup made: the
    containers, the daemon, mounts left under its root, the root, the namespace's cgroups
    and the shim socket directories if they were new."""
    root = lazy["root"] / "containerd"
    root.mkdir()
    config, log = root / "config.toml", root / "containerd.log"
    config.write_text(containerd_config(root))
    cri = tomllib.loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]
    engine = Containerd(root / "containerd.sock", f"bootseer-test-{os.getpid()}",
                        cri["containerd"]["runtimes"], root / "runc", root / "fifo")
    made = [path for path in (SHIM_SOCKETS.parent, SHIM_SOCKETS) if not path.exists()]
    proc = None
    try:
        try:
            proc = subprocess.Popen(
                ["containerd", "--config", str(config)], stdout=open(log, "wb"),
                stderr=subprocess.STDOUT,
                env={**os.environ, "BOOTSEER_AGENT_SOCKET": str(lazy["sock"])})
        except FileNotFoundError as exc:
            require(f"{exc} (scripts/install-system-deps.sh installs it)", "containerd")
        deadline = time.monotonic() + 60
        while engine.ctr("version", check=False).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                require(log.read_text()[-2000:], "containerd")
            time.sleep(0.1)
        # The CRI plugin checks the runtimes table when it loads: "ok" means containerd
        # takes the snippet as a real config would have it.
        plugins = engine.ctr("plugins", "ls").stdout
        status = re.search(r"^io\.containerd\.grpc\.v1\s+cri\s+\S+\s+(\w+)", plugins, re.M)
        assert status and status[1] == "ok", (
            f"containerd does not load the CRI plugin with {CONTAINERD_SNIPPET}: "
            f"{log.read_text()[-2000:]}")
        stub = root / "stub.tar"
        bootseer("image", "docker-stub", "py", "--tag", STUB, "--output", str(stub),
                 store=lazy["store"], cache=lazy["root"] / "stub-cache")
        engine.ctr("image", "import", stub)
        plain = root / "plain.tar"
        run_tool("tar", "-cf", plain, "-C", lazy["layout"], ".")
        engine.ctr("image", "import", "--index-name", PLAIN_IMAGE, plain)
        yield engine
    finally:
        if proc is not None:
            _stop_containerd(engine, proc)
        for point in reversed(_mounts_under(root)):
            run_tool("umount", "-l", point, check=False)
        shutil.rmtree(root)
        for cgroup in Path("/sys/fs/cgroup").glob(f"*/{engine.namespace}"):
            cgroup.rmdir()  # runc removed the containers' own, below it
        for path in reversed(made):
            try:
                path.rmdir()
            except OSError:
                pass  # another engine's shim uses it now


def _stop_containerd(engine: Containerd, proc: subprocess.Popen) -> None:
    """Delete what the tests left (a task's shim outlives the daemon), then stop it."""
    if proc.poll() is None:
        for container_id in engine.ctr("containers", "ls", "-q", check=False).stdout.split():
            engine.ctr("tasks", "delete", "--force", container_id, check=False)
            engine.ctr("containers", "delete", container_id, check=False)
    proc.terminate()
    proc.wait(timeout=60)


def test_containerd_config_is_the_deploy_snippet(tmp_path: Path) -> None:
    """The module's containerd runs the deploy snippet's runtimes, BinaryName aside."""
    def runtimes(text: str) -> dict:
        return tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"][
            "runtimes"]

    deployed, tested = runtimes(CONTAINERD_SNIPPET.read_text()), runtimes(
        containerd_config(tmp_path))
    assert tested["bootseer"]["options"].pop("BinaryName") == str(RUNTIME)
    assert deployed["bootseer"]["options"].pop("BinaryName").endswith("/bootseer-runtime")
    assert tested == deployed and deployed["runc"]["runtime_type"] == "io.containerd.runc.v2"


def test_containerd_runs_the_lazy_image_through_the_shim(lazy, containerd, nodes) -> None:
    """Asked as Kubernetes asks, with annotations (the stub's BOOTSEER_IMAGE agrees); the
    mount is the container's id qualified by the namespace's runc root."""
    for n in range(2):
        client = nodes.start(str(n))
        run = containerd.run("bootseer", STUB, f"lazy-{n}", "sh", "-c", SCRIPT, annotations={
            "io.bootseer.image": "py", "io.bootseer.workload": "containerd"})
        assert run.stdout.strip() == "42 3"
        _check_start(client, lazy, "containerd", "bootseer-runtime", first=n == 0)
        assert client.starts()[0].id == mount_key(f"lazy-{n}", str(containerd.runc_state))


def test_containerd_unlabelled_runs_as_with_plain_runc(containerd) -> None:
    """No agent at all: a container that did not ask never needs one."""
    shim, plain = (containerd.run(runtime, PLAIN_IMAGE, f"plain-{runtime}", "sh", "-c",
                                  PLAIN, check=False) for runtime in ("bootseer", "runc"))
    assert (shim.returncode, shim.stdout) == (plain.returncode, plain.stdout)
    assert shim.returncode == 3 and shim.stdout.startswith("plain 12\n")


def test_containerd_without_an_agent_says_why(containerd) -> None:
    run = containerd.run("bootseer", STUB, "nope", "true", check=False)
    assert run.returncode != 0
    assert "bootseer-runtime" in run.stderr and "no agent answers" in run.stderr, run.stderr
    assert containerd.ctr("containers", "ls", "-q").stdout.strip() == ""


# -- podman ---------------------------------------------------------------------------


def test_podman_runs_the_lazy_image_through_the_hook(lazy, podman, nodes,
                                                     tmp_path: Path) -> None:
    stub = tmp_path / "stub.tar"
    bootseer("image", "docker-stub", "py", "--tag", "localhost/bootseer/py:1", "--output",
             str(stub), store=lazy["store"], cache=lazy["root"] / "stub-cache")
    podman("load", "-i", stub)
    for n in range(2):
        client = nodes.start(str(n))
        run = podman("run", "--rm", "--annotation", "io.bootseer.image=py", "--annotation",
                     "io.bootseer.workload=podman", "localhost/bootseer/py:1", "sh", "-c",
                     SCRIPT)
        assert run.stdout.strip() == "42 3"
        _check_start(client, lazy, "podman", "bootseer-hook", first=n == 0)
        assert client.starts()[0].id.startswith("bootseer-")  # the hook's own mount id


def test_podman_unlabelled_runs_as_without_the_hook(podman) -> None:
    shim, plain = (podman("run", "--rm", "localhost/plain:1", "sh", "-c", PLAIN, hooks=h,
                          check=False) for h in (True, False))
    assert (shim.returncode, shim.stdout) == (plain.returncode, plain.stdout)
    assert shim.returncode == 3 and shim.stdout.startswith("plain 12\n")


def test_hook_poststop_is_safe_twice_and_without_a_mount(lazy, nodes, tmp_path) -> None:
    """A mount the engine's config names but the agent does not have, and a container
    whose config names none (the state's own annotations are the container's: ignored)."""
    client = nodes.start("hook")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(
        {"root": {"path": "rootfs"}, "annotations": {"io.bootseer.mount": "never-mounted"}}))
    state = {"ociVersion": "1.0.2", "id": "c", "status": "stopped", "bundle": str(bundle),
             "annotations": {"io.bootseer.mount": "never-mounted"}}
    env = {"BOOTSEER_AGENT_SOCKET": str(lazy["sock"])}
    unknown, unnamed = (
        subprocess.run([str(HOOK)], input=json.dumps(stdin), capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=30)
        for stdin in (state, {**state, "bundle": str(tmp_path / "gone")}))
    assert unknown.returncode == 0 and "never-mounted" in unknown.stderr
    assert unnamed.returncode == 0 and "nothing to release" in unnamed.stderr
    assert client.mounts() == []

"""Fixtures of the system tier: a node agent on a ``file://`` store, and the engines (one
real lazy image per module, dockerd, containerd and podman wired to the shim and the hook,
containerd's CRI plugin driven as the kubelet drives it) that the runtime-engine,
Kubernetes and security tests drive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.ci import require
from support.engines import HOOK, REPO, RUNTIME, run_tool
from support.images import bootseer
from support.starts import Nodes

from bootseer_dev.engines import Dockerd, EngineUnavailable, deployed_daemon_config, start_agent


@pytest.fixture
def agent(dirs, tmp_path: Path):
    sock = tmp_path / "run" / "agent.sock"
    proc = start_agent(sock, {"BOOTSEER_STORE": f"file://{dirs['store']}",
                              "BOOTSEER_CACHE_DIR": str(dirs["agent-cache"])})
    yield proc, sock
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def python_layout():
    """The Debian image with python3 (an OCI layout), built once and cached on disk."""
    from bootseer_dev.image import build_image

    return build_image(with_python=True)


@pytest.fixture(scope="module")
def lazy(tmp_path_factory) -> dict[str, Path]:
    """The store with lazy image "py", and the image's base layer unpacked (the root of
    the containers that do not ask for Bootseer)."""
    from bootseer_dev.image import build_image

    if not RUNTIME.exists() or not HOOK.exists():
        pytest.fail("bootseer-runtime/bootseer-hook are not installed: pip install -e .")
    root = tmp_path_factory.mktemp("lazy")
    layout = build_image(with_python=True)
    bootseer("image", "convert", str(layout), "--name", "py", store=root / "store",
             cache=root / "cache")
    index = json.loads((layout / "index.json").read_text())
    digest = index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads((layout / "blobs" / "sha256" / digest).read_text())
    base = layout / "blobs" / "sha256" / manifest["layers"][0]["digest"].split(":")[1]
    (root / "base").mkdir()
    run_tool("tar", "-xzf", base, "-C", root / "base")  # tar keeps devices and owners
    return {"store": root / "store", "layout": layout, "base_layer": base, "base": root / "base",
            "sock": root / "run" / "agent.sock", "root": root}


@pytest.fixture
def nodes(lazy, tmp_path: Path):
    """Fresh node agents on the engines' socket, one at a time (:class:`Nodes`)."""
    nodes = Nodes(lazy, tmp_path)
    yield nodes
    nodes.stop()


@pytest.fixture(scope="module")
def containerd(lazy):
    """containerd with the deploy snippet's runtimes and the module's images
    (:mod:`support.containerd`)."""
    from support.containerd import running

    with running(lazy) as engine:
        yield engine


@pytest.fixture
def kubelet(containerd, tmp_path: Path):
    """The kubelet's CRI calls to the module's containerd (:mod:`support.cri`); a test's
    pods are gone after it."""
    from support.containerd import PAUSE_IMAGE, PLAIN_IMAGE, STUB
    from support.cri import Kubelet

    kubelet = Kubelet(containerd.address, tmp_path / "pod-logs")
    for image in (PAUSE_IMAGE, STUB, PLAIN_IMAGE):
        kubelet.wait_for_image(image)
    yield kubelet
    kubelet.close()


@pytest.fixture(scope="module")
def dockerd(lazy):
    """dockerd with private roots and socket, no firewall or bridge changes, and the
    runtime "bootseer" (deploy/docker-daemon.json, with this venv's shim) knowing the
    module's agent socket."""
    try:
        engine = Dockerd.start(lazy["root"] / "docker", config=deployed_daemon_config(RUNTIME),
                               env={"BOOTSEER_AGENT_SOCKET": str(lazy["sock"])})
    except EngineUnavailable as exc:
        require(str(exc), "dockerd")
    # The container that does not ask: the image's base layer as a plain Docker image.
    engine.docker("import", lazy["base_layer"], "plain:1")
    yield engine.host
    engine.stop()


@pytest.fixture(scope="module")
def podman(lazy):
    """podman with private storage and a containers.conf of its own; the hooks directory
    holds deploy/hooks.d/bootseer.json pointing at this venv's hook. Yields a function
    running podman with or without the hooks."""
    root = lazy["root"] / "podman"
    hooks, no_hooks = root / "hooks.d", root / "no-hooks.d"
    hooks.mkdir(parents=True)
    no_hooks.mkdir()
    hook = json.loads((REPO / "deploy" / "hooks.d" / "bootseer.json").read_text())
    hook["hook"]["path"] = str(HOOK)
    hook["hook"]["env"] = [f"BOOTSEER_AGENT_SOCKET={lazy['sock']}"]
    (hooks / "bootseer.json").write_text(json.dumps(hook))
    (root / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/graph"\n'
        f'runroot = "{root}/run"\n')
    confs = {}
    for name, directory in (("hooks", hooks), ("none", no_hooks)):
        confs[name] = root / f"containers-{name}.conf"
        confs[name].write_text(
            '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
            'netns = "none"\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n'
            f'events_logger = "none"\nhooks_dir = ["{directory}"]\n')

    def podman(*args: str | Path, hooks: bool = True, check: bool = True):
        return run_tool("podman", *args, check=check, env={
            "CONTAINERS_CONF": str(confs["hooks" if hooks else "none"]),
            "CONTAINERS_STORAGE_CONF": str(root / "storage.conf")})

    try:
        podman("import", lazy["base_layer"], "localhost/plain:1")
    except FileNotFoundError as exc:
        require(f"{exc} (scripts/install-system-deps.sh installs it)", "podman")
    except AssertionError as exc:
        require(str(exc), "podman")
    yield podman
    podman("rm", "--all", "--force", check=False)
    podman("image", "rm", "--all", "--force", check=False)
    run_tool("umount", "-R", root / "graph" / "overlay", check=False)

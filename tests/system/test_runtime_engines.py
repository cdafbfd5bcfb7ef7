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
import subprocess
from pathlib import Path

from support.containerd import PLAIN_IMAGE, SNIPPET, STUB, config_text, runtimes
from support.engines import HOOK, RUNTIME, run_tool, write_bundle
from support.images import bootseer
from support.starts import PLAIN, SCRIPT, check_start

from bootseer.agents.mountapi import mount_key

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
        check_start(client, lazy, "runc", "bootseer-runtime", first=n == 0)
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
        check_start(client, lazy, "docker", "bootseer-runtime", first=n == 0)


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

def test_containerd_config_is_the_deploy_snippet(tmp_path: Path) -> None:
    """The module's containerd runs the deploy snippet's runtimes, BinaryName and the runc
    state's Root aside."""
    deployed, tested = runtimes(SNIPPET.read_text()), runtimes(config_text(tmp_path))
    for runtime in tested.values():
        assert runtime["options"].pop("Root") == f"{tmp_path}/runc"
    assert tested["bootseer"]["options"].pop("BinaryName") == str(RUNTIME)
    assert deployed["bootseer"]["options"].pop("BinaryName").endswith("/bootseer-runtime")
    for runtime in (*tested.values(), *deployed.values()):
        if runtime.get("options") == {}:
            del runtime["options"]
    assert tested == deployed and deployed["runc"]["runtime_type"] == "io.containerd.runc.v2"


def test_containerd_runs_the_lazy_image_through_the_shim(lazy, containerd, nodes) -> None:
    """Asked as Kubernetes asks, with annotations (the stub's BOOTSEER_IMAGE agrees); the
    mount is the container's id qualified by the namespace's runc root."""
    for n in range(2):
        client = nodes.start(str(n))
        run = containerd.run("bootseer", STUB, f"lazy-{n}", "sh", "-c", SCRIPT, annotations={
            "io.bootseer.image": "py", "io.bootseer.workload": "containerd"})
        assert run.stdout.strip() == "42 3"
        check_start(client, lazy, "containerd", "bootseer-runtime", first=n == 0)
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
        check_start(client, lazy, "podman", "bootseer-hook", first=n == 0)
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

"""Kubernetes for real: containerd's CRI plugin, driven the way the kubelet drives it.

The kubelet (:mod:`support.cri`) starts pods through containerd's CRI socket, with the
RuntimeClass handler of ``deploy/runtimeclass.yaml`` and the pod annotations a user writes
(``io.bootseer.*``); containerd runs ``deploy/containerd-bootseer.toml`` as written
(:mod:`support.containerd`): its ``pod_annotations`` filter, its sandbox (pause) containers,
its ``k8s.io`` namespace. Every start must run from the node agent's lazy root, the pause
container and pods of other RuntimeClasses must reach runc untouched, and nothing a pod
sets may name another pod's mount or its own pod. Untested here: the kubelet itself,
scheduling, and a real CNI (the pods use the node's network).
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
import yaml
from support.containerd import PLAIN_IMAGE, SNIPPET, STUB, Containerd, runtimes
from support.cri import Kubelet, Pod
from support.engines import REPO
from support.images import bootseer
from support.starts import PLAIN, SCRIPT, Nodes, check_start, wait_start
from support.wait import wait_until

from bootseer.agents.client import AgentClient
from bootseer.agents.mountapi import mount_key
from bootseer.config import ROOT_AGENT_SOCKET

RUNTIME_CLASS = yaml.safe_load((REPO / "deploy" / "runtimeclass.yaml").read_text())
HANDLER = RUNTIME_CLASS["handler"]
#: What a user writes on a pod: the lazy image, and which hot list.
ASKS = {"io.bootseer.image": "py", "io.bootseer.workload": "cri"}
#: A container that stays up (until the kubelet stops it) once it said it is ready.
SERVES = ["sh", "-c", 'trap "exit 0" TERM; touch "$BOOTSEER_READY_FILE"; sleep 600 & wait']


def _config(containerd: Containerd, container: str) -> dict:
    """The OCI config the runtime was handed for ``container`` (a sandbox's id too)."""
    return json.loads((containerd.bundle(container) / "config.json").read_text())


def _serving(kubelet: Kubelet, client: AgentClient, name: str, namespace: str,
             annotations: dict[str, str] | None = None) -> tuple[Pod, str]:
    """A pod of the bootseer class with one container "trainer" up on its lazy root."""
    pod = kubelet.run_pod(name, namespace, HANDLER, {**ASKS, **(annotations or {})})
    container = kubelet.run(pod, "trainer", STUB, SERVES)
    wait_until(lambda: any(start.pod == pod.name and "ready" in start.phases
                           for start in client.starts()), 60)
    return pod, container


def test_the_deploy_files_are_what_the_tests_run() -> None:
    """The RuntimeClass names the snippet's handler; the DaemonSet's agent serves the
    socket the runtime shim asks (root's default), shares its mounts with the host, and
    keeps its servers out of its pod's cgroup."""
    assert RUNTIME_CLASS["kind"] == "RuntimeClass" and RUNTIME_CLASS["metadata"]["name"]
    bootseer_runtime = runtimes(SNIPPET.read_text())[HANDLER]
    assert bootseer_runtime["pod_annotations"] == ["io.bootseer.*"]
    assert bootseer_runtime["options"]["BinaryName"] == "/usr/local/bin/bootseer-runtime"
    daemonset, _ = yaml.safe_load_all(
        (REPO / "deploy" / "bootseer-agent-daemonset.yaml").read_text())
    spec = daemonset["spec"]["template"]["spec"]
    (agent,) = spec["containers"]
    socket = Path(agent["command"][agent["command"].index("--socket") + 1])
    assert socket == ROOT_AGENT_SOCKET  # where the shim (root) asks, by default
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    env = {e["name"]: e["value"] for e in agent["env"]}
    assert agent["securityContext"]["privileged"]  # FUSE and overlay mounts
    assert volumes[mounts["/dev/fuse"]["name"]]["hostPath"]["path"] == "/dev/fuse"
    for path in (str(socket.parent), env["BOOTSEER_CACHE_DIR"]):
        # the host's own path, and the agent's mounts there seen by the host's runc
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path
        assert mounts[path]["mountPropagation"] == "Bidirectional"
    (init,) = spec["initContainers"]  # the cache's modes, on the same host directory
    (cache,) = [m for m in init["volumeMounts"] if m["mountPath"] == env["BOOTSEER_CACHE_DIR"]]
    assert cache["name"] == mounts[env["BOOTSEER_CACHE_DIR"]]["name"]
    # KillMode=process's equivalent (test_agent_mounts.py::
    # test_servers_outlive_the_agents_cgroup_killed_whole): the servers leave the pod's
    # cgroup for one of the host's tree, and the next agent finds them by pid.
    assert spec["hostPID"] and env["BOOTSEER_AGENT_SERVERS_CGROUP"].startswith("/")
    cgroup_root = env["BOOTSEER_AGENT_CGROUP_ROOT"]
    assert volumes[mounts[cgroup_root]["name"]]["hostPath"]["path"] == "/sys/fs/cgroup"


def test_the_readmes_pod_is_the_one_the_tests_run() -> None:
    """The README's Kubernetes recipe asks as the tests do: the RuntimeClass's name and the
    annotations a pod of it carries."""
    readme = (REPO / "README.md").read_text().split("### Kubernetes", 1)[1]
    pod = yaml.safe_load(readme.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert pod["spec"]["runtimeClassName"] == RUNTIME_CLASS["metadata"]["name"]
    assert set(pod["metadata"]["annotations"]) == set(ASKS)
    assert "deploy/runtimeclass.yaml" in readme and SNIPPET.name in readme


def test_a_pod_of_the_runtime_class_runs_its_lazy_image(lazy, containerd, kubelet,
                                                        nodes: Nodes) -> None:
    """Twice, each time on a fresh node: the first start records, the second prefetches.
    The pod's annotations reach its pause container too, which runc runs untouched; the
    start is reported with the pod's name, from containerd's own annotations."""
    for n in range(2):
        client = nodes.start(str(n))
        pod = kubelet.run_pod(f"trainer-{n}", "ml", HANDLER, ASKS)
        container = kubelet.run(pod, "trainer", STUB, ["sh", "-c", SCRIPT])
        assert kubelet.wait(container) == 0
        assert kubelet.logs(pod, "trainer") == "42 3\n"
        check_start(client, lazy, "cri", "bootseer-runtime", first=n == 0)
        (start,) = client.starts()
        assert start.id == mount_key(container, str(containerd.cri_runc_state))
        assert start.pod == f"ml/trainer-{n}"
        sandbox = _config(containerd, pod.id)
        assert sandbox["annotations"]["io.bootseer.image"] == "py"  # the pod's, copied
        assert "io.bootseer.mount" not in sandbox["annotations"]
        assert sandbox["root"]["path"] == "rootfs" and sandbox["process"]["args"][0] == \
            "/catatonit"
        report = bootseer("report", store=lazy["store"], cache=lazy["root"] / "report",
                          env={"BOOTSEER_AGENT_SOCKET": str(lazy["sock"])})
        assert f"ml/trainer-{n}" in report.stdout, report.stdout
        kubelet.remove_pod(pod)


def test_stopping_and_removing_a_pod_releases_its_mount(containerd, kubelet,
                                                        nodes: Nodes) -> None:
    client = nodes.start("stop")
    pod, container = _serving(kubelet, client, "trainer", "ml")
    (mount,) = client.mounts()
    assert mount["id"] == mount_key(container, str(containerd.cri_runc_state))
    kubelet.remove_pod(pod)
    assert client.mounts() == []
    assert "exited" in wait_start(client).phases


def test_one_container_name_in_two_pods_or_namespaces_gets_two_mounts(kubelet,
                                                                     nodes: Nodes) -> None:
    client = nodes.start("names")
    pods = [_serving(kubelet, client, name, namespace)[0]
            for name, namespace in (("a", "team-a"), ("b", "team-a"), ("a", "team-b"))]
    mounts = client.mounts()
    assert len({m["id"] for m in mounts}) == 3
    assert sorted(s.pod for s in client.starts()) == ["team-a/a", "team-a/b", "team-b/a"]
    for pod in pods:
        kubelet.remove_pod(pod)
    assert client.mounts() == []


def test_a_pods_annotations_cannot_name_another_pods_mount(containerd, kubelet,
                                                          nodes: Nodes) -> None:
    """The mount annotation, and the CRI's own pod annotations, set on a pod: the
    pod_annotations filter lets the first through, the shim overrides it; containerd writes
    the second over whatever came."""
    client = nodes.start("forge")
    victim, _ = _serving(kubelet, client, "victim", "ml")
    (theirs,) = client.mounts()
    forger, container = _serving(kubelet, client, "forger", "evil", {
        "io.bootseer.mount": theirs["id"], "io.kubernetes.cri.sandbox-name": "victim",
        "io.kubernetes.cri.sandbox-namespace": "ml"})
    assert _config(containerd, container)["annotations"]["io.bootseer.mount"] == mount_key(
        container, str(containerd.cri_runc_state))
    kubelet.remove_pod(forger)
    assert client.mounts() == [theirs]  # the victim's mount is still there, and only it
    assert {s.pod for s in client.starts()} == {"ml/victim", "evil/forger"}
    kubelet.remove_pod(victim)
    assert client.mounts() == []


def test_a_pod_mounts_checkpoints_under_checkpoint_allowed_only(kubelet, nodes: Nodes,
                                                               tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "step").mkdir(parents=True)
    (allowed / "step" / "model.txt").write_text("weights\n")
    client = nodes.start("ckpt", BOOTSEER_CHECKPOINT_ALLOWED=f"file://{allowed}/")
    pod = kubelet.run_pod("reader", "ml", HANDLER, {
        **ASKS, "io.bootseer.checkpoints": f"step=file://{allowed}/step"})
    container = kubelet.run(pod, "trainer", STUB, ["cat", "/mnt/checkpoints/step/model.txt"])
    assert kubelet.wait(container) == 0
    assert kubelet.logs(pod, "trainer") == "weights\n"
    kubelet.remove_pod(pod)
    pod = kubelet.run_pod("thief", "ml", HANDLER, {
        **ASKS, "io.bootseer.checkpoints": "x=file:///etc"})
    container = kubelet.create(pod, "trainer", STUB, ["cat", "/mnt/checkpoints/x/shadow"])
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.start(container)
    assert "checkpoint.allowed" in refused.value.details(), refused.value.details()
    kubelet.remove_pod(pod)
    assert client.mounts() == []


def test_other_runtime_classes_and_pods_that_do_not_ask_go_to_runc(containerd,
                                                                   kubelet) -> None:
    """No agent at all. A pod of the default class (runc) that carries the annotation,
    and a pod of the bootseer class that does not, run exactly as with runc."""
    outputs = []
    for handler, asks in (("", ASKS), (HANDLER, {})):
        pod = kubelet.run_pod(f"plain-{handler or 'runc'}", "ml", handler, asks)
        container = kubelet.run(pod, "main", PLAIN_IMAGE, ["sh", "-c", PLAIN])
        outputs.append((kubelet.wait(container), kubelet.logs(pod, "main")))
        sandbox = _config(containerd, pod.id)  # runc's runtime passes no pod annotations
        assert not [k for k in sandbox["annotations"] if k.startswith("io.bootseer.")]
        kubelet.remove_pod(pod)
    assert outputs[0] == outputs[1] == (
        3, "plain 12\nls: cannot access '/run/bootseer': No such file or directory\n")

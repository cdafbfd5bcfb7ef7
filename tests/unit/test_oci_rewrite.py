"""agents/oci.py (the config rewrite) and the shim's reading of runc's command line, on
plain dictionaries and argument lists: no engine, no agent."""

from __future__ import annotations

import copy
import io
import json
import tarfile
from pathlib import Path

import pytest

from bootseer.agents import oci
from bootseer.agents.mountapi import ContainerMount, MountRequest
from bootseer.agents.runtime import RuncCall, parse
from bootseer.prefetch.container import bundle_config
from bootseer.prefetch.dockerstub import build_stub, stub_config

MOUNT = ContainerMount(
    id="c1", image="py", image_id="sha256:" + "ab" * 32, rootfs="/var/lib/bootseer/c1/root",
    signal_dir="/var/lib/bootseer/c1/signal",
    env={"BOOTSEER_READY_FILE": "/run/bootseer/ready", "BOOTSEER_IMAGE_ID": "sha256:ab"},
    image_config={"Env": ["PATH=/opt/py/bin:/usr/bin", "LANG=C.UTF-8"],
                  "WorkingDir": "/work", "Cmd": ["python3"]},
    recording=True)
HOOK = oci.Hook("/usr/bin/bootseer-hook", ["bootseer-hook", "poststop"],
                ["BOOTSEER_AGENT_SOCKET=/run/bootseer/agent.sock"])


def spec(env: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
         cwd: str = "/") -> dict:
    config = bundle_config(Path("/"), ["python3", "-V"], {"PATH": "/usr/bin", **(env or {})},
                           cwd=cwd)
    if annotations is not None:
        config["annotations"] = annotations
    return config


@pytest.mark.parametrize("config, expected", [
    (spec(annotations={"io.bootseer.image": "py"}), oci.Labels("py")),
    (spec(env={"BOOTSEER_IMAGE": "py"}), oci.Labels("py")),
    (spec(annotations={"io.bootseer.image": "py", "io.bootseer.workload": "train",
                       "io.bootseer.job": "j1", "io.bootseer.record": "never"}),
     oci.Labels("py", "train", "j1", "never")),
    # an image's ENV names no job: joining one (its report, its peers) is the pod's
    (spec(env={"BOOTSEER_IMAGE": "py", "BOOTSEER_WORKLOAD": "eval", "BOOTSEER_JOB": "j2",
               "BOOTSEER_RECORD": "always"}), oci.Labels("py", "eval", None, "always")),
    # the annotation wins over the environment, setting by setting
    (spec(env={"BOOTSEER_IMAGE": "env-img", "BOOTSEER_WORKLOAD": "w-env"},
          annotations={"io.bootseer.image": "ann-img"}), oci.Labels("ann-img", "w-env")),
    (spec(), None),
    (spec(annotations={"io.other": "x"}, env={"BOOTSEER_IMAGE": ""}), None),
    ({"ociVersion": "1.0.2"}, None),
])
def test_which_containers_asked_for_bootseer(config, expected) -> None:
    assert oci.requested(config) == expected


def test_a_bad_record_mode_is_an_error_naming_the_setting() -> None:
    with pytest.raises(oci.SpecError, match="io.bootseer.record.*always"):
        oci.requested(spec(env={"BOOTSEER_IMAGE": "py", "BOOTSEER_RECORD": "sometimes"}))


def test_labels_become_the_agents_mount_request() -> None:
    request = oci.Labels("py", "train", "j1", "never").mount_request("abc123", "docker")
    assert (request.id, request.image, request.workload, request.job, request.record,
            request.runtime) == ("abc123", "py", "train", "j1", "never", "docker")
    with pytest.raises(ValueError, match="'id' must match"):
        oci.Labels("py").mount_request("../etc", "docker")


#: What containerd's CRI plugin writes into a pod's containers, over the pod's own.
CRI = {"io.kubernetes.cri.sandbox-name": "trainer-0", "io.kubernetes.cri.sandbox-namespace":
       "ml", "io.kubernetes.cri.sandbox-id": "f" * 64}


def test_a_pods_sandbox_goes_to_runc_though_the_pods_annotations_reach_it() -> None:
    asked = {"io.bootseer.image": "py", **CRI}
    sandbox = spec(annotations={**asked, "io.kubernetes.cri.container-type": "sandbox"})
    container = spec(annotations={**asked, "io.kubernetes.cri.container-type": "container"})
    assert oci.requested(sandbox) is None
    assert oci.requested(container) == oci.Labels("py", pod="ml/trainer-0")


def test_a_start_names_its_pod_only_as_the_engine_does() -> None:
    assert oci.pod_of(CRI) == "ml/trainer-0"
    assert oci.pod_of({"io.kubernetes.cri.sandbox-name": "x"}) is None  # no namespace
    assert oci.Labels("py").mount_request("c1", "docker").pod is None
    request = oci.Labels("py", pod="ml/trainer-0").mount_request("c1", "bootseer-runtime")
    assert MountRequest.from_json(request.to_json()) == request
    for bad in ("ml", "ml/../x", "-ml/x", "ML/x", "ml/x/y", "a" * 64 + "/x"):
        with pytest.raises(ValueError, match="'pod' must match"):
            oci.Labels("py", pod=bad).mount_request("c1", "bootseer-runtime")


def test_rewrite_runs_the_container_on_the_mount() -> None:
    before = spec(env={"BOOTSEER_IMAGE": "py", "LANG": "de_DE"},
                  annotations={"io.other": "kept"})
    before["hooks"] = {"poststop": [{"path": "/bin/true"}]}
    pristine = copy.deepcopy(before)
    after = oci.rewrite(before, MOUNT, HOOK)
    assert before == pristine  # a copy is modified, never the input
    assert after["root"] == {"path": MOUNT.rootfs, "readonly": False}
    signal = [m for m in after["mounts"] if m["destination"] == "/run/bootseer"]
    assert signal == [{"destination": "/run/bootseer", "type": "bind",
                       "source": MOUNT.signal_dir,
                       "options": ["rbind", "rw", "nosuid", "nodev"]}]
    env = oci.env_map(after)
    assert env["PATH"] == "/usr/bin"  # the container's own value stays
    assert env["LANG"] == "de_DE"
    assert env["BOOTSEER_READY_FILE"] == "/run/bootseer/ready"  # the agent's are added
    assert env["BOOTSEER_IMAGE_ID"] == "sha256:ab"
    assert env["BOOTSEER_IMAGE"] == "py"
    assert after["process"]["cwd"] == "/work"  # "/" was the engine's default
    assert after["hooks"]["poststop"] == [{"path": "/bin/true"}, {
        "path": "/usr/bin/bootseer-hook", "args": ["bootseer-hook", "poststop"],
        "env": ["BOOTSEER_AGENT_SOCKET=/run/bootseer/agent.sock"]}]
    assert after["annotations"] == {"io.other": "kept", "io.bootseer.mount": "c1"}
    assert oci.mount_id(after) == "c1" and oci.mount_id(before) is None
    # everything else is the engine's
    for key in ("linux", "hostname", "ociVersion"):
        assert after[key] == before[key]
    assert after["process"]["args"] == before["process"]["args"]


def test_image_env_fills_in_only_and_agent_env_overrides() -> None:
    after = oci.rewrite(spec(env={"BOOTSEER_READY_FILE": "/elsewhere"}), MOUNT)
    env = oci.env_map(after)
    assert env["BOOTSEER_READY_FILE"] == "/run/bootseer/ready"
    assert env["PATH"] == "/usr/bin" and env["LANG"] == "C.UTF-8"
    assert list(env).count("PATH") == 1


def test_an_explicit_cwd_stays_and_no_hook_means_none_added() -> None:
    after = oci.rewrite(spec(cwd="/data"), MOUNT)
    assert after["process"]["cwd"] == "/data"
    assert "hooks" not in after  # podman's precreate: the engine runs hooks.d poststop
    plain = ContainerMount(id="c2", image="py", image_id="sha256:x", rootfs="/r",
                           signal_dir="/s")
    assert oci.rewrite(spec(), plain)["process"]["cwd"] == "/"


def test_an_engine_mount_at_the_signal_target_is_replaced() -> None:
    config = spec()
    config["mounts"].append({"destination": "/run/bootseer", "type": "tmpfs",
                             "source": "tmpfs"})
    after = oci.rewrite(config, MOUNT)
    assert [m["type"] for m in after["mounts"]
            if m["destination"] == "/run/bootseer"] == ["bind"]


def test_a_failed_modification_forwards_nothing() -> None:
    config = spec()
    config["process"]["env"] = 42  # not a list: merging fails part-way
    pristine = copy.deepcopy(config)
    with pytest.raises(TypeError):
        oci.rewrite(config, MOUNT, HOOK)
    assert config == pristine


@pytest.mark.parametrize("argv, expected", [
    (["--root", "/run/r", "--log", "/l.json", "--log-format", "json", "--systemd-cgroup",
      "create", "--bundle", "/b", "--pid-file", "/p", "--console-socket", "/s", "abc"],
     RuncCall("create", Path("/b"), "abc", Path("/l.json"), "json", "/run/r")),
    (["--root=/run/r", "run", "-b", "/b", "--detach", "xyz"],
     RuncCall("run", Path("/b"), "xyz", root="/run/r")),
    (["-root", "create", "create", "--bundle=/b", "--no-pivot", "id1"],  # a value "create"
     RuncCall("create", Path("/b"), "id1", root="create")),
    (["--debug", "create", "id2"], RuncCall("create", None, "id2")),  # bundle: the cwd
    (["--root", "/r", "start", "abc"], RuncCall("start", root="/r")),
    (["--log", "/l", "delete", "--force", "abc"], RuncCall("delete", log=Path("/l"))),
    (["--version"], RuncCall(None)),
    ([], RuncCall(None)),
])
def test_runc_command_lines(argv, expected) -> None:
    assert parse(argv) == expected


def test_the_stub_image_carries_the_lazy_images_config() -> None:
    lazy = {"Cmd": ["python3"], "Entrypoint": ["/init"], "Env": ["PATH=/x", "BOOTSEER_IMAGE=o"],
            "WorkingDir": "/w", "ExposedPorts": {"80/tcp": {}}}
    assert stub_config("py", lazy) == {"Cmd": ["python3"], "Entrypoint": ["/init"],
                                       "Env": ["PATH=/x", "BOOTSEER_IMAGE=py"],
                                       "WorkingDir": "/w"}
    stub = build_stub("py", "bootseer/py:1", {"config": lazy, "architecture": "amd64"})
    with tarfile.open(fileobj=io.BytesIO(stub.archive)) as archive:
        (manifest,) = json.load(archive.extractfile("manifest.json"))
        config = json.load(archive.extractfile(manifest["Config"]))
        layer = archive.extractfile(manifest["Layers"][0]).read()
    assert manifest["RepoTags"] == ["bootseer/py:1"]
    assert stub.image_id == "sha256:" + manifest["Config"].removesuffix(".json")
    assert config["config"]["Env"][-1] == "BOOTSEER_IMAGE=py"
    with tarfile.open(fileobj=io.BytesIO(layer)) as empty:
        assert empty.getmembers() == []


def test_checkpoints_are_asked_for_by_name_and_bound_read_only_as_slaves() -> None:
    labels = oci.requested(spec(annotations={
        "io.bootseer.image": "py",
        "io.bootseer.checkpoints": "step=hdfs://nn:8020/ckpt/step100, opt=file:///c/o"}))
    assert labels.checkpoints == (("step", "hdfs://nn:8020/ckpt/step100"),
                                  ("opt", "file:///c/o"))
    assert labels.mount_request("c1", "docker").checkpoints == {
        "step": "hdfs://nn:8020/ckpt/step100", "opt": "file:///c/o"}
    with pytest.raises(oci.SpecError, match="not NAME=URL"):
        oci.requested(spec(env={"BOOTSEER_IMAGE": "py", "BOOTSEER_CHECKPOINTS": "step"}))
    with pytest.raises(ValueError, match="checkpoints"):
        oci.Labels("py", checkpoints=(("../x", "file:///c"),)).mount_request("c1", "docker")
    assert not [m for m in oci.rewrite(spec(), MOUNT)["mounts"]
                if m["destination"] == "/mnt/checkpoints"]  # none asked: none bound
    with_checkpoints = ContainerMount(**{**MOUNT.to_json(), "checkpoints_dir": "/x/ckpt"})
    (bind,) = [m for m in oci.rewrite(spec(), with_checkpoints)["mounts"]
               if m["destination"] == "/mnt/checkpoints"]
    assert bind["source"] == "/x/ckpt" and {"ro", "rslave", "rbind"} <= set(bind["options"])


def test_environments_are_asked_for_by_key_and_named_to_the_container() -> None:
    labels = oci.requested(spec(env={"BOOTSEER_IMAGE": "py"}, annotations={
        "io.bootseer.envs": "torch-abc, tools.1"}))
    assert labels.envs == ("torch-abc", "tools.1")
    request = labels.mount_request("c1", "docker")
    assert request.envs == ("torch-abc", "tools.1")
    assert MountRequest.from_json(request.to_json()) == request
    for bad in (("../x",), ("a", "a")):
        with pytest.raises(ValueError, match="envs"):
            oci.Labels("py", envs=bad).mount_request("c1", "docker")
    with pytest.raises(ValueError, match="envs"):
        MountRequest.from_json({"id": "c1", "image": "py", "envs": "torch-abc"})
    mounted = ContainerMount(**{**MOUNT.to_json(), "env": {"BOOTSEER_ENVS_MOUNTED": "a,b"}})
    assert "BOOTSEER_ENVS_MOUNTED=a,b" in oci.rewrite(spec(), mounted)["process"]["env"]

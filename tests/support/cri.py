"""The kubelet's side of CRI, for the tests: containerd's CRI plugin driven over its gRPC
socket with the kubelet's calls, in the kubelet's order, through PyPI's generated CRI v1
stubs (``container-runtime-interface-api``; Go's crictl cannot be built here).

A pod starts as the kubelet starts one: ``RunPodSandbox`` (its RuntimeClass's handler, its
annotations), ``PodSandboxStatus``, ``ImageStatus`` (the kubelet pulls a missing image
first; here every image is imported, so a missing one is the test's error), then for each
container ``CreateContainer`` and ``StartContainer``. It goes as the kubelet ends one:
``StopContainer`` for each, ``StopPodSandbox``, ``RemoveContainer`` for each,
``RemovePodSandbox``. Pods run in the node's network (no CNI: containerd 1.6 sets up none
for them) under one cgroup parent, which :meth:`Kubelet.close` removes.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from cri_api.v1 import api_pb2 as cri
from cri_api.v1.api_pb2_grpc import ImageServiceStub, RuntimeServiceStub

__all__ = ["Kubelet", "Pod", "cri"]

TIMEOUT = 120  # seconds for one call: a sandbox's or a lazy root's first start


@dataclass
class Pod:
    id: str  # the sandbox's, containerd's
    config: cri.PodSandboxConfig
    containers: dict[str, str] = field(default_factory=dict)  # name -> container id

    @property
    def name(self) -> str:
        return f"{self.config.metadata.namespace}/{self.config.metadata.name}"

    @property
    def log_directory(self) -> Path:
        return Path(self.config.log_directory)


class Kubelet:
    """One node's kubelet, as far as CRI goes."""

    def __init__(self, socket: Path, log_root: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.runtime = RuntimeServiceStub(self.channel)
        self.images = ImageServiceStub(self.channel)
        self.log_root = log_root
        #: Every pod's cgroups below this one (cgroupfs paths, as the kubelet's kubepods).
        self.cgroup_parent = f"/bootseer-cri-{os.getpid()}"
        self.pods: list[Pod] = []

    def version(self) -> cri.VersionResponse:
        return self.runtime.Version(cri.VersionRequest(version="v1"), timeout=10)

    def has_image(self, image: str) -> bool:
        found = self.images.ImageStatus(
            cri.ImageStatusRequest(image=cri.ImageSpec(image=image)), timeout=TIMEOUT)
        return bool(found.image.id)

    def wait_for_image(self, image: str, timeout: float = 30) -> None:
        """The CRI plugin learns of an image ``ctr`` imported from containerd's events,
        a moment later."""
        deadline = time.monotonic() + timeout
        while not self.has_image(image):
            assert time.monotonic() < deadline, f"the CRI plugin never saw {image}"
            time.sleep(0.1)

    def run_pod(self, name: str, namespace: str = "default", handler: str = "",
                annotations: dict[str, str] | None = None) -> Pod:
        """``RunPodSandbox`` with ``handler`` (a RuntimeClass's; "" is containerd's
        default, runc), then ``PodSandboxStatus`` until ready."""
        uid = str(uuid.uuid4())
        logs = self.log_root / f"{namespace}_{name}_{uid}"  # the kubelet's layout
        logs.mkdir(parents=True)
        config = cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=name, uid=uid, namespace=namespace),
            log_directory=str(logs), annotations=annotations or {},  # node network: no hostname
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
                    "io.kubernetes.pod.uid": uid},
            linux=cri.LinuxPodSandboxConfig(
                cgroup_parent=self.cgroup_parent,
                security_context=cri.LinuxSandboxSecurityContext(
                    namespace_options=cri.NamespaceOption(network=cri.NODE))))
        sandbox = self.runtime.RunPodSandbox(
            cri.RunPodSandboxRequest(config=config, runtime_handler=handler),
            timeout=TIMEOUT).pod_sandbox_id
        pod = Pod(sandbox, config)
        self.pods.append(pod)
        status = self.runtime.PodSandboxStatus(
            cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox), timeout=TIMEOUT).status
        assert status.state == cri.SANDBOX_READY, status
        return pod

    def create(self, pod: Pod, name: str, image: str, command: list[str],
               annotations: dict[str, str] | None = None) -> str:
        """``ImageStatus``, then ``CreateContainer`` (the kubelet never creates from an
        image the runtime does not have)."""
        assert self.has_image(image), f"{image} is not on the node (the kubelet would pull)"
        config = cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=name), image=cri.ImageSpec(image=image),
            command=command, log_path=f"{name}/0.log", annotations=annotations or {},
            labels={"io.kubernetes.container.name": name})
        container = self.runtime.CreateContainer(cri.CreateContainerRequest(
            pod_sandbox_id=pod.id, config=config, sandbox_config=pod.config),
            timeout=TIMEOUT).container_id
        pod.containers[name] = container
        return container

    def start(self, container: str) -> None:
        self.runtime.StartContainer(cri.StartContainerRequest(container_id=container),
                                    timeout=TIMEOUT)

    def run(self, pod: Pod, name: str, image: str, command: list[str],
            annotations: dict[str, str] | None = None) -> str:
        container = self.create(pod, name, image, command, annotations)
        self.start(container)
        return container

    def status(self, container: str) -> cri.ContainerStatus:
        return self.runtime.ContainerStatus(
            cri.ContainerStatusRequest(container_id=container), timeout=TIMEOUT).status

    def wait(self, container: str, timeout: float = 120) -> int:
        """The container's exit code, once it has exited."""
        deadline = time.monotonic() + timeout
        while (status := self.status(container)).state != cri.CONTAINER_EXITED:
            assert time.monotonic() < deadline, f"{container} still {status.state}"
            time.sleep(0.1)
        return status.exit_code

    def logs(self, pod: Pod, name: str) -> str:
        """What the container wrote to stdout, from its CRI log file (lines of
        ``TIME STREAM P|F TEXT``)."""
        text = (pod.log_directory / name / "0.log").read_text()
        return "".join(parts[3] + ("\n" if parts[2] == "F" else "")
                       for line in text.splitlines()
                       if len(parts := line.split(" ", 3)) == 4 and parts[1] == "stdout")

    def remove_pod(self, pod: Pod) -> None:
        """The kubelet's teardown of a pod: stop each container, the sandbox, then remove
        each container and the sandbox."""
        for container in pod.containers.values():
            self.runtime.StopContainer(cri.StopContainerRequest(container_id=container,
                                                                timeout=10), timeout=TIMEOUT)
        self.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod.id),
                                    timeout=TIMEOUT)
        for container in pod.containers.values():
            self.runtime.RemoveContainer(cri.RemoveContainerRequest(container_id=container),
                                         timeout=TIMEOUT)
        self.runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod.id),
                                      timeout=TIMEOUT)
        self.pods.remove(pod)

    def close(self) -> None:
        """Remove every pod still there (a failed test's), then the pods' cgroup parent."""
        try:
            for pod in list(self.pods):
                with contextlib.suppress(grpc.RpcError):
                    self.remove_pod(pod)
        finally:
            self.channel.close()
            root = Path("/sys/fs/cgroup")  # v2: one hierarchy; v1: one per controller
            for cgroup in [*root.glob(f"*{self.cgroup_parent}"), root / self.cgroup_parent[1:]]:
                with contextlib.suppress(FileNotFoundError):
                    cgroup.rmdir()

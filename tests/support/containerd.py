"""A private containerd (Debian's 1.6) for the engine tests: reached with ``ctr``, which
bypasses the CRI plugin, and through the CRI plugin as the kubelet reaches it
(:mod:`support.cri`).

Its config is ``deploy/containerd-bootseer.toml`` itself, with private paths around it:
root, state, socket, CNI directories, each runtime's runc state (``Root``), and the pods'
sandbox image, a ``catatonit`` image built here (no registry is reachable); and, because
root here lacks ``CAP_SYS_RESOURCE``, ``restrict_oom_score_adj``. Teardown
removes what setup made: pods and containers, the daemon, mounts left under its root, the
root, the cgroups of its namespaces and pods, and the shim socket directories if new.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bootseer.config import tomllib  # tomli before Python 3.11
from bootseer.prefetch.image_source import OCI_MANIFEST
from support.ci import require
from support.engines import REPO, RUNTIME, run_tool
from support.images import bootseer
from support.layers import layer, reg
from support.oci import COMPRESS, CONFIG_TYPE, OCI_LAYER_GZIP, put_blob, sha, write_layout

SNIPPET = REPO / "deploy" / "containerd-bootseer.toml"
#: Where every containerd 1.6 shim puts its socket, whatever the daemon's state directory.
SHIM_SOCKETS = Path("/run/containerd/s")
#: The stub of lazy image "py" (ctr names Docker archives' tags in full), a plain image
#: (the lazy image's own layout) and the pods' sandbox image.
STUB, PLAIN_IMAGE, PAUSE_IMAGE = ("docker.io/bootseer/py:1", "localhost/plain:1",
                                  "localhost/bootseer-pause:1")
#: The CRI plugin's containerd namespace (fixed: the kubelet's images and pods live there).
CRI_NAMESPACE = "k8s.io"
CATATONIT = Path("/usr/bin/catatonit")
CRI = '"io.containerd.grpc.v1.cri"'


def config_text(root: Path) -> str:
    """containerd's config: private paths, then the text of the deploy snippet itself (not
    a copy), its BinaryName pointing at this venv's shim and each runtime's runc state
    under ``root`` (``Root``: a pod's containers are then named by ``root/runc/k8s.io``)."""
    runc_root = f'{root}/runc'
    snippet, found = re.subn(r'(?m)^(\s*)BinaryName\s*=\s*"[^"\n]*"',
                             lambda m: f'{m[1]}BinaryName = "{RUNTIME}"\n'
                                       f'{m[1]}Root = "{runc_root}"', SNIPPET.read_text())
    assert found == 1, f"{SNIPPET} sets BinaryName {found} times, not once"
    return (f'version = 2\nroot = "{root}/root"\nstate = "{root}/state"\n'
            f'[grpc]\n  address = "{root}/containerd.sock"\n'
            f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{root}/opt"\n'
            f'[plugins.{CRI}]\n  sandbox_image = "{PAUSE_IMAGE}"\n'
            # A pod's sandbox asks for oom_score_adj -998, which needs CAP_SYS_RESOURCE;
            # these machines' root lacks it (a kubelet's node has it): no lower than ours.
            f'  restrict_oom_score_adj = true\n'
            f'[plugins.{CRI}.cni]\n  conf_dir = "{root}/cni"\n  bin_dir = "{root}/cni"\n'
            f'{snippet}'
            f'[plugins.{CRI}.containerd.runtimes.runc.options]\n  Root = "{runc_root}"\n')


def runtimes(text: str) -> dict:
    """The CRI plugin's runtimes table of a config's text."""
    return tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"][
        "runtimes"]


@dataclass(frozen=True)
class Containerd:
    """A running private containerd. ``ctr`` does not go through the CRI plugin, so
    :meth:`run` names a runtime as the CRI plugin's table (loaded from the config) defines
    it: its type, and its BinaryName as ``--runc-binary``."""

    root: Path
    namespace: str  # ctr's
    runtimes: dict[str, dict]

    @property
    def address(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def runc_root(self) -> Path:
        """The shim runs runc --root runc_root/NAMESPACE."""
        return self.root / "runc"

    @property
    def runc_state(self) -> Path:
        return self.runc_root / self.namespace

    @property
    def cri_runc_state(self) -> Path:
        return self.runc_root / CRI_NAMESPACE

    def bundle(self, container_id: str) -> Path:
        """A CRI container's bundle (its config.json as the runtime was handed it)."""
        return (self.root / "state" / "io.containerd.runtime.v2.task" / CRI_NAMESPACE
                / container_id)

    def ctr(self, *args: str | Path, check: bool = True,
            namespace: str | None = None) -> subprocess.CompletedProcess:
        return run_tool("ctr", "--address", self.address, "--namespace",
                        namespace or self.namespace, *args, check=check)

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
        return self.ctr("run", "--rm", "--fifo-dir", self.root / "fifo", *args, image,
                        container_id, *cmd, check=check)


def pause_image(dest: Path) -> Path:
    """A Docker-less sandbox image: Debian's static ``catatonit`` in pause mode (``-P``:
    it only waits, as ``registry.k8s.io/pause`` does), as an OCI layout tar."""
    if not CATATONIT.is_file():
        require(f"{CATATONIT} is missing (scripts/install-system-deps.sh installs catatonit)",
                "the pods' sandbox image")
    tar = layer(reg("catatonit", CATATONIT.read_bytes(), mode=0o755))
    layout = dest.with_suffix(".layout")
    config = put_blob(layout, json.dumps({
        "architecture": "amd64", "os": "linux", "config": {"Entrypoint": ["/catatonit", "-P"]},
        "rootfs": {"type": "layers", "diff_ids": [sha(tar)]}}).encode(), CONFIG_TYPE)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config,
                "layers": [put_blob(layout, COMPRESS[OCI_LAYER_GZIP](tar), OCI_LAYER_GZIP)]}
    write_layout(layout, [put_blob(layout, json.dumps(manifest).encode(), OCI_MANIFEST)])
    run_tool("tar", "-cf", dest, "-C", layout, ".")
    shutil.rmtree(layout)
    return dest


@contextlib.contextmanager
def running(lazy: dict[str, Path]) -> Iterator[Containerd]:
    """containerd with the module's store images imported (the stub of "py" and the plain
    image in ctr's namespace and the CRI's, the sandbox image in the CRI's), knowing the
    module's agent socket."""
    root = lazy["root"] / "containerd"
    root.mkdir()
    config, log = root / "config.toml", root / "containerd.log"
    config.write_text(config_text(root))
    engine = Containerd(root, f"bootseer-test-{os.getpid()}", runtimes(config.read_text()))
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
            f"containerd does not load the CRI plugin with {SNIPPET}: "
            f"{log.read_text()[-2000:]}")
        stub, plain = root / "stub.tar", root / "plain.tar"
        bootseer("image", "docker-stub", "py", "--tag", STUB, "--output", str(stub),
                 store=lazy["store"], cache=lazy["root"] / "stub-cache")
        _unnamed_layout_tar(lazy["layout"], root / "plain", plain)
        for namespace in (engine.namespace, CRI_NAMESPACE):
            engine.ctr("image", "import", stub, namespace=namespace)
            engine.ctr("image", "import", "--index-name", PLAIN_IMAGE, plain,
                       namespace=namespace)
        engine.ctr("image", "import", "--index-name", PAUSE_IMAGE,
                   pause_image(root / "pause.tar"), namespace=CRI_NAMESPACE)
        yield engine
    finally:
        if proc is not None:
            _stop(engine, proc)
        for point in reversed(mounts_under(root)):
            run_tool("umount", "-l", point, check=False)
        shutil.rmtree(root)
        for cgroup in Path("/sys/fs/cgroup").glob(f"*/{engine.namespace}"):
            cgroup.rmdir()  # runc removed the containers' own, below it (pods: support.cri)
        for path in reversed(made):
            with contextlib.suppress(OSError):  # another engine's shim uses it now
                path.rmdir()


def _unnamed_layout_tar(layout: Path, work: Path, tar: Path) -> None:
    """``layout`` as a tar without its manifests' ref names: ctr would name the image
    "import-DATE:REF" besides ``--index-name``, and the CRI plugin resolves the image to
    that name, which is no valid reference."""
    work.mkdir()
    index = json.loads((layout / "index.json").read_text())
    for manifest in index["manifests"]:
        manifest.pop("annotations", None)
    (work / "index.json").write_text(json.dumps(index))
    shutil.copy(layout / "oci-layout", work / "oci-layout")
    (work / "blobs").symlink_to(layout / "blobs")
    run_tool("tar", "-chf", tar, "-C", work, ".")  # -h: the blobs, not the link
    shutil.rmtree(work)


def mounts_under(root: Path) -> list[str]:
    points = (line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    return [point for point in points if point.startswith(f"{root}/")]


def _stop(engine: Containerd, proc: subprocess.Popen) -> None:
    """Delete what the tests left (a task's shim outlives the daemon), then stop it."""
    if proc.poll() is None:
        for namespace in (engine.namespace, CRI_NAMESPACE):
            for container_id in engine.ctr("containers", "ls", "-q", check=False,
                                           namespace=namespace).stdout.split():
                engine.ctr("tasks", "delete", "--force", container_id, check=False,
                           namespace=namespace)
                engine.ctr("containers", "delete", container_id, check=False,
                           namespace=namespace)
    proc.terminate()
    proc.wait(timeout=60)

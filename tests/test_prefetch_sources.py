"""Converting from a real OCI registry (Debian's docker-registry, via skopeo) and from a
real Docker engine (dockerd with a private data root, via the docker SDK)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_prefetch_lazy import BIG, big_image

from bootseer.nodecache import NodeCache
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.store import BlobStore, open_store


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(check, what: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """docker-registry (distribution 2.8) on loopback with a filesystem store."""
    root = tmp_path_factory.mktemp("registry")
    port = _free_port()
    config = root / "config.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n")
    log = root / "registry.log"
    proc = subprocess.Popen(["docker-registry", "serve", str(config)],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)

    def up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    _wait(up, "docker-registry", proc, log)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory):
    """A Docker engine of our own: private roots and socket, no firewall or bridge changes."""
    root = tmp_path_factory.mktemp("docker")
    sock = root / "docker.sock"
    log = root / "dockerd.log"
    proc = subprocess.Popen(
        ["dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
         "--pidfile", str(root / "docker.pid"), "-H", f"unix://{sock}",
         "--iptables=false", "--bridge=none"],
        stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    host = f"unix://{sock}"

    def up() -> bool:
        return sock.exists() and subprocess.run(
            ["docker", "-H", host, "version"], capture_output=True).returncode == 0

    _wait(up, "dockerd", proc, log)
    yield host
    proc.terminate()
    proc.wait(timeout=60)


def _convert(store: Path, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "bootseer", "--store", f"file://{store}", "image", "convert",
         *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _assert_serves_big(store: Path, name: str, cache: Path) -> None:
    image = LazyImage(BlobStore(open_store(str(store))), name, NodeCache(cache, 1 << 30))
    entry = image.lookup("/data/big.bin")
    assert image.read(entry, 0, entry.size) == BIG
    assert image.manifest.source["location"].startswith(("docker://", "docker-daemon:"))


def test_convert_from_a_registry(registry, tmp_path: Path) -> None:
    layout = big_image(tmp_path / "image")
    ref = f"docker://{registry}/bootseer/test:1"
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}",
                    ref], check=True, capture_output=True)
    digest = _convert(tmp_path / "store", ref, "--insecure", "--name", "from-registry")
    assert digest.startswith("sha256:")
    _assert_serves_big(tmp_path / "store", "from-registry", tmp_path / "cache")


def test_convert_from_a_docker_engine(dockerd, tmp_path: Path) -> None:
    layout = big_image(tmp_path / "image")
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-daemon-host", dockerd, f"oci:{layout}",
                    "docker-daemon:bootseer-test:1"], check=True, capture_output=True)
    _convert(tmp_path / "store", "docker-daemon:bootseer-test:1", "--name", "from-engine",
             env={"DOCKER_HOST": dockerd})
    _assert_serves_big(tmp_path / "store", "from-engine", tmp_path / "cache")


def test_missing_sources_are_clear_errors(registry, tmp_path: Path) -> None:
    for source, message in [
        (str(tmp_path / "nope"), "no such file or directory"),
        (f"docker://{registry}/no/such:image", "skopeo could not copy"),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "bootseer", "--store", f"file://{tmp_path}/s", "image",
             "convert", source, "--insecure"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and message in result.stderr, result.stderr

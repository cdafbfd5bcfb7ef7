"""Converting from a real OCI registry (Debian's docker-registry, via skopeo) and from a
real Docker engine (dockerd with a private data root, via the docker SDK)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.images import BIG, big_image

from bootseer.nodecache import NodeCache
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.store import BlobStore, open_store
from bootseer_dev.engines import Dockerd, Registry


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """docker-registry (distribution 2.8) on loopback with a filesystem store."""
    registry = Registry.start(tmp_path_factory.mktemp("registry"))
    yield registry
    registry.stop()


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory):
    """A Docker engine of our own: private roots and socket, no firewall or bridge changes."""
    engine = Dockerd.start(tmp_path_factory.mktemp("docker"))
    yield engine.host
    engine.stop()


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
    ref = "docker://" + registry.push(layout, "bootseer/test:1")
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
        (f"docker://{registry.address}/no/such:image", "skopeo could not copy"),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "bootseer", "--store", f"file://{tmp_path}/s", "image",
             "convert", source, "--insecure"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and message in result.stderr, result.stderr

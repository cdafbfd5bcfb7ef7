"""Where an image to convert comes from: a local path, a registry, or a Docker engine.

``bootseer image convert`` reads OCI image layouts and ``docker save`` archives
(:mod:`bootseer.prefetch.image_source`); the other sources are first made into one of those, with
the tools their ecosystems already use:

* ``docker://REGISTRY/REPO:TAG`` — ``skopeo copy`` into a temporary OCI layout (every
  blob is verified against its digest again when it is read);
* ``docker-daemon:REPO:TAG`` — the Docker engine's ``docker save`` through the docker SDK
  (``DOCKER_HOST`` picks the engine), into a temporary archive.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bootseer.errors import BootseerError

REGISTRY_PREFIX = "docker://"
DAEMON_PREFIX = "docker-daemon:"


class ImageSourceError(BootseerError):
    """The image could not be fetched from where the source says it is."""


@contextmanager
def materialized(source: str, *, insecure: bool = False) -> Iterator[Path]:
    """A local OCI layout or ``docker save`` archive for ``source``, for the ``with`` block.

    ``insecure`` allows a registry over plain HTTP or with a certificate that does not
    verify (a registry on the node's loopback, say).
    """
    if source.startswith(REGISTRY_PREFIX):
        with tempfile.TemporaryDirectory(prefix="bootseer-pull-") as tmp:
            yield _from_registry(source, Path(tmp) / "oci", insecure)
    elif source.startswith(DAEMON_PREFIX):
        with tempfile.TemporaryDirectory(prefix="bootseer-pull-") as tmp:
            yield _from_engine(source[len(DAEMON_PREFIX):], Path(tmp) / "image.tar")
    else:
        path = Path(source)
        if not path.exists():
            raise ImageSourceError(
                f"{source}: no such file or directory (an OCI layout or a `docker save` "
                f"archive; for a registry use {REGISTRY_PREFIX}REPO:TAG, for the Docker "
                f"engine {DAEMON_PREFIX}REPO:TAG)")
        yield path


def _from_registry(source: str, layout: Path, insecure: bool) -> Path:
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        raise ImageSourceError("pulling from a registry needs skopeo (apt-get install skopeo)")
    cmd = [skopeo, "copy", "--quiet", *(["--src-tls-verify=false"] if insecure else []),
           source, f"oci:{layout}:image"]
    result = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise ImageSourceError(f"skopeo could not copy {source}: {result.stderr.strip()}")
    return layout


def _from_engine(ref: str, archive: Path) -> Path:
    import docker
    import docker.errors

    try:
        client = docker.from_env()
        image = client.images.get(ref)
        with open(archive, "wb") as out:
            for chunk in image.save(named=True):
                out.write(chunk)
    except docker.errors.ImageNotFound as exc:
        raise ImageSourceError(f"the Docker engine has no image {ref}") from exc
    except docker.errors.DockerException as exc:
        raise ImageSourceError(f"cannot export {ref} from the Docker engine: {exc}") from exc
    return archive

"""Build and cache libhdfs.so, the JNI shim hdfs:// stores load.

Hadoop ships libhdfs.so in its binary tarball, which no registry carries; the PyPI sdist of
pydoop 2.0.0 does carry the libhdfs C sources (src/libhdfs), so we compile those against
the installed JDK's jni.h and link -ljvm. Done once per (JDK, sources) and cached.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from bootseer.filelock import file_lock

from .downloads import download_sdist
from .paths import cache_dir, java_home

__all__ = ["LibhdfsError", "ensure_libhdfs", "PYDOOP_VERSION"]

log = logging.getLogger(__name__)

PYDOOP_VERSION = "2.0.0"
SDIST_NAME = f"pydoop-{PYDOOP_VERSION}.tar.gz"
_SOURCES = ("hdfs.c", "jni_helper.c", "exception.c", "common/htable.c",
            "os/posix/mutexes.c", "os/posix/thread.c", "os/posix/thread_local_storage.c")


class LibhdfsError(RuntimeError):
    """libhdfs.so could not be downloaded or compiled."""


def _download_sdist(root: Path) -> Path:
    # pip prepares sdist metadata even for `download`; pydoop's setup.py imports
    # pkg_resources, which setuptools >= 81 no longer has, so pin the build env.
    constraint = root / "downloads" / "pydoop-build-constraints.txt"
    constraint.parent.mkdir(parents=True, exist_ok=True)
    constraint.write_text("setuptools<81\n")
    return download_sdist(f"pydoop=={PYDOOP_VERSION}", SDIST_NAME, root,
                          ["--build-constraint", str(constraint)], LibhdfsError)


def ensure_libhdfs(root: Path | None = None, jdk: Path | None = None) -> Path:
    """Return the directory holding libhdfs.so (what ARROW_LIBHDFS_DIR must point at)."""
    root = root or cache_dir()
    jdk = jdk or java_home()
    key = hashlib.sha256(f"{PYDOOP_VERSION}|{jdk}|{_SOURCES}".encode()).hexdigest()[:12]
    out_dir = root / "libhdfs" / key
    lib = out_dir / "libhdfs.so"
    if lib.is_file():
        return out_dir
    with file_lock(root / ".libhdfs.lock"):
        if lib.is_file():
            return out_dir
        sdist = _download_sdist(root)
        cc = shutil.which("gcc") or shutil.which("cc")
        if not cc:
            raise LibhdfsError("no C compiler (gcc) to build libhdfs.so; apt-get install gcc")
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
            prefix = f"pydoop-{PYDOOP_VERSION}/src/libhdfs/"
            with tarfile.open(sdist, "r:gz") as tar:
                members = [m for m in tar.getmembers()
                           if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
                tar.extractall(tmp, members=members, filter="data")
            src = Path(tmp) / prefix
            cmd = [cc, "-O2", "-fPIC", "-shared", "-o", str(Path(tmp) / "libhdfs.so"),
                   f"-I{src}", f"-I{src / 'include'}", f"-I{src / 'os' / 'posix'}",
                   f"-I{jdk / 'include'}", f"-I{jdk / 'include' / 'linux'}",
                   *[str(src / s) for s in _SOURCES],
                   f"-L{jdk / 'lib' / 'server'}", "-ljvm", "-lpthread",
                   f"-Wl,-rpath,{jdk / 'lib' / 'server'}"]
            log.debug("building libhdfs.so: %s", " ".join(cmd))
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise LibhdfsError(f"compiling libhdfs.so failed:\n{proc.stderr[-4000:]}")
            os.replace(Path(tmp) / "libhdfs.so", lib)
    return out_dir

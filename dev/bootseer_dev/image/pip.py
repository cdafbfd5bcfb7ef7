"""Install Python packages into a Debian root filesystem with the host's pip.

A minbase image with ``python3`` has no pip, so the host's pip (the one running Bootseer)
installs *into* the image: ``pip install --target ROOTFS/usr/local/lib/python3.X/dist-packages
--only-binary=:all: --python-version 3.X``. Debian's ``python3`` reads that directory (it is
``site.getsitepackages()``' first entry there), so the packages import as if a Dockerfile
had run ``pip install`` in the image. Wheels only: nothing is compiled, and the wheels are
picked for the image's Python version. ``--find-links`` directories add local wheels (the
CPU torch build is one) to what the package index offers.

pip compiles ``.pyc`` files with the host interpreter, as ``pip install`` in a ``RUN`` step
would: same major.minor as the image, so the image's Python uses them. Console scripts
land in ``/usr/local/bin`` with a ``#!/usr/bin/python3`` line instead of the host's
interpreter. The platform tags are the host's: the builder builds on and for the host's
Debian, as the rest of :mod:`bootseer_dev.image` does.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from .debian import BuildError, _run

log = logging.getLogger(__name__)

SHEBANG = b"#!/usr/bin/python3"


def image_python_version(rootfs: Path) -> str:
    """``"3.11"``: the version of the image's ``/usr/bin/python3`` (from its symlink, or the
    one ``/usr/lib/python3.X`` directory)."""
    link = rootfs / "usr" / "bin" / "python3"
    if link.is_symlink():
        match = re.fullmatch(r"(?:.*/)?python(3\.\d+)", os.readlink(link))
        if match:
            return match.group(1)
    found = sorted(p.name[len("python"):] for p in (rootfs / "usr" / "lib").glob("python3.*")
                   if re.fullmatch(r"python3\.\d+", p.name))
    if len(found) != 1:
        raise BuildError(f"cannot tell the Python version of {rootfs}: no /usr/bin/python3 "
                         f"symlink and {len(found)} /usr/lib/python3.X directories")
    return found[0]


def site_dir(rootfs: Path, version: str) -> Path:
    return rootfs / "usr" / "local" / "lib" / f"python{version}" / "dist-packages"


def pip_install(rootfs: Path, requirements: Sequence[str],
                find_links: Sequence[str] = ()) -> list[str]:
    """Install ``requirements`` (and their dependencies) into the image at ``rootfs``;
    return the distributions installed, ``name-version`` each, sorted."""
    version = image_python_version(rootfs)
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    if host != version:
        log.warning("host Python is %s, the image's %s: pip picks wheels for %s, but the "
                    ".pyc files it compiles are for %s and will be ignored", host, version,
                    version, host)
    target = site_dir(rootfs, version)
    target.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "--target", str(target),
           "--only-binary=:all:", "--python-version", version, "--no-warn-script-location",
           "--disable-pip-version-check", "--progress-bar", "off"]
    for links in find_links:
        cmd += ["--find-links", links]
    _run([*cmd, *requirements], f"pip install {' '.join(requirements)}", timeout=3600)
    _move_scripts(target / "bin", rootfs / "usr" / "local" / "bin")
    return sorted(p.name.removesuffix(".dist-info") for p in target.glob("*.dist-info"))


def _move_scripts(scripts: Path, bin_dir: Path) -> None:
    """pip ``--target`` leaves console scripts in ``TARGET/bin`` with the host interpreter
    in their ``#!`` line; move them where ``pip install`` puts them, for the image's."""
    if not scripts.is_dir():
        return
    bin_dir.mkdir(parents=True, exist_ok=True)
    for script in sorted(scripts.iterdir()):
        dest = bin_dir / script.name
        if script.is_file() and not script.is_symlink():
            data = script.read_bytes()
            if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
                data = SHEBANG + data[data.index(b"\n"):] if b"\n" in data else SHEBANG
                script.write_bytes(data)
        os.replace(script, dest)
    shutil.rmtree(scripts)

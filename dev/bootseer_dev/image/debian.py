"""Build Debian root filesystems from the Debian archive: debootstrap, then apt in a chroot.

The archive is the one the machine's own apt uses (:func:`find_mirror` reads
``/etc/apt/sources.list`` and ``/etc/apt/sources.list.d/*.{list,sources}``), so a machine
that can install Debian packages can build images, with no registry involved. Both steps
need root (debootstrap makes device nodes and chroots).

What the build leaves out of the image, as Debian's official container images do: the
downloaded ``.deb`` files and apt's package lists (``apt-get clean``,
``/var/lib/apt/lists/*``), and the host's ``/etc/resolv.conf`` (debootstrap copies it in;
a runtime provides its own). ``/etc/hostname`` is reset to ``localhost`` for the same
reason.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from bootseer.errors import BootseerError

log = logging.getLogger(__name__)

DEFAULT_MIRROR = "http://deb.debian.org/debian"
SOURCES_LIST = Path("/etc/apt/sources.list")
SOURCES_DIR = Path("/etc/apt/sources.list.d")
# A clean environment for commands run in the chroot: no host PATH, locale or venv.
CHROOT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C", "HOME": "/root"}
_SCHEMES = ("http://", "https://", "ftp://", "file:")


class BuildError(BootseerError):
    """Building a root filesystem or an image failed; the message carries the tool's output."""


def default_sources() -> list[Path]:
    files = [SOURCES_LIST] if SOURCES_LIST.is_file() else []
    if SOURCES_DIR.is_dir():
        files += sorted(p for p in SOURCES_DIR.iterdir()
                        if p.suffix in (".list", ".sources") and p.is_file())
    return files


def find_mirror(suite: str = "bookworm", sources: Iterable[Path] | None = None) -> str:
    """The archive URL the machine's apt uses for ``suite`` (first ``deb`` entry that names
    it), else :data:`DEFAULT_MIRROR`. Security and ``-updates`` suites do not count: they
    are other archives or partial suites."""
    for path in default_sources() if sources is None else sources:
        try:
            text = path.read_text(errors="replace")
        except OSError as e:
            log.warning("cannot read %s: %s", path, e)
            continue
        entries = _deb822_entries(text) if path.suffix == ".sources" else _one_line_entries(text)
        for types, uris, suites in entries:
            if "deb" in types and suite in suites:
                for uri in uris:
                    if uri.startswith(_SCHEMES):
                        return uri.rstrip("/")
    log.info("no apt source for %s found; using %s", suite, DEFAULT_MIRROR)
    return DEFAULT_MIRROR


Entry = tuple[list[str], list[str], list[str]]  # types, uris, suites


def _one_line_entries(text: str) -> list[Entry]:
    """``deb [option=value ...] URI SUITE [COMPONENT ...]`` lines."""
    entries = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.count("[") == 1 and "]" in line:  # drop the options
            line = line[:line.index("[")] + line[line.index("]") + 1:]
        words = line.split()
        if len(words) >= 3:
            entries.append(([words[0]], [words[1]], [words[2]]))
    return entries


def _deb822_entries(text: str) -> list[Entry]:
    """Stanzas of ``Types:``/``URIs:``/``Suites:`` fields (``Enabled: no`` skipped)."""
    entries = []
    for stanza in _stanzas(text):
        if stanza.get("enabled", "yes").strip().lower() == "no":
            continue
        entries.append((stanza.get("types", "").split(), stanza.get("uris", "").split(),
                        stanza.get("suites", "").split()))
    return entries


def _stanzas(text: str) -> list[dict[str, str]]:
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    field = None
    for raw in text.splitlines() + [""]:
        if raw.lstrip().startswith("#"):
            continue
        if not raw.strip():
            if current:
                stanzas.append(current)
            current, field = {}, None
        elif raw[0] in " \t" and field is not None:
            current[field] += " " + raw.strip()
        elif ":" in raw:
            field, value = raw.split(":", 1)
            field = field.strip().lower()
            current[field] = value.strip()
    return stanzas


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise BuildError(f"{what} needs root (it makes device nodes and chroots)")


def _tool(name: str) -> str:
    path = shutil.which(name) or next(
        (str(p) for d in ("/usr/sbin", "/sbin") if (p := Path(d) / name).is_file()), None)
    if path is None:
        raise BuildError(f"{name} is not installed; run scripts/install-system-deps.sh "
                         f"(or apt-get install {name})")
    return path


def _run(cmd: Sequence[str], what: str, *, env: dict[str, str] | None = None,
         timeout: float = 1800) -> None:
    log.info("running %s", " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env,
                              stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"{what} timed out after {timeout:.0f} s: {' '.join(cmd)}") from e
    if proc.returncode != 0:
        raise BuildError(f"{what} failed (rc={proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")


def debootstrap(rootfs: Path, *, suite: str, variant: str, mirror: str) -> None:
    """``debootstrap --variant=VARIANT SUITE ROOTFS MIRROR`` and the clean-up above."""
    _require_root("debootstrap")
    cmd = [_tool("debootstrap"), f"--variant={variant}", suite, str(rootfs), mirror]
    try:
        _run(cmd, "debootstrap", env=dict(CHROOT_ENV) | _proxy_env())
    except BuildError as e:
        log_file = rootfs / "debootstrap" / "debootstrap.log"
        tail = log_file.read_text(errors="replace")[-3000:] if log_file.is_file() else ""
        raise BuildError(f"{e}\n--- {log_file} ---\n{tail}" if tail else str(e)) from None
    clean(rootfs)


def apt_install(rootfs: Path, packages: Sequence[str]) -> None:
    """``apt-get update && apt-get install --no-install-recommends PACKAGES`` in a chroot,
    then the clean-up above (what a well-written Dockerfile ``RUN`` step does)."""
    _require_root("apt-get in a chroot")
    resolv = rootfs / "etc" / "resolv.conf"
    policy = rootfs / "usr" / "sbin" / "policy-rc.d"
    chroot = _tool("chroot")
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    shutil.copyfile("/etc/resolv.conf", resolv)  # apt needs DNS inside the chroot
    policy.write_text("#!/bin/sh\n# no daemons start while building an image\nexit 101\n")
    policy.chmod(0o755)
    env = dict(CHROOT_ENV) | _proxy_env()
    try:
        _run([chroot, str(rootfs), "apt-get", "update", "-q"], "apt-get update", env=env)
        _run([chroot, str(rootfs), "apt-get", "install", "-y", "-q", "--no-install-recommends",
              *packages], f"apt-get install {' '.join(packages)}", env=env)
    finally:
        policy.unlink(missing_ok=True)
        resolv.unlink(missing_ok=True)
    clean(rootfs)


def clean(rootfs: Path) -> None:
    """Drop what an image should not carry: package caches, apt lists, the host's DNS."""
    doomed = [*rootfs.glob("var/cache/apt/archives/*.deb"),
              *rootfs.glob("var/cache/apt/archives/partial/*"),
              *rootfs.glob("var/cache/apt/*.bin"),
              *rootfs.glob("var/lib/apt/lists/partial/*"),
              *(p for p in rootfs.glob("var/lib/apt/lists/*")
                if p.name not in ("lock", "partial"))]
    for path in doomed:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    (rootfs / "etc" / "resolv.conf").unlink(missing_ok=True)
    hostname = rootfs / "etc" / "hostname"
    if hostname.is_symlink() or (hostname.exists() and hostname.read_text() != "localhost\n"):
        hostname.unlink()
        hostname.write_text("localhost\n")


def _proxy_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k.lower() in ("http_proxy", "https_proxy", "no_proxy")}

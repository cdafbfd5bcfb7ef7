"""Environment snapshots as a user makes them: ``bootseer`` against a ``file://`` store (a real
process), a wheel pip installs with no index, a venv published by ``env run``, and the state
of a tree that a restore must reproduce."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path


def bootseer(*args: str, store: Path, check: bool = True, env: dict[str, str] | None = None,
             **kw) -> subprocess.CompletedProcess:
    environ = {**os.environ, "BOOTSEER_STORE": f"file://{store}", **(env or {})}
    result = subprocess.run([sys.executable, "-m", "bootseer", *args], capture_output=True,
                            text=True, env=environ, timeout=60, **kw)
    if check and result.returncode != 0:
        raise AssertionError(f"bootseer {args}: {result.stderr}")
    return result


def tiny_wheel(directory: Path) -> Path:
    """A pure-Python wheel, written by hand: pip installs it with no index and no build."""
    wheel = directory / "tiny-1.0-py3-none-any.whl"
    files = {"tiny/__init__.py": "ANSWER = 42\n",
             "tiny-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n",
             "tiny-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
                                         "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in files) + "tiny-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in {**files, "tiny-1.0.dist-info/RECORD": record}.items():
            zf.writestr(name, text)
    return wheel


def tree_state(root: Path) -> dict[str, tuple]:
    """Everything a restore must reproduce: type, mode, mtime, size, content, link target,
    hard link group (as the sorted names sharing the inode)."""
    inodes: dict[int, list[str]] = {}
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in ["", *dirnames, *filenames]:
            path = os.path.join(dirpath, name) if name else dirpath
            if not name and dirpath != str(root):
                continue
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            kind = st.st_mode >> 12
            content = link = None
            if os.path.islink(path):
                link = os.readlink(path)
            elif os.path.isfile(path):
                content = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                inodes.setdefault(st.st_ino, []).append(rel)
            state[rel] = [kind, st.st_mode & 0o7777, st.st_mtime_ns, st.st_size, content, link,
                          st.st_ino]
    for rel, row in state.items():
        row[6] = tuple(sorted(inodes.get(row[6], []))) if row[4] else None
        state[rel] = tuple(row)
    return state


def published_venv(tmp_path: Path) -> tuple[str, Path, tuple[str, ...]]:
    store, venv = tmp_path / "store", tmp_path / "node" / "venv"
    wheel = tiny_wheel(tmp_path)
    install = (f"{sys.executable} -m venv --without-pip {venv} && "
               f"{sys.executable} -m pip --python {venv}/bin/python install -q --no-index "
               f"--disable-pip-version-check --no-cache-dir {wheel}")
    run = ("env", "run", "--path", str(venv), "--", "sh", "-c", install)
    key = bootseer(*run, store=store).stdout.strip()
    return key, venv, run

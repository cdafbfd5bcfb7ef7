"""Environment snapshots as a user makes them: ``bootseer`` against a ``file://`` store (a real
process), a wheel pip installs with no index, a venv published by ``env run``, the state
of a tree that a restore must reproduce, and a command that makes every kind of change
(:data:`MUTATE`) over a base (:func:`make_base`)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path


def bootseer(*args: str, store: Path, check: bool = True, env: dict[str, str] | None = None,
             **kw) -> subprocess.CompletedProcess:
    # The node's caches beside the store (not the machine's): a restore as root leaves
    # its unpacked tree there.
    environ = {**os.environ, "BOOTSEER_STORE": f"file://{store}",
               "BOOTSEER_CACHE_DIR": str(store.parent / "node-cache"), **(env or {})}
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


T0 = 1_600_000_000_123_456_789  # base mtimes, in ns

# Every kind of change, made by a real process: argv[1:] are the target directories.
MUTATE = r"""
import os, sys
for root in sys.argv[1:]:
    j = lambda *p: os.path.join(root, *p)
    open(j("new.txt"), "w").write("new\n")
    open(j("empty"), "w").close()
    open(j("keep", "modified.txt"), "w").write("modified content\n")
    with open(j("untouched", "in-place.txt"), "r+") as f:  # its directory does not change
        f.write("changed in place\n")
    os.chmod(j("keep", "mode.txt"), 0o600)
    os.utime(j("keep", "touched.txt"), ns=(1_700_000_000_000_000_001,) * 2)
    os.unlink(j("gone.txt"))
    os.unlink(j("gone-tree", "a", "f")); os.rmdir(j("gone-tree", "a")); os.rmdir(j("gone-tree"))
    os.makedirs(j("pkg", "sub")); open(j("pkg", "sub", "mod.py"), "w").write("X = 42\n")
    os.symlink("../keep/same.txt", j("pkg", "link"))
    os.unlink(j("old-link")); os.symlink("/elsewhere/abs", j("old-link"))
    os.link(j("new.txt"), j("pkg", "new-hardlink"))
    os.link(j("keep", "same.txt"), j("keep", "same-hardlink"))
    os.unlink(j("file-to-dir")); os.mkdir(j("file-to-dir"))
    open(j("file-to-dir", "x"), "w").write("x")
    os.unlink(j("dir-to-link", "f")); os.rmdir(j("dir-to-link"))
    os.symlink("keep", j("dir-to-link"))
    open(j("big.bin"), "wb").write(open(os.environ["BIG_FILE"], "rb").read())
    os.mkdir(j("ro")); open(j("ro", "f"), "w").write("ro\n"); os.chmod(j("ro"), 0o555)
"""


def make_base(root: Path) -> None:
    """The state before the command, identical (mtimes included) every time it is made."""
    for rel, data in {"keep/modified.txt": "original\n", "keep/mode.txt": "m\n",
                      "keep/touched.txt": "t\n", "keep/same.txt": "same\n", "gone.txt": "g\n",
                      "gone-tree/a/f": "f\n", "file-to-dir": "fd\n",
                      "dir-to-link/f": "dl\n", "untouched/in-place.txt": "as it was\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(data)
    os.symlink("keep/same.txt", root / "old-link")
    for path in sorted(root.rglob("*"), reverse=True) + [root]:
        os.utime(path, ns=(T0, T0), follow_symlinks=False)


def remove_target(path: Path) -> None:
    """``rm -rf`` a restored target, unmounting first the environment a restore as root
    mounted there (a fresh node, as far as the target goes)."""
    from bootseer.mounts import overlay_at, unmount

    if overlay_at(path) is not None:
        unmount(path)
    subprocess.run(["rm", "-rf", str(path)], check=True)


def based_targets(root: Path, monkeypatch) -> tuple:
    """A ``file://`` store under ``root`` and two targets made with :func:`make_base`
    (``BIG_FILE``, which :data:`MUTATE` copies, set for the test): (blobs, targets)."""
    from bootseer.store import BlobStore, open_store

    big = root / "big.src"
    big.write_bytes(os.urandom(3 << 20))  # spans several shards of 1 MiB
    monkeypatch.setenv("BIG_FILE", str(big))
    blobs = BlobStore(open_store(f"file://{root / 'store'}"))
    targets = [root / "node" / "a", root / "node" / "b"]
    for target in targets:
        target.mkdir(parents=True)
        make_base(target)
    return blobs, targets


def capture(blobs, targets: list[Path], key: str = "k1"):
    """Run :data:`MUTATE` on ``targets`` and publish what it changed as ``key``: its
    manifest (1 MiB shards)."""
    from bootseer.snapshot.config import SnapshotOptions
    from bootseer.snapshot.run import capture_command

    outcome = capture_command(blobs, key, [sys.executable, "-c", MUTATE, *map(str, targets)],
                              targets, environ=os.environ,
                              options=SnapshotOptions(shard_size=1 << 20, concurrency=2))
    assert outcome.exit_code == 0 and outcome.published
    return outcome.manifest


def reset(targets: list[Path]) -> None:
    """The targets back to their base."""
    for target in targets:
        subprocess.run(["chmod", "-R", "u+w", str(target)], check=True)
        subprocess.run(["rm", "-rf", str(target)], check=True)
        target.mkdir()
        make_base(target)

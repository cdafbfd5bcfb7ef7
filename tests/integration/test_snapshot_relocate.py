"""Relocation: a real venv captured at one prefix works restored at another (``--relocate``);
without it a restore elsewhere is refused and writes nothing; paths are replaced only as
whole path prefixes; binary files are left as they were captured, with a warning."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.snapshots import bootseer

from bootseer.errors import BootseerError
from bootseer.snapshot.config import SnapshotOptions
from bootseer.snapshot.relocate import Relocation, is_known_text
from bootseer.snapshot.restore import load_manifest, restore
from bootseer.snapshot.run import capture_command
from bootseer.store import BlobStore, open_store

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


def script_wheel(directory: Path) -> Path:
    """A pure-Python wheel with a console script, written by hand (no index, no build)."""
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / "tiny-1.0-py3-none-any.whl"
    files = {"tiny/__init__.py": "def main():\n    import sys\n    print('tiny', sys.prefix)\n",
             "tiny-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n",
             "tiny-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
                                         "Root-Is-Purelib: true\nTag: py3-none-any\n",
             "tiny-1.0.dist-info/entry_points.txt": "[console_scripts]\ntiny-hello = tiny:main\n"}
    record = "".join(f"{name},,\n" for name in files) + "tiny-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in {**files, "tiny-1.0.dist-info/RECORD": record}.items():
            zf.writestr(name, text)
    return wheel


def test_a_venv_restored_elsewhere_with_relocate_works_there(tmp_path: Path) -> None:
    store, a, b = tmp_path / "store", tmp_path / "a" / "venv", tmp_path / "b" / "venv"
    wheel = script_wheel(tmp_path / "wheels")
    # a venv, a console script, and a .pth naming a directory of the venv by absolute path
    install = (f"{sys.executable} -m venv --without-pip {a} && "
               f"{sys.executable} -m pip --python {a}/bin/python install -q --no-index "
               f"--disable-pip-version-check --no-cache-dir {wheel} && "
               f"mkdir {a}/extra && echo 'WHERE = __file__' > {a}/extra/extramod.py && "
               f"echo {a}/extra > {a}/{SITE}/extra.pth")
    bootseer("env", "snapshot", "--key", "reloc", "--path", str(a), "--", "sh", "-c", install,
             store=store)
    subprocess.run(["rm", "-rf", str(tmp_path / "a")], check=True)  # nothing may point back

    refused = bootseer("env", "restore", "reloc", "--path", str(b), store=store, check=False)
    assert refused.returncode == 1 and "--relocate" in refused.stderr, refused.stderr
    assert f"{a} -> {b}" in refused.stderr
    miscounted = bootseer("env", "restore", "reloc", "--path", str(b), "--path",
                          str(tmp_path / "c"), "--relocate", store=store, check=False)
    assert miscounted.returncode == 1 and "one --path per target" in miscounted.stderr
    assert sorted(os.listdir(tmp_path)) == ["store", "wheels"]  # nothing was written

    done = bootseer("env", "restore", "reloc", "--path", str(b), "--relocate", store=store)
    assert f"relocated from {a}" in done.stderr
    hello = subprocess.run([b / "bin" / "tiny-hello"], capture_output=True, text=True,
                           check=True)
    assert hello.stdout == f"tiny {b}\n"
    out = subprocess.run([b / "bin" / "python", "-c",
                          "import sys, tiny, extramod; print(sys.prefix, extramod.WHERE)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout == f"{b} {b}/extra/extramod.py\n"
    grep = subprocess.run(["grep", "-rIl", str(tmp_path / "a"), str(b)], capture_output=True,
                          text=True)
    assert grep.returncode == 1 and grep.stdout == "", grep.stdout  # no text file names /a
    assert f'VIRTUAL_ENV="{b}"' in (b / "bin" / "activate").read_text()

    # every rewritten file keeps the manifest's mode and mtime
    manifest = load_manifest(BlobStore(open_store(f"file://{store}")), "reloc")
    for entry in manifest.entries:
        if entry.kind == "file":
            st = os.lstat(b / entry.path)
            assert (st.st_mode & 0o7777, st.st_mtime_ns) == (entry.mode, entry.mtime_ns)


def test_paths_are_replaced_only_as_whole_path_prefixes() -> None:
    moves = Relocation(("/x/venv", "/x/venv2"), ("/y/env", "/y/venv"))
    text = (b"#!/x/venv/bin/python\n/x/venv\n/x/venv2/lib\n/x/venv-old /x/venv.bak "
            b"/x/venvX /a/x/venv/lib file:///x/venv/w.whl '/x/venv' \"/x/venv2\"\n")
    assert moves.replace(text) == (
        b"#!/y/env/bin/python\n/y/env\n/y/venv/lib\n/x/venv-old /x/venv.bak "
        b"/x/venvX /a/x/venv/lib file:///y/env/w.whl '/y/env' \"/y/venv\"\n", 6)
    assert moves.link("/x/venv/bin/python3") == "/y/env/bin/python3"
    assert moves.link("/x/venv2") == "/y/venv"
    assert moves.link("/x/venv22/a") == "/x/venv22/a" and moves.link("python3") == "python3"
    assert moves.link("/usr/x/venv") == "/usr/x/venv"
    for rel in ("pyvenv.cfg", "bin/activate", "bin/activate.fish", f"{SITE}/a.pth",
                f"{SITE}/__editable___tiny_1_0_finder.py", f"{SITE}/tiny.egg-link",
                f"{SITE}/tiny-1.0.dist-info/RECORD", f"{SITE}/t.dist-info/direct_url.json"):
        assert is_known_text(rel), rel
    assert not any(map(is_known_text, ("bin/python", f"{SITE}/tiny/__init__.py", "x.so")))


MAKE = r"""
import os, sys
venv, venv2 = sys.argv[1:]
def write(path, data, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").write(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)
write(f"{venv}/pyvenv.cfg", f"command = p -m venv {venv}\nsibling = {venv2}/lib\n"
                            f"longer = {venv}-old/x\nnested = /elsewhere{venv}\n")
write(f"{venv}/bin/script", f"#!{venv}/bin/python\nprint('{venv2}')\n", 0o750)
write(f"{venv}/lib/data.so", b"\x7fELF\0\0RPATH=" + venv.encode() + b"/lib\0")
write(f"{venv}/notes.txt", f"see {venv}/notes\n")
write(f"{venv}/m/__pycache__/m.cpython-311.pyc", b"\0\0" + venv.encode() + b"/m/m.py")
write(f"{venv2}/site/x.pth", f"{venv}/site\n{venv2}/site\n")
os.symlink(f"{venv}/bin/script", f"{venv}/abs-link")
os.symlink("bin/script", f"{venv}/rel-link")
os.symlink(f"{venv2}x", f"{venv2}/sibling-link")
os.utime(f"{venv}/bin/script", ns=(1_600_000_000_000_000_007,) * 2)
"""


def test_two_targets_relocate_together_and_binaries_are_left_as_captured(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blobs = BlobStore(open_store(f"file://{tmp_path / 'store'}"))
    old = (tmp_path / "x" / "venv", tmp_path / "x" / "venv2")
    new = (str(tmp_path / "y" / "env"), str(tmp_path / "y" / "venv"))
    outcome = capture_command(blobs, "two", [sys.executable, "-c", MAKE, *map(str, old)],
                              list(old), environ=os.environ,
                              options=SnapshotOptions(bytecode=False))
    manifest = outcome.manifest
    assert manifest is not None and outcome.published
    with pytest.raises(BootseerError, match="--relocate"):
        restore(blobs, manifest, targets=new)
    with pytest.raises(BootseerError, match="one --path per target"):
        restore(blobs, manifest, targets=new[:1], relocate=True)
    assert not (tmp_path / "y").exists()

    with caplog.at_level(logging.WARNING, logger="bootseer.snapshot.relocate"):
        result = restore(blobs, manifest, targets=new, relocate=True)
    assert result.targets == new and result.relocated == 3
    env, venv = Path(new[0]), Path(new[1])
    o = str(old[0])
    assert (env / "pyvenv.cfg").read_text() == (
        f"command = p -m venv {env}\nsibling = {venv}/lib\nlonger = {o}-old/x\n"
        f"nested = /elsewhere{o}\n")
    assert (env / "bin" / "script").read_text() == f"#!{env}/bin/python\nprint('{venv}')\n"
    st = os.lstat(env / "bin" / "script")
    assert (st.st_mode & 0o7777, st.st_mtime_ns) == (0o750, 1_600_000_000_000_000_007)
    assert (venv / "site" / "x.pth").read_text() == f"{env}/site\n{venv}/site\n"
    assert os.readlink(env / "abs-link") == f"{env}/bin/script"
    assert os.readlink(env / "rel-link") == "bin/script"
    assert os.readlink(venv / "sibling-link") == f"{old[1]}x"
    # binaries, bytecode and other text files: byte for byte as captured
    assert (env / "lib" / "data.so").read_bytes() == b"\x7fELF\0\0RPATH=" + o.encode() + b"/lib\0"
    assert (env / "notes.txt").read_text() == f"see {o}/notes\n"
    assert (env / "m/__pycache__/m.cpython-311.pyc").read_bytes().endswith(o.encode() + b"/m/m.py")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "1 binary file(s)" in warnings[0] and "lib/data.so" in warnings[0]
    assert "1 other text file(s)" in warnings[0] and "notes.txt" in warnings[0]
    assert not [p for p in os.listdir(tmp_path / "y") if "-new" in p or "-old" in p]

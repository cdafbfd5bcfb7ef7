"""What installing Bootseer puts in site-packages: one import name, no development tooling."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_one_import_name_and_no_dev_tooling(tmp_path: Path) -> None:
    """The user's folders (agents/, prefetch/, snapshot/, stripedfs/) ship as subpackages of
    bootseer, as files; nothing else claims a top-level name (PyPI's `agents` would
    clash); bootseer_dev, the tests' HDFS cluster and image builder, does not ship. A
    fresh venv with the wheel imports bootseer.agents and not agents."""
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("bootseer-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = wheel.name.split("-py")[0] + ".dist-info"
    data = wheel.name.split("-py")[0] + ".data"  # the scripts that are not Python's
    assert {n.split("/")[0] for n in names} == {"bootseer", dist_info, data}
    assert [n for n in names if n.startswith(data)] == [f"{data}/scripts/bootseer-runtime"]
    for module in ("agents/agent.py", "prefetch/lazyimage.py", "snapshot/restore.py",
                   "stripedfs/reader.py", "nodecache.py", "store/local.py", "cli/__init__.py"):
        assert f"bootseer/{module}" in names
    assert not [n for n in names if "bootseer_dev" in n or "devcluster" in n]
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    installed = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True).stdout.strip()
    added = {p.name for p in Path(site).iterdir()} - {"pip", "_distutils_hack", "setuptools",
                                                       "pkg_resources", "__pycache__",
                                                       "distutils-precedence.pth"}
    assert {a for a in added if not a.startswith(("pip-", "setuptools-"))} == \
        {"bootseer", dist_info}
    probe = ("import importlib.util as u\n"
             "print(u.find_spec('agents'), u.find_spec('bootseer.agents') is not None)")
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.split() == ["None", "True"], out.stderr
    # What engines call, beside the shim it hands create and run to.
    for script in ("bootseer-runtime", "bootseer-runtime-shim", "bootseer-hook"):
        assert os.access(env / "bin" / script, os.X_OK), script

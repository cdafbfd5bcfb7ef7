"""``make bench-env``: a Python environment — pip vs uv vs ``bootseer env run`` restore.

The requirement set is real (preset ``full``: numpy, scipy, pandas, pyarrow, scikit-learn,
matplotlib and torch 2.13.0 CPU, every dependency pinned, 29 wheels). torch comes from the
wheel on disk (``--torch-wheel``); everything else is ``pip download --only-binary=:all:``
once into ``~/.cache/bootseer/wheels/<hash of the requirements>``, reused across runs. The
wheels are served on loopback by ``python -m http.server`` (a ``--find-links`` page), and
the snapshot store is a local HDFS cluster (1 DataNode, replication 1). Both links are
capped with tc htb on ``lo`` at ``--link-mbps`` MB/s each (the index's port and the
DataNode's transfer port, each its own class); the kernel has no ``sch_netem``, so no
latency is added (loopback round trips are ~0.1 ms).

Every timed run builds the environment at the same path ``V`` from nothing, with a dropped
page cache, timed from spawning the first process to the last one's exit:

* ``pip_s``: ``python -m venv V`` then ``V/bin/pip install --no-cache-dir --no-index
  --find-links http://127.0.0.1:PORT/ -r requirements.txt``;
* ``uv_s``: ``python -m venv V`` then ``uv pip install --python V/bin/python --no-index
  --find-links ... -r requirements.txt`` with an empty ``UV_CACHE_DIR`` (uv's default: no
  bytecode); ``uv_bytecode_s``: the same with ``--compile-bytecode``, which gives what pip
  and the snapshot give (``.pyc`` files);
* ``restore_s``: ``bootseer --store hdfs://... env run --path V --key-file requirements.txt
  -- sh -c "python -m venv V && V/bin/pip install ... && touch MARKER"`` with an empty
  ``BOOTSEER_CACHE_DIR``; the snapshot was published once before (``publish_s``: the same
  command the first time, which runs it and publishes the venv). Each run is checked to
  have restored (the CLI says "the command was not run", and MARKER stays absent);
* ``raw_extract_s``: ``tar -xf`` of an uncompressed tar of the restored venv, from local
  disk into a fresh directory;
* V, raw_extract's directory and the node caches are on a fresh journaled ext4 the benchmark makes
  (``--scratch-gib``, a loop device): on the root file system of these machines (no
  journal) creating files slows down with every tree deleted before;
* ``limit_s``: the physical floor, max(raw_extract_s, snapshot_bytes / link rate):
  transfer and extraction overlapped.

After each pip, uv and restore run, ``V/bin/python -c "import numpy, scipy, ..."`` must
work (untimed). Then, untimed, a breakdown of the restore (``breakdown``): the shards
fetched alone over the capped link (4 at once, as the restore does); decompressed alone
from memory (4 threads), and on one thread with tarfile's stream parsing or with sha256;
the CLI's start alone and ``env show`` (CLI + HDFS connection + manifest); and
``env restore`` from a ``file://`` store on local disk (no network) at
snapshot.concurrency 4, 1, 2, 8; and the same shards unpacked in C alone (``C_EXTRACT``:
zstd into GNU tar, no Python per file, no checks).
CPU seconds and context switches of every timed process are in ``details``.

Medians of ``--runs`` runs, with the machine's CPU busy fraction per case. Goals:
``restore_vs_pip <= 0.1``, ``restore_vs_uv <= 0.5``, ``restore_vs_uv_bytecode <= 0.35`` and
``restore_vs_limit <= 1.2``. ``bounds`` says what stands between a missed goal and the
restore: the best ``restore_vs_uv_bytecode`` the link allows, the time the timed restore
spends outside ``restore()``, and the restore's CPU spread over the cores. Writes
``bench-results/env.json``; ``make bench-env-cuda`` (``--requirements cuda``: torch
2.14.1's CUDA build, ~5.5 GB) writes ``bench-results/env-cuda.json``. Develop with
``--requirements small --runs 1`` (numpy only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import resource
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import (
    CappedCluster,
    Recording,
    RunFailed,
    busy_fraction,
    cpu_times,
    drop_page_cache,
    figure,
    median_of,
    scratch_filesystem,
    select_cases,
)

from bootseer.mounts import overlay_at, unmount
from bootseer_dev.cluster import parse_link

log = logging.getLogger("bench-env")
#: The work directory's mount of a fresh ext4 (benchlib.scratch_filesystem) that holds the
#: trees the cases write and time: the venv, raw_extract's copy and the node caches (a
#: restore as root unpacks the snapshot there and mounts it).
SCRATCH = "fs"
#: What `env run` says when it restored (or mounted) instead of running the command.
RESTORED = re.compile(r"(?P<how>restored|mounted the node's tree of) snapshot \S+: "
                      r"(?P<entries>\d+) entries, .* from (?P<shards>\d+) shards in "
                      r"(?P<seconds>[\d.]+) s; the command was not run")
HERE = Path(__file__).resolve().parent
#: The snapshot's shards unpacked with no Python per file: each shard decompressed by the
#: zstandard module's C loop into GNU tar, one shard per core at a time. It checks nothing
#: against the manifest and sets no owner or nanosecond mtime, so it is no replacement for
#: a restore: it is what an extractor in C would take for the same bytes and files.
C_EXTRACT = """
import subprocess, sys, zstandard
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
shards, dest, workers = sorted(Path(sys.argv[1]).glob("*.tar.zst")), sys.argv[2], int(sys.argv[3])
def unpack(path):
    tar = subprocess.Popen(["tar", "-x", "-C", dest], stdin=subprocess.PIPE)
    with open(path, "rb") as f:
        zstandard.ZstdDecompressor().copy_stream(f, tar.stdin)
    tar.stdin.close()
    if tar.wait():
        sys.exit(f"tar failed on {path}")
with ThreadPoolExecutor(workers) as pool:
    list(pool.map(unpack, shards))
"""
MB, MIB = 1e6, 1 << 20
LATENCY = "none added: kernel has no sch_netem"
TORCH_WHEEL = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
UV_VERSION = "0.13.8"
CASES = ("pip", "uv", "uv_bytecode", "restore", "raw_extract", "prestaged",
         "prestaged_extract")

# Pinned: current releases with cp311 manylinux wheels, every dependency included (a lock
# file, as a team would commit). torch==2.13.0 matches the local 2.13.0+cpu wheel.
PRESETS: dict[str, dict[str, Any]] = {
    "full": {
        "requirements": [
            "numpy==2.4.6", "scipy==1.17.1", "pandas==3.1.1", "pyarrow==26.0.1",
            "scikit-learn==1.9.1", "matplotlib==3.11.2", "torch==2.13.0",
            # dependencies
            "contourpy==1.3.3", "cycler==0.12.1", "fonttools==4.68.0", "fsspec==2026.9.0",
            "joblib==1.6.0", "cloudpickle==3.1.2", "kiwisolver==1.5.1", "narwhals==2.28.0",
            "networkx==3.6.1", "packaging==26.3", "pillow==13.0.0", "pyparsing==3.3.3",
            "python-dateutil==4.0.0", "setuptools==84.2.1", "sympy==1.14.0",
            "mpmath==1.3.0", "threadpoolctl==3.8.0", "typing_extensions==4.16.0",
            "filelock==4.2.11", "Jinja2==3.1.6", "MarkupSafe==3.0.4", "tzdata==2026.6",
        ],
        "imports": ["numpy", "scipy", "pandas", "pyarrow", "sklearn", "matplotlib", "torch"],
    },
    # A training environment's size: torch 2.14.1's CUDA build with its nvidia-* libraries
    # (the registry's build; ~5.5 GB in the venv), every dependency pinned (31 wheels).
    "cuda": {
        "requirements": [
            "torch==2.14.1", "numpy==2.4.6",
            # dependencies
            "cuda-bindings==13.5.0", "cuda-pathfinder==1.9.1", "cuda-toolkit==13.0.3.0",
            "nvidia-cublas==13.1.1.3", "nvidia-cuda-cupti==13.0.85",
            "nvidia-cuda-nvrtc==13.0.88", "nvidia-cuda-runtime==13.0.96",
            "nvidia-cudnn-cu13==9.24.0.43", "nvidia-cufft==12.0.0.61",
            "nvidia-cufile==1.15.1.6", "nvidia-curand==10.4.0.35",
            "nvidia-cusolver==12.0.4.66", "nvidia-cusparse==12.6.3.3",
            "nvidia-cusparselt-cu13==0.8.1", "nvidia-nccl-cu13==2.30.7",
            "nvidia-nvjitlink==13.5.37", "nvidia-nvshmem-cu13==3.4.5", "nvidia-nvtx==13.0.85",
            "triton==3.8.0", "fsspec==2026.9.0", "networkx==3.6.1", "setuptools==84.2.1",
            "sympy==1.14.0", "mpmath==1.3.0", "typing_extensions==4.16.0",
            "filelock==4.3.1", "Jinja2==3.1.6", "MarkupSafe==3.0.4",
        ],
        "imports": ["numpy", "torch"],
    },
    # Many small files and no torch: JupyterLab with widgets, its language-server extension
    # and python-lsp-server's plugins (pylint, rope, black, ...): 124 wheels, every one pinned.
    "jupyter": {
        "requirements": [
            "ipywidgets==8.1.9", "jupyterlab==4.6.6", "jupyterlab-lsp==5.3.0",
            "nbconvert==7.17.2", "python-lsp-server[all]==1.15.0",
            # dependencies
            "anyio==4.16.0", "argon2-cffi==25.1.0", "argon2-cffi-bindings==26.2.0",
            "arrow==1.4.0", "astroid==4.0.4", "asttokens==3.0.2", "async-lru==2.4.0",
            "attrs==26.1.0", "autopep8==2.0.4", "babel==2.19.0", "beautifulsoup4==4.15.0",
            "black==26.10.1", "bleach==6.4.0", "certifi==2026.10.19.post1", "cffi==2.1.1",
            "charset-normalizer==3.5.3", "click==8.5.1", "comm==0.2.3", "debugpy==1.8.22",
            "defusedxml==0.7.1", "dill==0.4.1", "docstring-to-markdown==0.17",
            "executing==2.3.0", "fastjsonschema==2.22.3", "flake8==7.1.2", "fqdn==1.6.0",
            "h11==0.16.0", "httpcore==1.0.9", "httpx==0.28.1", "idna==3.20",
            "importlib_metadata==10.2.0", "ipykernel==7.4.0", "ipython==9.18.1",
            "ipython_pygments_lexers==1.1.1", "isoduration==20.11.0", "isort==9.0.2",
            "jedi==0.20.1", "Jinja2==3.1.6", "json5==0.17.3", "jsonpointer==3.12",
            "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1",
            "jupyter-events==0.12.1", "jupyter-lsp==2.3.1", "jupyter_builder==1.3.0",
            "jupyter_client==8.10.0", "jupyter_core==5.9.1", "jupyter_server==2.21.1",
            "jupyter_server_terminals==0.5.4", "jupyterlab_pygments==0.3.0",
            "jupyterlab_server==2.28.1", "jupyterlab_widgets==3.0.17", "lark==1.3.1",
            "lazy-importer==0.1.0", "MarkupSafe==3.0.4", "matplotlib-inline==0.2.2",
            "mccabe==0.7.0", "mistune==3.4.0", "mypy_extensions==1.2.0", "nbclient==0.11.0",
            "nbformat==5.11.1", "nest-asyncio2==1.7.4", "notebook_shim==0.2.4",
            "overrides==7.7.0", "packaging==26.4", "pandocfilters==1.5.1", "parso==0.8.7",
            "pathspec==1.1.1", "pexpect==4.9.0", "platformdirs==4.14.8", "pluggy==1.7.0",
            "prometheus_client==0.26.0", "prompt_toolkit==3.0.53", "psutil==7.2.2",
            "ptyprocess==0.7.0", "pure_eval==0.2.4", "pycodestyle==2.12.1",
            "pycparser==3.12", "pydocstyle==6.3.0", "pyflakes==3.2.0", "Pygments==2.21.0",
            "pylint==4.0.10", "python-dateutil==4.0.0", "python-json-logger==4.2.0",
            "python-lsp-jsonrpc==1.1.2", "pytokens==0.4.1", "pytoolconfig==1.3.1",
            "PyYAML==6.0.4", "pyzmq==27.3.0", "referencing==0.37.0", "requests==2.34.2",
            "rfc3339-validator==0.1.4", "rfc3986-validator==0.1.1", "rfc3987-syntax==1.1.0",
            "rope==1.15.2", "rpds-py==2026.9.1", "Send2Trash==2.2.0", "six==1.17.0",
            "snowballstemmer==3.1.1", "soupsieve==4.1.3", "stack-data==0.6.3",
            "terminado==0.18.1", "tinycss2==1.5.1", "tomlkit==0.15.2", "tornado==6.6.1",
            "traitlets==5.16.1", "typing_extensions==4.16.0", "tzdata==2026.6",
            "ujson==6.1.0", "uri-template==1.3.0", "urllib3==2.8.0", "wcwidth==0.9.4",
            "webcolors==25.10.0", "webencodings==0.6.1", "websocket-client==1.9.2",
            "whatthepatch==1.0.7", "widgetsnbextension==4.0.16", "yapf==0.43.0",
            "zipp==4.1.2",
        ],
        "imports": ["jupyterlab", "ipywidgets", "pylsp", "nbconvert", "pylint"],
    },
    "small": {"requirements": ["numpy==2.4.6"], "imports": ["numpy"]},
}


def tree_bytes(root: Path) -> tuple[int, int]:
    """(apparent bytes of regular files, hard links counted once; entries)."""
    seen: set[tuple[int, int]] = set()
    total = entries = 0
    for dirpath, dirnames, filenames in os.walk(root):
        entries += len(dirnames) + len(filenames)
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_mode & 0o170000) == 0o100000 and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total, entries


def du_bytes(path: Path) -> int:
    out = subprocess.run(["du", "-s", "--block-size=1", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[0])


def code_root() -> Path:
    """The code measured: what ``python -m bootseer`` imports (the working directory first,
    as ``-m`` does, else this checkout)."""
    return Path.cwd() if (Path.cwd() / "snapshot" / "restore.py").is_file() else HERE.parent


def base_python() -> str:
    """The interpreter every venv is made with: the one below this venv (pyenv 3.11)."""
    candidate = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return str(candidate if candidate.exists() else Path(sys._base_executable))  # type: ignore[attr-defined]


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RunFailed(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


class CpuMeter:
    """User + system CPU seconds and context switches (voluntary: mostly waits, GIL
    hand-offs among them; involuntary: preempted) of the children reaped meanwhile."""

    def __enter__(self) -> CpuMeter:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._start = (r.ru_utime, r.ru_stime, r.ru_nvcsw, r.ru_nivcsw)
        return self

    def __exit__(self, *exc: object) -> None:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.user, self.sys = r.ru_utime - self._start[0], r.ru_stime - self._start[1]
        self.vcsw, self.ivcsw = r.ru_nvcsw - self._start[2], r.ru_nivcsw - self._start[3]


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.preset = PRESETS[args.requirements]
        self.cap = parse_link(f"{args.link_mbps:g}MB/s")
        self.hdfs = CappedCluster(work, base_port=args.base_port, cap=self.cap,
                                  block_size=args.block_size * MIB)
        self.cluster, self.url = self.hdfs.cluster, self.hdfs.url
        self.recording = Recording("env" if args.requirements == "full"
                                   else f"env-{args.requirements}", code_root())
        self.index_port = args.base_port + 50
        self.index_url = f"http://127.0.0.1:{self.index_port}/"
        self.index_tc = work / "index-tc.json"
        self.index_proc: subprocess.Popen | None = None
        self.python = base_python()
        # V: every case builds it here, on a fresh file system (main), as raw_extract does
        self.venv = work / SCRATCH / "env" / "venv"
        self.marker = work / "command-ran"
        self.requirements = work / "requirements.txt"
        # The machine's pip configuration adds /opt/wheels and local mirrors to every pip
        # call (PIP_FIND_LINKS, pip.conf): the timed installs must see only the index.
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("PIP_", "UV_"))}
        self.env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
        self.details: dict[str, list[dict]] = {}
        self.versions: dict[str, str] = {}

    # -- setup ---------------------------------------------------------------------------------

    def requirements_text(self) -> str:
        return "".join(f"{r}\n" for r in self.preset["requirements"])

    def wheels(self) -> Path:
        """The wheel directory for this requirement set, downloaded once (then reused)."""
        text = self.requirements_text()
        digest = hashlib.sha256(f"{text}{self.python}{self.args.torch_wheel}".encode())
        directory = Path.home() / ".cache" / "bootseer" / "wheels" / digest.hexdigest()[:16]
        done = directory / ".complete"
        if done.is_file():
            log.info("wheels: reusing %s", directory)
            return directory
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        req = directory / "requirements.txt"
        req.write_text(text)
        t = time.perf_counter()
        # The ordinary client with the machine's configuration (PyPI and its mirrors); the
        # torch wheel on disk is found through --find-links.
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet",
                        "--only-binary=:all:",
                        "--find-links", str(self.args.torch_wheel.parent),
                        "--dest", str(directory), "-r", str(req)], check=True)
        req.unlink()
        done.write_text(text)
        log.info("wheels: downloaded into %s in %.0f s", directory, time.perf_counter() - t)
        return directory

    def uv(self) -> str:
        """uv in the benchmark's own tool venv (not a project dependency)."""
        tools = Path.home() / ".cache" / "bootseer" / "bench-env" / f"uv-{UV_VERSION}"
        uv = tools / "bin" / "uv"
        if not uv.exists():
            shutil.rmtree(tools, ignore_errors=True)
            subprocess.run([self.python, "-m", "venv", str(tools)], check=True)
            subprocess.run([str(tools / "bin" / "pip"), "install", "--quiet",
                            f"uv=={UV_VERSION}"], check=True)
        return str(uv)

    def start_index(self, wheels: Path) -> None:
        log_file = open(self.work / "index.log", "wb")  # noqa: SIM115 (closed with the server)
        self.index_proc = subprocess.Popen(
            [self.python, "-m", "http.server", str(self.index_port), "--bind", "127.0.0.1",
             "--directory", str(wheels)],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log_file.close()
        wait_port(self.index_port)

    def stop_index(self) -> None:
        if self.index_proc is not None and self.index_proc.poll() is None:
            self.index_proc.terminate()
            try:
                self.index_proc.wait(10)
            except subprocess.TimeoutExpired:
                self.index_proc.kill()
                self.index_proc.wait()
        self.index_proc = None

    def setup(self) -> dict[str, Any]:
        wheels = self.wheels()
        files = sorted(p for p in wheels.iterdir() if p.suffix == ".whl")
        self.wheel_info = {"dir": str(wheels), "count": len(files),
                           "bytes": sum(p.stat().st_size for p in files),
                           "files": [p.name for p in files]}
        self.requirements.write_text(self.requirements_text())
        self.uv_bin = self.uv() if {"uv", "uv_bytecode"} & set(self.cases) else None
        t = time.perf_counter()
        self.hdfs.start()
        self.env.update({k: v for k, v in self.cluster.env().items()
                         if not k.startswith("BOOTSEER_")})
        log.info("HDFS up in %.1f s at %s", time.perf_counter() - t, self.url)
        self.start_index(wheels)
        self.hdfs.cap_datanodes()
        self.hdfs.cap_port(self.index_port, self.index_tc)
        log.info("links capped at %s: DataNode transfer port and index port %d", self.cap,
                 self.index_port)
        self.versions = {
            "python": subprocess.run([self.python, "--version"], capture_output=True,
                                     text=True).stdout.strip(),
            "python_path": self.python,
            "uv": subprocess.run([self.uv_bin, "--version"], capture_output=True,
                                 text=True).stdout.strip() if self.uv_bin else None,
        }
        return {}

    # -- commands ------------------------------------------------------------------------------

    def pip_install(self) -> list[str]:
        return [str(self.venv / "bin" / "pip"), "install", "--quiet", "--no-cache-dir",
                "--no-index", "--find-links", self.index_url, "-r", str(self.requirements)]

    def snapshot_command(self) -> list[str]:
        """The install ``env run`` snapshots: the whole venv, created and filled."""
        script = (f"{shlex.quote(self.python)} -m venv {shlex.quote(str(self.venv))} && "
                  f"{shlex.join(self.pip_install())} && touch {shlex.quote(str(self.marker))}")
        return ["sh", "-c", script]

    def env_run(self) -> list[str]:
        return [sys.executable, "-m", "bootseer", "--store", self.url, "env", "run",
                "--path", str(self.venv), "--key-file", str(self.requirements), "--",
                *self.snapshot_command()]

    def reset_venv(self) -> None:
        if overlay_at(self.venv) is not None:  # a restore as root mounted it
            unmount(self.venv)
        parent = self.venv.parent
        if parent.is_dir():
            for p in parent.iterdir():  # the venv and any restore sidecars (.venv.bootseer-*)
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
        parent.mkdir(parents=True, exist_ok=True)
        self.marker.unlink(missing_ok=True)

    def sanity(self, name: str, i: int) -> None:
        code = f"import {', '.join(self.preset['imports'])}; print('imports ok')"
        proc = subprocess.run([str(self.venv / "bin" / "python"), "-c", code], env=self.env,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or "imports ok" not in proc.stdout:
            raise RunFailed(f"{name} run {i + 1}: the environment does not import "
                            f"({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")

    def run_steps(self, name: str, i: int, steps: list[tuple[str, list[str]]],
                  env: dict[str, str]) -> dict[str, Any]:
        """Run ``steps`` one after the other, timed together (and each), cold."""
        drop_page_cache()
        row: dict[str, Any] = {}
        outputs = []
        machine0 = cpu_times()
        with CpuMeter() as cpu:
            start = time.perf_counter()
            for step, argv in steps:
                t = time.perf_counter()
                proc = subprocess.run(argv, env=env, capture_output=True, text=True,
                                      timeout=self.args.timeout, stdin=subprocess.DEVNULL)
                row[f"{step}_s"] = round(time.perf_counter() - t, 3)
                outputs.append(proc)
                if proc.returncode != 0:
                    raise RunFailed(f"{name} run {i + 1}, {step} failed "
                                    f"(rc={proc.returncode}): {shlex.join(argv)}\n"
                                    f"{proc.stdout[-3000:]}{proc.stderr[-5000:]}")
            seconds = time.perf_counter() - start
        busy = busy_fraction(machine0, cpu_times())
        row = {"seconds": round(seconds, 3), **row, "cpu_busy": round(busy, 3),
               "cpu_user_s": round(cpu.user, 2),
               "cpu_sys_s": round(cpu.sys, 2), "ctx_switches": cpu.vcsw,
               "ctx_switches_involuntary": cpu.ivcsw}
        row["_outputs"] = outputs
        return row

    # -- cases ---------------------------------------------------------------------------------

    def case(self, name: str, one_run) -> list[float]:
        rows = []
        for i in range(self.args.runs):
            row = one_run(i)
            row.pop("_outputs", None)
            log.info("  %s run %d: %.2f s (%s)", name, i + 1, row["seconds"],
                     ", ".join(f"{k} {v}" for k, v in row.items() if k != "seconds"))
            rows.append(row)
        self.details[name] = rows
        return [r["seconds"] for r in rows]

    def pip_run(self, i: int) -> dict:
        self.reset_venv()
        row = self.run_steps("pip", i, [("venv", [self.python, "-m", "venv", str(self.venv)]),
                                        ("install", self.pip_install())], self.env)
        self.sanity("pip", i)
        row["venv_bytes"] = tree_bytes(self.venv)[0]
        return row

    def uv_run(self, i: int, *, bytecode: bool) -> dict:
        name = "uv_bytecode" if bytecode else "uv"
        self.reset_venv()
        cache = self.work / "uv-cache"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        env = self.env | {"UV_CACHE_DIR": str(cache), "UV_PYTHON_DOWNLOADS": "never"}
        install = [self.uv_bin, "pip", "install", "--no-config", "--quiet", "--python",
                   str(self.venv / "bin" / "python"), "--no-index", "--find-links",
                   self.index_url, "-r", str(self.requirements)]
        if bytecode:
            install.insert(3, "--compile-bytecode")
        row = self.run_steps(name, i, [("venv", [self.python, "-m", "venv", str(self.venv)]),
                                       ("install", install)], env)
        self.sanity(name, i)
        row["venv_bytes"] = tree_bytes(self.venv)[0]
        shutil.rmtree(cache)
        return row

    def restore_run(self, i: int) -> dict:
        self.reset_venv()
        cache = self.work / SCRATCH / "bootseer-cache"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        env = self.env | {"BOOTSEER_CACHE_DIR": str(cache)}
        row = self.run_steps("restore", i, [("env_run", self.env_run())], env)
        proc = row["_outputs"][0]
        said = RESTORED.search(proc.stderr)
        if not said or self.marker.exists() or proc.stdout.split()[:1] != [self.key]:
            raise RunFailed(f"restore run {i + 1} did not restore (marker "
                            f"{'present' if self.marker.exists() else 'absent'}):\n"
                            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
        row["restore_reported_s"] = float(said.group("seconds"))
        row["outside_restore_s"] = round(row["seconds"] - row["restore_reported_s"], 3)
        row["entries"], row["shards"] = int(said.group("entries")), int(said.group("shards"))
        row["mounted"] = said.group("how") != "restored"
        del row["env_run_s"]
        self.sanity("restore", i)
        row["venv_bytes"] = tree_bytes(self.venv)[0]
        return row  # the next run empties the venv and the cache (raw_extract tars it)

    def prestaged_run(self, i: int, *, mount: bool) -> dict:
        """``bootseer warm --env`` first (untimed, as root): the shards on the node and,
        with ``snapshot.mount`` on, the snapshot unpacked there; then the timed ``env
        run``: a mount, or (``mount`` off) an extraction from the staged shards."""
        name = "prestaged" if mount else "prestaged_extract"
        self.reset_venv()
        cache = self.work / SCRATCH / "bootseer-cache"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        env = self.env | {"BOOTSEER_CACHE_DIR": str(cache),
                          "BOOTSEER_SNAPSHOT_MOUNT": "true" if mount else "false"}
        warm = subprocess.run([sys.executable, "-m", "bootseer", "--store", self.url, "warm",
                               "--json", "--env", self.key], env=env, capture_output=True,
                              text=True, timeout=self.args.timeout, stdin=subprocess.DEVNULL)
        if warm.returncode != 0:
            raise RunFailed(f"{name} run {i + 1}: warm failed:\n{warm.stderr[-4000:]}")
        (part,) = json.loads(warm.stdout)["envs"]
        if not part["complete"] or part.get("tree", False) is not mount:
            raise RunFailed(f"{name} run {i + 1}: warm staged {part}")
        row = self.run_steps(name, i, [("env_run", self.env_run())], env)
        said = RESTORED.search(row.pop("_outputs")[0].stderr)
        if not said or self.marker.exists() or (said.group("how") != "restored") is not mount:
            raise RunFailed(f"{name} run {i + 1} did not {'mount' if mount else 'restore'}")
        row["restore_reported_s"] = float(said.group("seconds"))
        row["warm_s"], row["unpack_s"] = part["seconds"], part.get("tree_s")
        del row["env_run_s"]
        self.sanity(name, i)
        return row

    def raw_extract_run(self, i: int) -> dict:
        dest = self.work / SCRATCH / "raw-extract"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        row = self.run_steps("raw_extract", i,
                             [("tar", ["tar", "-xf", str(self.raw_tar), "-C", str(dest)])],
                             self.env)
        del row["tar_s"]
        shutil.rmtree(dest)
        return row

    def publish(self) -> dict[str, Any]:
        """The first node: ``env run`` runs the command and publishes the venv (once)."""
        self.reset_venv()
        key_proc = subprocess.run([*self.env_run()[:6], "key", *self.env_run()[7:]],
                                  env=self.env, capture_output=True, text=True, check=True)
        self.key = key_proc.stdout.strip()
        log.info("publish: env run with key %s (runs the command, snapshots the venv)",
                 self.key[:12])
        drop_page_cache()
        with CpuMeter() as cpu:
            t = time.perf_counter()
            proc = subprocess.run(self.env_run(), env=self.env, capture_output=True, text=True,
                                  timeout=self.args.timeout, stdin=subprocess.DEVNULL)
            seconds = time.perf_counter() - t
        if proc.returncode != 0 or "published snapshot" not in proc.stderr \
                or not self.marker.exists():
            raise RunFailed(f"publish failed (rc={proc.returncode}):\n{proc.stdout[-2000:]}"
                            f"{proc.stderr[-4000:]}")
        log.info("published in %.1f s: %s", seconds, proc.stderr.strip().splitlines()[-1])
        self.sanity("publish", 0)
        env_bytes, env_entries = tree_bytes(self.venv)
        info = self.helper("inspect")
        return {"publish_s": round(seconds, 3), "publish_cpu_s": round(cpu.user + cpu.sys, 2),
                "publish_output": proc.stderr.strip().splitlines()[-1],
                "env_bytes": env_bytes, "env_entries": env_entries,
                "env_du_bytes": du_bytes(self.venv), **info}

    def helper(self, what: str, *extra: str) -> dict[str, Any]:
        """Run a store-side helper in a child process (its HDFS client's threads stay out
        of this one, which forks)."""
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "_helper", what,
                               "--store", self.url, "--key", self.key, *extra],
                              env=self.env, capture_output=True, text=True,
                              timeout=self.args.timeout)
        if proc.returncode != 0:
            raise RunFailed(f"helper {what} failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def breakdown(self) -> dict[str, Any]:
        """Where a restore's time goes: fetch alone, decompress alone, restore without the
        network (a file:// store on local disk)."""
        local = self.work / "local-store"
        shards = self.work / "shards"
        drop_page_cache()
        out = self.helper("breakdown", "--shards-dir", str(shards), "--local-store",
                          str(local), "--concurrency", "4")
        # What a CLI run costs besides restore(): process start + imports, the HDFS connection, the
        # ref and manifest read (`env show` does exactly that and prints).
        for name, argv in (("cli_start", [sys.executable, "-m", "bootseer", "--version"]),
                           ("show", [sys.executable, "-m", "bootseer", "--store", self.url,
                                     "env", "show", self.key])):
            runs = []
            for i in range(self.args.runs):
                row = self.run_steps(name, i, [(name, argv)], self.env)
                runs.append(row["seconds"])
            out[f"{name}_s"] = figure(runs)
        out["cli_start_note"] = "bootseer --version: interpreter start + CLI imports, cold"
        out["show_note"] = ("bootseer env show KEY: the same + HDFS connection + ref and "
                            "manifest fetch + printing the entries (restore's overhead "
                            "outside restore(), roughly)")
        def local_restore(name: str, i: int, concurrency: int) -> dict:
            self.reset_venv()
            row = self.run_steps(name, i, [("restore", [
                sys.executable, "-m", "bootseer", "--store", local.as_uri(), "env", "restore",
                self.key])], self.env | {"BOOTSEER_CACHE_DIR": str(self.work / SCRATCH / "lc"),
                                         "BOOTSEER_SNAPSHOT_CONCURRENCY": str(concurrency),
                                         "BOOTSEER_SNAPSHOT_MOUNT": "false"})
            said = re.search(r"in ([\d.]+) s", row.pop("_outputs")[0].stderr)
            row["restore_reported_s"] = float(said.group(1)) if said else None
            row["concurrency"] = concurrency
            del row["restore_s"]
            self.sanity(name, i)
            log.info("  %s run %d: %.2f s (%s)", name, i + 1, row["seconds"],
                     ", ".join(f"{k} {v}" for k, v in row.items() if k != "seconds"))
            return row

        rows = [local_restore("local_restore", i, 4) for i in range(self.args.runs)]
        self.details["local_restore"] = rows
        sweep = [local_restore("local_restore_concurrency", 0, c) for c in (1, 2, 8)]
        self.details["local_restore_concurrency"] = sweep
        out["local_restore_by_concurrency_s"] = {
            "1": sweep[0]["seconds"], "2": sweep[1]["seconds"],
            "4": statistics.median(r["seconds"] for r in rows), "8": sweep[2]["seconds"]}
        out["local_restore_note"] = ("bootseer env restore from a file:// store on local "
                                     "disk (same shards), extracted (snapshot.mount off): "
                                     "no network; cold; "
                                     "snapshot.concurrency 4 (default), and one run each "
                                     "at 1, 2 and 8")
        out["local_restore_s"] = figure([r["seconds"] for r in rows])
        dest, workers = self.work / SCRATCH / "c-extract", min(8, os.cpu_count() or 1)
        c_rows = []
        for i in range(self.args.runs):
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            row = self.run_steps("c_extract", i, [("unpack", [
                sys.executable, "-c", C_EXTRACT, str(shards), str(dest), str(workers)])],
                self.env)
            del row["_outputs"], row["unpack_s"]
            log.info("  c_extract run %d: %.2f s (cpu %.2f)", i + 1, row["seconds"],
                     row["cpu_user_s"] + row["cpu_sys_s"])
            c_rows.append(row)
        shutil.rmtree(dest)
        self.details["c_extract"] = c_rows
        out["c_extract_s"] = figure([r["seconds"] for r in c_rows])
        out["c_extract_note"] = (f"the same shards from local disk, each decompressed by the "
                                 f"zstandard module's C loop into GNU tar, {workers} at once: "
                                 f"no Python per file and no checks (C_EXTRACT); compare "
                                 f"local_restore_s")
        shutil.rmtree(local)
        shutil.rmtree(shards, ignore_errors=True)
        return out

    # -- the benchmark -------------------------------------------------------------------------

    def run(self) -> dict:
        self.cases = select_cases(self.args.cases, CASES)
        started = time.perf_counter()
        setup = self.setup()
        setup["setup_s"] = round(time.perf_counter() - started, 1)
        times: dict[str, list[float]] = {}
        snap = self.publish()
        if "pip" in self.cases:
            log.info("pip: venv + pip install from the index")
            times["pip"] = self.case("pip", self.pip_run)
        if "uv" in self.cases:
            log.info("uv: venv + uv pip install from the index, empty uv cache")
            times["uv"] = self.case("uv", lambda i: self.uv_run(i, bytecode=False))
        if "uv_bytecode" in self.cases:
            log.info("uv_bytecode: the same with --compile-bytecode")
            times["uv_bytecode"] = self.case("uv_bytecode",
                                             lambda i: self.uv_run(i, bytecode=True))
        if "restore" in self.cases or "raw_extract" in self.cases:
            log.info("restore: bootseer env run, snapshot in HDFS, empty local cache")
            times["restore"] = self.case("restore", self.restore_run)
        breakdown = None
        if "raw_extract" in self.cases:
            self.raw_tar = self.work / "venv.tar"
            subprocess.run(["tar", "-cf", str(self.raw_tar), "-C", str(self.venv.parent),
                            self.venv.name], check=True)
            snap["raw_tar_bytes"] = self.raw_tar.stat().st_size
            log.info("raw_extract: tar -xf of the restored venv (%.0f MB tar) from local disk",
                     snap["raw_tar_bytes"] / MB)
            times["raw_extract"] = self.case("raw_extract", self.raw_extract_run)
            self.raw_tar.unlink()
        if "prestaged" in self.cases:
            log.info("prestaged: bootseer warm --env first (untimed), then env run: a mount")
            times["prestaged"] = self.case("prestaged",
                                           lambda i: self.prestaged_run(i, mount=True))
        if "prestaged_extract" in self.cases:
            log.info("prestaged_extract: the same with snapshot.mount off: an extraction")
            times["prestaged_extract"] = self.case(
                "prestaged_extract", lambda i: self.prestaged_run(i, mount=False))
        if "restore" in self.cases and not self.args.no_breakdown:
            log.info("breakdown: fetch alone, decompress alone, restore from local disk")
            breakdown = self.breakdown()
        self.reset_venv()
        setup["total_s"] = round(time.perf_counter() - started, 1)
        return self.result(setup, snap, times, breakdown)

    def result(self, setup: dict, snap: dict, times: dict[str, list[float]],
               breakdown: dict | None) -> dict:
        rate = self.cap.rate_bytes_per_s
        med = {k: statistics.median(v) for k, v in times.items()}
        snapshot_bytes = snap["snapshot_bytes"]
        transfer = snapshot_bytes / rate
        raw = med.get("raw_extract")
        limit = max(raw, transfer) if raw is not None else None

        def ratio(a: float | None, b: float | None) -> float | None:
            return round(a / b, 3) if a is not None and b else None

        restore, pip, uv = med.get("restore"), med.get("pip"), med.get("uv")
        prestaged = med.get("prestaged")

        def detail_median(case: str, key: str) -> float | None:
            v = median_of([r.get(key) for r in self.details.get(case, [])])
            return round(v, 3) if v is not None else None

        restore_cpu = median_of([r["cpu_user_s"] + r["cpu_sys_s"]
                                 for r in self.details.get("restore", [])])
        reported = detail_median("restore", "restore_reported_s")
        uv_bytecode = med.get("uv_bytecode")
        return {
            **self.recording.header(runs=self.args.runs, caps=self.hdfs.caps(
                applies_to="egress of the DataNode's transfer port and of the index's port, "
                           "each its own tc htb class on lo (same rate)",
                latency=LATENCY)),
            "requirements": {"preset": self.args.requirements,
                             "lines": self.preset["requirements"],
                             "imports_checked": self.preset["imports"]},
            "wheels": {k: v for k, v in self.wheel_info.items()},
            "versions": self.versions,
            "filesystem": f"V, raw_extract's copy and the node caches on a fresh journaled ext4 of "
                          f"{self.args.scratch_gib} GiB (sparse) on a loop device with "
                          f"direct I/O (benchlib.scratch_filesystem: the root file system "
                          f"here has no journal, and its history slows file creation)",
            "index": {"server": "python -m http.server (ThreadingHTTPServer), --find-links page",
                      "url": self.index_url},
            "store": {"url": self.url, "datanodes": 1, "replication": 1,
                      "hdfs_block_size": self.args.block_size * MIB},
            "link": {"cap_MBps": self.args.link_mbps, "cap_bytes_per_s": rate,
                     "applies_to": "egress of the DataNode's transfer port and of the index's "
                                   "port, each its own tc htb class on lo (same rate)",
                     "latency": LATENCY},
            "cold": "per run: the venv path emptied, empty UV_CACHE_DIR / BOOTSEER_CACHE_DIR, "
                    "pip --no-cache-dir, page cache dropped",
            "timed": "spawn of the first process to exit of the last; pip/uv: python -m venv "
                     "+ install (both inside); restore: bootseer env run (replaces both)",
            "venv": str(self.venv),
            "cases": self.cases,
            **{f"{k}_s": figure(v) for k, v in times.items()},
            "limit_s": round(limit, 3) if limit is not None else None,
            "limit": "max(raw_extract_s, snapshot_bytes / link rate)",
            "transfer_s": round(transfer, 3),
            "env_bytes": snap["env_bytes"],
            "env_bytes_note": "apparent bytes of the venv's regular files (hard links once); "
                              "du: env_du_bytes",
            "env_du_bytes": snap["env_du_bytes"],
            "env_entries": snap["env_entries"],
            "snapshot_bytes": snapshot_bytes,
            "snapshot_bytes_note": "zstd shards + manifest blob",
            "snapshot": {k: snap[k] for k in ("key", "manifest_bytes", "shard_bytes", "shards",
                                              "content_bytes", "entries", "publish_output",
                                              "compression_level",
                                              "largest_shard", "largest_file",
                                              "shard_content_bytes_median")},
            "raw_tar_bytes": snap.get("raw_tar_bytes"),
            "publish_s": snap["publish_s"],
            "publish_note": "the first env run: venv + pip install (capped index) + compileall "
                            "+ pack + upload; once, page cache dropped before",
            "pip_install_only_s": detail_median("pip", "install_s"),
            "uv_install_only_s": detail_median("uv", "install_s"),
            "venv_create_s": detail_median("pip", "venv_s"),
            "restore_reported_s": reported,
            "restore_reported_note": "the CLI's own figure: restore() only, without process "
                                     "start, HDFS connection and manifest fetch",
            "restore_cpu_s": round(restore_cpu, 2) if restore_cpu is not None else None,
            "restore_cpu_note": "user+sys of the bootseer process (the DataNode's is not "
                                f"counted); the machine has {os.cpu_count()} cores",
            "cpu_busy_fraction": {case: detail_median(case, "cpu_busy")
                                  for case in self.details if case in times},
            "cpu_busy_note": f"whole machine ({os.cpu_count()} CPUs), median per case over "
                             "the timed run (near 1.0: CPU, not the link, bounds it)",
            "restore_vs_pip": ratio(restore, pip),
            "restore_vs_uv": ratio(restore, uv),
            "restore_vs_uv_bytecode": ratio(restore, uv_bytecode),
            "restore_vs_limit": ratio(restore, limit),
            "restore_mounted": all(r.get("mounted") for r in self.details.get("restore", [])),
            "restore_mounted_note": "as root (snapshot.mount on), the cold restore unpacks "
                                    "the snapshot into the node's cache and mounts it at "
                                    "the venv path (bootseer.snapshot.mount)",
            "prestaged_note": "bootseer warm --env first (untimed: shards staged, snapshot "
                              "unpacked on the node), then the timed env run: a mount. "
                              "prestaged_extract_s: the same with snapshot.mount off (the "
                              "staged shards extracted, as before)",
            "prestaged_vs_extract": ratio(prestaged, med.get("prestaged_extract")),
            "prestaged_unpack_s": detail_median("prestaged", "unpack_s"),
            "prestaged_unpack_note": "what the warm spent unpacking the staged snapshot (once "
                                     "per node and snapshot, off the start)",
            "bounds": {
                "restore_vs_uv_bytecode_at_link": ratio(transfer, uv_bytecode),
                "restore_vs_uv_bytecode_at_link_note":
                    "restore_vs_uv_bytecode had the restore taken exactly transfer_s "
                    "(snapshot_bytes / link rate): the lowest this link allows",
                "outside_restore_s": detail_median("restore", "outside_restore_s"),
                "outside_restore_note":
                    "the timed restore minus the CLI's restore() figure: interpreter and "
                    "CLI start, HDFS connection, ref and manifest fetch (the link idle so far), "
                    "manifest decode (the first shards already crossing), process exit",
                "restore_call_vs_limit": ratio(reported, limit),
                "restore_call_vs_limit_note": "restore_reported_s against limit_s",
                "restore_cpu_over_cores_s": round(restore_cpu / (os.cpu_count() or 1), 2)
                if restore_cpu is not None else None,
                "restore_cpu_over_cores_note":
                    "the restore's own CPU spread evenly over every core: no schedule of its "
                    "work ends sooner (the DataNode's CPU, on the same cores here, comes on "
                    "top)",
            },
            "goals": {
                "restore_le_0.1_pip": (restore <= 0.1 * pip) if restore and pip else None,
                "restore_le_0.5_uv": (restore <= 0.5 * uv) if restore and uv else None,
                "restore_le_1.2_limit": (restore <= 1.2 * limit) if restore and limit else None,
                "restore_le_0.35_uv_bytecode": (restore <= 0.35 * uv_bytecode)
                if restore and uv_bytecode else None,
                "prestaged_le_0.5_s": (prestaged <= 0.5) if prestaged else None,
            },
            "breakdown": breakdown,
            "setup": setup,
            "details": self.details,
        }


def table(result: dict) -> str:
    rows = [("case", "median s", "runs s")]
    for case in (*CASES, "local_restore"):
        fig = result.get(f"{case}_s") or (result.get("breakdown") or {}).get(f"{case}_s")
        if isinstance(fig, dict):
            rows.append((case, f"{fig['median']:.2f}", " ".join(f"{r:.2f}" for r in fig["runs"])))
    for name in ("limit", "transfer", "publish"):
        if result.get(f"{name}_s") is not None:
            rows.append((name, f"{result[f'{name}_s']:.2f}", "(computed)" if name != "publish"
                         else "(once)"))
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, width)) for r in rows]
    lines += [f"env {result['env_bytes'] / MB:.1f} MB in {result['env_entries']} entries, "
              f"snapshot {result['snapshot_bytes'] / MB:.1f} MB, wheels "
              f"{result['wheels']['bytes'] / MB:.1f} MB; link {result['link']['cap_MBps']:g} "
              f"MB/s ({result['link']['latency']})",
              f"restore/pip {result['restore_vs_pip']}, restore/uv {result['restore_vs_uv']}, "
              f"restore/limit {result['restore_vs_limit']}; goals {result['goals']}"]
    b = result.get("breakdown")
    if b:
        lines.append(f"breakdown: fetch alone {b['fetch_s']:.2f} s ({b['fetch_MBps']:.0f} MB/s), "
                     f"decompress alone {b['decompress_s']:.2f} s "
                     f"({b['decompress_cpu_s']:.2f} s CPU), one thread: zstd+tarfile "
                     f"{b['tarfile_serial_s']:.2f} s, zstd+sha256 "
                     f"{b['decompress_sha256_serial_s']:.2f} s; restore from local disk "
                     f"{b['local_restore_s']['median']:.2f} s (the same in C, unchecked: "
                     f"{b['c_extract_s']['median']:.2f} s); CLI start "
                     f"{b['cli_start_s']['median']:.2f} s, env show (CLI + connection + manifest) "
                     f"{b['show_s']['median']:.2f} s; local restore by concurrency "
                     f"{b['local_restore_by_concurrency_s']}")
    return "\n".join(lines)


# -- helpers run in a child process (they open the HDFS store) -----------------------

def _helper(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_env.py _helper")
    parser.add_argument("what", choices=("inspect", "breakdown"))
    parser.add_argument("--store", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--shards-dir", type=Path)
    parser.add_argument("--local-store", type=Path)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    from concurrent.futures import ThreadPoolExecutor

    import zstandard

    from bootseer.config import SnapshotConfig
    from bootseer.snapshot.manifest import REF_PREFIX
    from bootseer.snapshot.restore import load_manifest
    from bootseer.store import BlobStore, open_store

    blobs = BlobStore(open_store(args.store))
    ref = blobs.get_ref(REF_PREFIX + args.key)
    manifest = load_manifest(blobs, args.key)
    if args.what == "inspect":
        shard_bytes = sum(s.size for s in manifest.shards)
        big = max(range(len(manifest.shards)), key=lambda n: manifest.shards[n].input_bytes)
        largest = max((e for e in manifest.entries if e.kind == "file"), key=lambda e: e.size)
        print(json.dumps({"key": args.key, "manifest_bytes": ref.size,
                          "shard_bytes": shard_bytes, "shards": len(manifest.shards),
                          "snapshot_bytes": shard_bytes + ref.size,
                          "content_bytes": manifest.content_bytes,
                          "entries": len(manifest.entries),
                          "compression_level": SnapshotConfig().compression_level,
                          "largest_shard": {"index": big,
                                            "content_bytes": manifest.shards[big].input_bytes,
                                            "bytes": manifest.shards[big].size},
                          "largest_file": {"path": largest.path, "bytes": largest.size,
                                           "shard": largest.shard},
                          "shard_content_bytes_median": statistics.median(
                              s.input_bytes for s in manifest.shards)}))
        return
    # breakdown: 1) fetch every shard as the restore reads it (1 MiB buffered reads,
    # ``concurrency`` shards at once), keep the bytes; 2) decompress them from memory.
    args.shards_dir.mkdir(parents=True, exist_ok=True)

    def fetch(digest: str) -> bytes:
        parts = []
        with blobs.open(digest) as f:
            while chunk := f.read(1 << 20):
                parts.append(chunk)
        return b"".join(parts)

    cpu0, t = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        data = list(pool.map(fetch, [s.digest for s in manifest.shards]))
    fetch_s, fetch_cpu = time.perf_counter() - t, time.process_time() - cpu0
    fetched = sum(len(d) for d in data)
    for position, number in enumerate(manifest.read_order()):  # for C_EXTRACT, in read order
        (args.shards_dir / f"{position:04d}.tar.zst").write_bytes(data[number])

    def decompress(blob: bytes) -> int:
        n = 0
        with zstandard.ZstdDecompressor().stream_reader(blob) as r:
            while chunk := r.read(1 << 20):
                n += len(chunk)
        return n

    cpu0, t = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        tar_bytes = sum(pool.map(decompress, data))
    decompress_s, decompress_cpu = time.perf_counter() - t, time.process_time() - cpu0
    cpu0, t = time.process_time(), time.perf_counter()
    hashed = 0
    for blob in data:
        with zstandard.ZstdDecompressor().stream_reader(blob) as r:
            sha = hashlib.sha256()
            while chunk := r.read(1 << 20):
                sha.update(chunk)
                hashed += len(chunk)
    sha_serial_s = time.perf_counter() - t
    # zstd + tarfile's stream mode (what _extract_shard iterates), member data read, one
    # thread, nothing hashed or written: the pure-Python part of the data path.
    t = time.perf_counter()
    for blob in data:
        with zstandard.ZstdDecompressor().stream_reader(blob) as r, \
                tarfile.open(fileobj=r, mode="r|") as tar:
            for member in tar:
                if member.isreg():
                    f = tar.extractfile(member)
                    while f.read(1 << 20):
                        pass
    tar_serial_s = time.perf_counter() - t
    # 3) the same snapshot in a file:// store on local disk, for a restore without network.
    local = BlobStore(open_store(args.local_store.resolve().as_uri()))
    for shard, blob in zip(manifest.shards, data):
        local.put(blob, expect=shard.digest)
    local.put(blobs.get(ref.digest), expect=ref.digest)
    local.set_ref(REF_PREFIX + args.key, ref.digest, dict(ref.meta))
    print(json.dumps({
        "fetch_s": round(fetch_s, 3), "fetched_bytes": fetched,
        "fetch_MBps": round(fetched / fetch_s / MB, 1),
        "fetch_cpu_s": round(fetch_cpu, 3),
        "fetch_note": "shards read through BlobStore.open (8 MiB reads, verified), "
                      f"{args.concurrency} at once, over the capped link, cold; includes "
                      "nothing else (connection already made)",
        "decompress_s": round(decompress_s, 3), "decompress_cpu_s": round(decompress_cpu, 3),
        "tar_bytes": tar_bytes,
        "decompress_note": f"zstd of all shards from memory, {args.concurrency} threads",
        "decompress_sha256_serial_s": round(sha_serial_s, 3),
        "decompress_sha256_serial_note": "one thread: zstd + sha256 of the tar streams",
        "tarfile_serial_s": round(tar_serial_s, 3),
        "tarfile_serial_note": "one thread: zstd + tarfile 'r|' iteration + member reads "
                               "(no hashing, no writes)",
    }))


def main() -> None:
    if sys.argv[1:2] == ["_helper"]:
        _helper(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results/env.json"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requirements", choices=sorted(PRESETS), default="full",
                        help="requirement set: full (torch CPU, scipy, pandas, ...), cuda "
                             "(torch's CUDA build, ~5.5 GB) or small (numpy, for development)")
    parser.add_argument("--link-mbps", type=float, default=100.0,
                        help="cap on the DataNode's and the index's egress, MB/s (decimal)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated subset of {','.join(CASES)} "
                             "(raw_extract needs a restore run)")
    parser.add_argument("--torch-wheel", type=Path, default=TORCH_WHEEL)
    parser.add_argument("--no-breakdown", action="store_true",
                        help="skip the untimed restore breakdown")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--base-port", type=int, default=19800,
                        help="HDFS ports from here; the index on base + 50")
    parser.add_argument("--block-size", type=int, default=64, help="HDFS block size, MiB")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--scratch-gib", type=int, default=16,
                        help="the fresh file system for the venv and raw_extract (sparse)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work = Path(tempfile.mkdtemp(prefix="bench-env-", dir="/var/tmp"))
    bench = Bench(args, work)
    try:
        with scratch_filesystem(work / SCRATCH, args.scratch_gib << 30):
            result = bench.run()
    finally:
        bench.stop_index()
        bench.hdfs.stop()  # and the index's cap
        if args.keep:
            log.info("kept %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if result["code_changed_during_run"]:
        log.warning("the code under test (%s) changed during the run: the figures mix "
                    "versions", result["code"]["dir"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("details", "wheels")},
                     indent=2))
    print(table(result))


if __name__ == "__main__":
    main()

"""`make demo`'s training job, started the way a container engine would start it.

One start = one OCI bundle handed to ``bootseer-runtime run`` (the shim Docker and
containerd call instead of runc). The bundle's annotations ask for the lazy image
``--image``; the shim gets the container's root from the node agent on ``--socket`` and
its poststop hook releases it. Inside, the job does what a real one does at startup:

1. its Python dependencies: ``bootseer env run`` restores their snapshot, or installs them
   (unpacks the wheels in /job/wheels) and snapshots the result on the first start;
2. its checkpoint: read whole through ``bootseer.checkpoint.open``;
3. ``bootseer.mark_ready()``.

Bootseer itself is bind-mounted into the container (this checkout and the virtualenv's
site-packages), as a job image would carry it. So are the store and the node's cache
directory (and a ``file://`` checkpoint's directory), at the same paths, so the job sees
what ``bootseer warm`` staged on the node.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bootseer.prefetch.container import bundle_config  # noqa: E402

JOB = """
import os, subprocess, sys, time
import bootseer, bootseer.checkpoint as ckpt
install = "python3 -m zipfile -e /job/wheels/*.whl /opt/deps"
env = subprocess.run([sys.executable, "-m", "bootseer", "env", "run", "--path", "/opt/deps",
                      "--key-file", "/job/requirements.txt", "--", "sh", "-c", install],
                     check=True, capture_output=True, text=True)
print(env.stderr.strip().splitlines()[-1])
open("/job/env-key", "w").write(env.stdout.strip())
sys.path.insert(0, "/opt/deps")
import numpy
with ckpt.open(os.environ["CHECKPOINT"]) as f:
    size = len(f.read())
bootseer.mark_ready()
print(f"job up: numpy {numpy.__version__}, checkpoint {size >> 20} MiB read")
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--id", required=True, help="the container's id")
    parser.add_argument("--image", required=True)
    parser.add_argument("--socket", type=Path, required=True, help="the node agent's socket")
    parser.add_argument("--cache-dir", type=Path, required=True, help="the node's cache")
    parser.add_argument("--job-dir", type=Path, required=True,
                        help="requirements.txt and wheels/")
    parser.add_argument("--store", required=True, help="file:// store URL")
    parser.add_argument("--checkpoint", required=True, help="checkpoint URL")
    args = parser.parse_args()

    (args.job_dir / "job.py").write_text(JOB)
    store_dir = Path(args.store.removeprefix("file://"))
    env = {"PYTHONPATH": "/opt/bootseer/src:/opt/bootseer/site",
           "BOOTSEER_STORE": args.store, "BOOTSEER_CACHE_DIR": str(args.cache_dir),
           "CHECKPOINT": args.checkpoint}
    binds = {"/opt/bootseer/src": REPO, "/opt/bootseer/site": Path(sysconfig.get_path("purelib")),
             "/job": args.job_dir, str(store_dir): store_dir,
             str(args.cache_dir): args.cache_dir}
    if args.checkpoint.startswith("file://"):  # a local "remote" checkpoint: same path
        checkpoint_dir = Path(args.checkpoint.removeprefix("file://")).parent
        binds[str(checkpoint_dir)] = checkpoint_dir
    with tempfile.TemporaryDirectory(prefix="bootseer-demo-job-") as tmp:
        bundle = Path(tmp) / "bundle"
        (bundle / "rootfs").mkdir(parents=True)  # the shim puts the lazy root here instead
        config = bundle_config(bundle / "rootfs", ["python3", "/job/job.py"],
                               {"PATH": "/usr/local/bin:/usr/bin:/bin"} | env, binds=binds)
        config["annotations"] = {"io.bootseer.image": args.image,
                                 "io.bootseer.workload": "train",
                                 "io.bootseer.job": "demo-train"}
        (bundle / "config.json").write_text(json.dumps(config, indent=2))
        runtime = Path(sys.executable).parent / "bootseer-runtime"
        return subprocess.run(
            [str(runtime), "--root", str(Path(tmp) / "state"), "run", "--bundle",
             str(bundle), args.id],
            env={**os.environ, "BOOTSEER_AGENT_SOCKET": str(args.socket)},
            stdin=subprocess.DEVNULL).returncode


if __name__ == "__main__":
    sys.exit(main())

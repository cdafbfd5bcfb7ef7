"""``make bench-blocksize``: which block size for lazy images — measured on a real start.

The real test image (Debian bookworm minbase + python3, two layers) is converted with each
block size, then a start (``python3 -c``, in runc on an overlay over the lazy mount) runs
with an empty local block cache and a dropped page cache. For each size we record what the
start costs the store: bytes fetched (compressed), ranged reads sent, blocks fetched, and
what the conversion stored. Small blocks fetch fewer unneeded bytes but need more round
trips; large blocks the reverse. With a link of ``--link-mbps`` and ``--rtt-ms`` per read
(a model, stated in the result: no latency can be added on this kernel), the estimated
fetch time is ``bytes / rate + reads × rtt``; the default is the size that minimises it.
Writes ``bench-results/blocksize.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Recording, drop_page_cache

from bootseer_dev.image import build_image

SIZES = [256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20]
COMMAND = ["python3", "-c", "import json, hashlib, platform; print(platform.python_version())"]


def bootseer(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bootseer", *args], env=env, check=True,
                          capture_output=True, text=True)


def measure(layout: Path, block_size: int, runs: int, work: Path) -> dict:
    store, cache = work / f"store-{block_size}", work / f"cache-{block_size}"
    env = {**os.environ, "BOOTSEER_STORE": f"file://{store}", "BOOTSEER_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    bootseer(env, "image", "convert", str(layout), "--name", "img", "--block-size",
             str(block_size))
    convert_s = time.perf_counter() - start
    stored = sum(p.stat().st_size for p in (store / "packs").iterdir())
    samples = []
    for _ in range(runs):
        subprocess.run(["rm", "-rf", str(cache)], check=True)
        drop_page_cache()
        stats_file = work / "stats.json"
        start = time.perf_counter()
        bootseer(env, "image", "run", "--stats", str(stats_file), "img", "--", *COMMAND)
        samples.append((time.perf_counter() - start, json.loads(stats_file.read_text())))
    stats = samples[0][1]  # the same start reads the same blocks every time
    return {"block_size": block_size, "convert_s": round(convert_s, 2), "stored_bytes": stored,
            "start_s_local": round(statistics.median(s for s, _ in samples), 2),
            "start_s_local_runs": [round(s, 2) for s, _ in samples],
            "bytes_fetched": stats["bytes_fetched"], "fetch_requests": stats["fetch_requests"],
            "blocks_fetched": stats["blocks_fetched"],
            "image_content_bytes": stats["image_content_bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results/blocksize.json"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--link-mbps", type=float, default=100.0, help="model link, MB/s")
    parser.add_argument("--rtt-ms", type=float, default=5.0, help="model cost of one read")
    args = parser.parse_args()
    recording = Recording("blocksize")
    layout = build_image(with_python=True)
    with tempfile.TemporaryDirectory(prefix="bench-blocksize-", dir="/var/tmp") as tmp:
        rows = [measure(layout, size, args.runs, Path(tmp)) for size in SIZES]
    for row in rows:
        row["model_fetch_s"] = round(row["bytes_fetched"] / (args.link_mbps * 1e6)
                                     + row["fetch_requests"] * args.rtt_ms / 1e3, 3)
        row["fetched_fraction"] = round(row["bytes_fetched"] / row["image_content_bytes"], 4)
    best = min(rows, key=lambda r: r["model_fetch_s"])
    result = {**recording.header(runs=args.runs, caps={}),
              "image": "debian bookworm minbase + python3 (bootseer_dev.image)",
              "start_command": COMMAND,
              "model": {"link_MBps": args.link_mbps, "rtt_ms": args.rtt_ms,
                        "note": "fetch time = bytes / link + reads x rtt; the kernel here has "
                                "no netem, so latency is modelled, not applied"},
              "sizes": rows, "best_block_size": best["block_size"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""``make bench-image``: start a >= 1 GiB image — full pull vs lazy vs lazy + prefetch vs local.

The image is real: Debian bookworm minbase + python3 + torch 2.13.0 (CPU) and numpy
(``bootseer_dev.image.build_image(with_torch=True)``, three layers, ~1.1 GB of files).
The start is real too: ``python3 -c "import torch; ..."`` in runc, ready when it exits.
The store is a local HDFS cluster (1 DataNode, replication 1) whose DataNode egress is
capped with tc at ``--link-mbps`` MB/s; the kernel has no ``sch_netem``, so no latency is
added (loopback round trips are ~0.1 ms). The store holds both the lazy image
(``bootseer image convert``) and the image's original gzip layer blobs, under
``refs/registry/torch`` (what a registry holds, for the full pull).

Every measured run starts with an empty ``BOOTSEER_CACHE_DIR`` (or a fresh unpack
directory) and a dropped page cache, and is timed from spawning a fresh process to its
exit:

* ``full_pull_s``: ``full_pull.py pull``: download every layer blob (3 at once, sha256
  checked), extract the layers in order as they arrive, run the start on an overlay
  (what docker does today);
* ``lazy_s``: ``bootseer image run torch --no-prefetch --no-record``;
* ``record_s`` (once): ``image run --record --no-prefetch``: records the hot list and
  writes the hot pack into the store;
* ``lazy_prefetch_s``: ``image run --no-record``: prefetch of the recorded hot list;
* ``local_s``: ``full_pull.py run`` on the image unpacked beforehand on local disk: the
  floor.

Medians of ``--runs`` runs. Goals: ``lazy_prefetch_s <= 0.25 x full_pull_s``, and
``lazy_prefetch_s <= 1.3 x (local_s + hot_bytes / link rate)``. Writes
``bench-results/image.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import RunFailed, drop_page_cache, figure, median_of, select_cases

from bootseer_dev.cluster import Cluster, ClusterSpec, parse_link
from bootseer_dev.image import build_image, read_build_info, unmount, unpack_image

log = logging.getLogger("bench-image")
HERE = Path(__file__).resolve().parent
FULL_PULL = HERE / "full_pull.py"
MB, MIB = 1e6, 1 << 20
IMAGE = "torch"
WORKLOAD = ["python3", "-c",
            "import torch; x = torch.ones(256, 256); print(float((x @ x).sum()))"]
EXPECTED = "16777216.0"  # 256 * 256 * 256
CASES = ("local", "full_pull", "lazy", "lazy_prefetch", "lazy_warmed")
LATENCY = "none added: kernel has no sch_netem"


def mounts_below(path: Path) -> list[Path]:
    prefix = str(path.resolve()).rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if (target + "/").startswith(prefix):
                found.append(Path(target))
    return sorted(found, key=lambda p: -len(p.parts))  # deepest first


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.cap = parse_link(f"{args.link_mbps:g}MB/s")
        spec = ClusterSpec.with_base_port(args.base_port, datanodes=1, replication=1,
                                          block_size=args.block_size * MIB,
                                          state_dir=work / "hdfs", link=None)
        self.cluster = Cluster(spec)
        self.url = f"{self.cluster.namenode_rpc_url}/bench"
        self.env = dict(os.environ)
        self.details: dict[str, list[dict]] = {}

    # -- running things ----------------------------------------------------------------------

    def bootseer(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "bootseer", "--store", self.url, *args]

    def image_run(self, *flags: str, stats: Path) -> list[str]:
        return self.bootseer("image", "run", *flags, "--stats", str(stats), IMAGE, "--",
                             *WORKLOAD)

    def timed(self, name: str, i: int, make_argv: Callable[[Path, Path], list[str]],
              output: str | None, prepare: list[str] | None = None) -> dict:
        """One cold run: fresh cache dir, dropped page cache, spawn to exit.

        ``make_argv(run_dir, json_path)``: the command, given its fresh scratch directory
        and where it writes its JSON ``output`` ("stats" or "report"), if any. ``prepare``
        runs first, untimed, with the same cache directory (``bootseer warm``).
        """
        run_dir = self.work / f"{name}-{i}"
        json_path = self.work / f"{name}-{i}.json"
        shutil.rmtree(run_dir, ignore_errors=True)
        json_path.unlink(missing_ok=True)
        run_dir.mkdir()
        argv = make_argv(run_dir, json_path)
        env = self.env | {"BOOTSEER_CACHE_DIR": str(run_dir / "cache")}
        if prepare:
            subprocess.run(prepare, env=env, check=True, capture_output=True,
                           timeout=self.args.timeout)
        drop_page_cache()
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=self.args.timeout, stdin=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        if proc.returncode != 0 or EXPECTED not in proc.stdout:
            raise RunFailed(f"{name} run {i + 1} failed (rc={proc.returncode}): "
                            f"{' '.join(argv)}\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
        row: dict[str, Any] = {"seconds": round(seconds, 3)}
        if output and json_path.is_file():
            row[output] = json.loads(json_path.read_text())
        for mount in mounts_below(run_dir):  # a run must not leave mounts; be sure
            log.warning("unmounting %s left by the %s run", mount, name)
            unmount(mount)
        shutil.rmtree(run_dir)
        log.info("  %s run %d: %.2f s", name, i + 1, seconds)
        return row

    def case(self, name: str, make_argv: Callable[[Path, Path], list[str]], *,
             output: str | None = None, runs: int | None = None,
             prepare: list[str] | None = None) -> list[dict]:
        rows = [self.timed(name, i, make_argv, output, prepare)
                for i in range(self.args.runs if runs is None else runs)]
        self.details[name] = rows
        return rows

    # -- setup ---------------------------------------------------------------------------------

    def setup(self) -> dict:
        started = time.perf_counter()
        self.layout = build_image(with_torch=True)
        self.info = read_build_info(self.layout)
        log.info("image %s: %.0f MB of files, %.0f MB of gzip layers (%.0f s)", self.layout,
                 self.info.rootfs_bytes / MB, self.info.compressed_bytes / MB,
                 time.perf_counter() - started)
        self.rootfs = self.work / "local" / "rootfs"
        if "local" in self.cases:
            t = time.perf_counter()
            unpack_image(self.layout, self.rootfs)
            log.info("unpacked locally for the floor in %.1f s", time.perf_counter() - t)
        t = time.perf_counter()
        self.cluster.start()
        self.env.update({k: v for k, v in self.cluster.env().items()
                         if not k.startswith("BOOTSEER_")})
        log.info("HDFS up in %.1f s at %s", time.perf_counter() - t, self.url)
        setup: dict[str, Any] = {}
        if {"lazy", "lazy_prefetch"} & set(self.cases):
            t = time.perf_counter()
            subprocess.run(self.bootseer("image", "convert", str(self.layout), "--name", IMAGE),
                           env=self.env, check=True, stdout=subprocess.DEVNULL)
            setup["convert_s"] = round(time.perf_counter() - t, 2)
            log.info("converted into the store in %.1f s (uncapped)", setup["convert_s"])
        if "full_pull" in self.cases:
            t = time.perf_counter()
            subprocess.run([sys.executable, str(FULL_PULL), "push", "--store", self.url,
                            "--layout", str(self.layout), "--name", IMAGE],
                           env=self.env, check=True, stdout=subprocess.DEVNULL)
            setup["push_s"] = round(time.perf_counter() - t, 2)
            log.info("pushed the layer blobs in %.1f s (uncapped)", setup["push_s"])
        self.cluster.set_link(self.cap)
        log.info("link capped at %s", self.cap)
        return setup

    # -- the benchmark -------------------------------------------------------------------------

    def run(self) -> dict:
        self.cases = select_cases(self.args.cases, CASES)
        setup = self.setup()
        workload = ["--workload", self.args.workload]
        times: dict[str, list[float]] = {}
        record: dict | None = None
        if "local" in self.cases:
            log.info("local: image already unpacked on local disk")
            rows = self.case("local", lambda d, out: [
                sys.executable, str(FULL_PULL), "run", "--rootfs", str(self.rootfs),
                "--report", str(out), "--", *WORKLOAD], output="report")
            times["local"] = [r["seconds"] for r in rows]
        if "full_pull" in self.cases:
            log.info("full_pull: fetch every layer, unpack, run")
            rows = self.case("full_pull", lambda d, out: [
                sys.executable, str(FULL_PULL), "pull", "--store", self.url, "--name", IMAGE,
                "--dest", str(d / "rootfs"), "--report", str(out), "--", *WORKLOAD],
                output="report")
            times["full_pull"] = [r["seconds"] for r in rows]
        if "lazy" in self.cases:
            log.info("lazy: lazy mount, no prefetch")
            rows = self.case("lazy", lambda d, out: self.image_run(
                "--no-prefetch", "--no-record", stats=out),
                             output="stats")
            times["lazy"] = [r["seconds"] for r in rows]
        if "lazy_prefetch" in self.cases:
            log.info("record: one run that records the hot list and writes the hot pack")
            record = self.case("record", lambda d, out: self.image_run(
                "--record", "--no-prefetch", *workload, stats=out), output="stats", runs=1)[0]
            log.info("lazy_prefetch: lazy mount, prefetch of the recorded hot list")
            rows = self.case("lazy_prefetch", lambda d, out: self.image_run(
                "--no-record", *workload, stats=out), output="stats")
            times["lazy_prefetch"] = [r["seconds"] for r in rows]
        if "lazy_warmed" in self.cases:
            log.info("lazy_warmed: bootseer warm first (untimed), then the start: what is "
                     "left when every hot block is already local")
            rows = self.case("lazy_warmed", lambda d, out: self.image_run(
                "--no-record", *workload, stats=out), output="stats",
                prepare=self.bootseer("warm", "--image", IMAGE, *workload))
            times["lazy_warmed"] = [r["seconds"] for r in rows]
        return self.result(setup, times, record)

    def result(self, setup: dict, times: dict[str, list[float]], record: dict | None) -> dict:
        rate = self.cap.rate_bytes_per_s
        med = {k: statistics.median(v) for k, v in times.items()}

        def stat(case: str, key: str) -> list:
            return [r.get("stats", {}).get(key) for r in self.details.get(case, [])]

        def prefetch_stat(case: str, key: str) -> list:
            return [(r.get("stats", {}).get("prefetch") or {}).get(key)
                    for r in self.details.get(case, [])]

        hot_bytes = median_of(prefetch_stat("lazy_prefetch", "hot_bytes"))
        floor = (med["local"] + hot_bytes / rate
                 if "local" in med and hot_bytes is not None else None)

        def ratio(a: float | None, b: float | None) -> float | None:
            return round(a / b, 3) if a is not None and b else None

        pre, full, lazy = med.get("lazy_prefetch"), med.get("full_pull"), med.get("lazy")
        # What a prefetch run moved over the link: demand fetches plus the prefetcher's.
        demand = stat("lazy_prefetch", "bytes_fetched")
        prefetched = prefetch_stat("lazy_prefetch", "bytes_fetched")
        total = [d + (p or 0) if d is not None else None for d, p in zip(demand, prefetched)]
        content = median_of(stat("lazy", "image_content_bytes")
                            + stat("lazy_prefetch", "image_content_bytes"))
        return {
            "benchmark": "image",
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
            "image": {"name": self.info.name, "manifest_digest": self.info.manifest_digest,
                      "layout": str(self.layout), "build_seconds": self.info.build_seconds,
                      "layers": [{"bytes": x["size"], "tar_bytes": x["tar_size"],
                                  "content_bytes": x["content_bytes"],
                                  "created_by": x["created_by"]} for x in self.info.layers],
                      "lazy_content_bytes": content},
            "workload": WORKLOAD,
            "ready": "the workload's process exits (stdout checked)",
            "store": {"url": self.url, "datanodes": 1, "replication": 1,
                      "hdfs_block_size": self.args.block_size * MIB, **setup},
            "link": {"cap_MBps": self.args.link_mbps, "cap_bytes_per_s": rate,
                     "applies_to": "DataNode egress (data transfer port), tc htb on lo",
                     "latency": LATENCY},
            "runs": self.args.runs,
            "cold": "fresh BOOTSEER_CACHE_DIR / unpack dir and dropped page cache per run",
            "cases": self.cases,
            **{f"{k}_s": figure(v) for k, v in times.items()},
            "record_s": record["seconds"] if record else None,
            "image_bytes": self.info.rootfs_bytes,
            "compressed_layer_bytes": self.info.compressed_bytes,
            "hot_bytes": hot_bytes,
            "hot_bytes_note": "compressed bytes of the hot list (what the prefetch reads)",
            "bytes_fetched_lazy": median_of(stat("lazy", "bytes_fetched")),
            "bytes_fetched_lazy_prefetch": median_of(total),
            "bytes_fetched_lazy_prefetch_note": "demand fetches + the prefetcher's fetches",
            "demand_bytes_lazy_prefetch": median_of(demand),
            "prefetched_bytes": median_of(prefetched),
            "prefetch_finished_s": median_of(prefetch_stat("lazy_prefetch", "seconds")),
            "mount_s_lazy_prefetch": median_of(stat("lazy_prefetch", "mount_seconds")),
            "warmed_vs_local": ratio(med.get("lazy_warmed"), med.get("local")),
            "floor_s": round(floor, 3) if floor is not None else None,
            "floor": "local_s + hot_bytes / link rate",
            "prefetch_vs_full": ratio(pre, full),
            "prefetch_vs_lazy": ratio(pre, lazy),
            "prefetch_vs_floor": ratio(pre, floor),
            "lazy_vs_full": ratio(lazy, full),
            "goals": {
                "prefetch_le_0.25_full": (pre <= 0.25 * full) if pre and full else None,
                "prefetch_le_1.3_floor": (pre <= 1.3 * floor) if pre and floor else None,
            },
            "details": self.details,
        }


def table(result: dict) -> str:
    rows = [("case", "median s", "runs s")]
    for case in (*CASES, "record"):
        fig = result.get(f"{case}_s")
        if isinstance(fig, dict):
            rows.append((case, f"{fig['median']:.2f}", " ".join(f"{r:.2f}" for r in fig["runs"])))
        elif fig is not None:
            rows.append((case, f"{fig:.2f}", "(once)"))
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, width)) for r in rows]

    def mb(v: float | None) -> str:
        return "-" if v is None else f"{v / MB:.1f} MB"

    lines += [f"image {mb(result['image_bytes'])} of files, "
              f"{mb(result['compressed_layer_bytes'])} of gzip layers; link "
              f"{result['link']['cap_MBps']:g} MB/s ({result['link']['latency']})",
              f"hot {mb(result['hot_bytes'])}; fetched lazy {mb(result['bytes_fetched_lazy'])}, "
              f"lazy+prefetch {mb(result['bytes_fetched_lazy_prefetch'])}; "
              f"floor {result['floor_s']} s",
              f"prefetch/full {result['prefetch_vs_full']}, prefetch/lazy "
              f"{result['prefetch_vs_lazy']}, prefetch/floor {result['prefetch_vs_floor']}; "
              f"goals {result['goals']}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results/image.json"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--link-mbps", type=float, default=100.0,
                        help="DataNode egress cap, MB/s (decimal)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (store, unpacked image) for a look")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated subset of {','.join(CASES)} "
                             "(lazy_prefetch includes the recording run)")
    parser.add_argument("--workload", default="bench-image",
                        help="hot-list workload name for the record and prefetch runs")
    parser.add_argument("--base-port", type=int, default=19500)
    parser.add_argument("--block-size", type=int, default=64, help="HDFS block size, MiB")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work = Path(tempfile.mkdtemp(prefix="bench-image-", dir="/var/tmp"))
    bench = Bench(args, work)
    try:
        result = bench.run()
    finally:
        for mount in mounts_below(work):
            log.warning("unmounting %s", mount)
            unmount(mount)
        bench.cluster.stop()
        if args.keep:
            log.info("kept %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2))
    print(table(result))


if __name__ == "__main__":
    main()

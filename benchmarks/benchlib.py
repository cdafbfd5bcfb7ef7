"""What every benchmark shares: cold reads, one result format, one capped HDFS cluster.

Every ``bench-results/*.json`` starts with the same header (:meth:`Recording.header`), so
two results can be compared without knowing which benchmark wrote them::

    benchmark   its name ("image", "ckpt-cuda", ...)
    when        UTC time the result was written
    commit      the git commit of the code measured (None outside a checkout)
    dirty       whether that code had changes on top of the commit (``code`` says which)
    machine     one shape: cpus, cpus_usable, memory_bytes, kernel, platform, python,
                file_create_us (what creating a file costs where the benchmarks work)
    caps        the link caps the benchmark applied, each stated (or {} for none)
    runs        how many runs each figure's median is taken over
    cpu_busy    the machine's CPU busy fraction over the whole benchmark (a shared
                machine: high when others were busy too)
    elapsed_s   the benchmark's wall time

and every figure is a :func:`figure`: its median and the raw runs. The rest of a result is
the benchmark's own (its cases, ratios, goals and notes).
"""

from __future__ import annotations

import hashlib
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bootseer_dev.cluster import Cluster, ClusterSpec, LinkCap
from bootseer_dev.cluster.linkcap import apply_link_cap, remove_link_cap

#: The checkout these benchmarks belong to.
REPO = Path(__file__).resolve().parent.parent
#: The folders whose code a benchmark measures: a change there makes a result "dirty".
CODE_DIRS = ("bootseer", "agents", "prefetch", "snapshot", "stripedfs")


def drop_page_cache() -> None:
    """Write dirty pages back and drop the page cache, so the next read comes from disk."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


@contextmanager
def scratch_filesystem(mountpoint: Path, size: int) -> Iterator[Path]:
    """A fresh, journaled ext4 of ``size`` bytes (sparse) mounted at ``mountpoint`` for the
    benchmark's trees, unmounted and deleted afterwards.

    A file system's history changes how fast it creates files. These machines' root file
    system is ext4 without a journal, where the inode allocator skips every inode deleted
    in the last seconds (``recently_deleted``, read from the inode table): after the
    benchmarks' rounds of unpacking and deleting trees of tens of thousands of files,
    ``tar -x`` of a 20,000-file venv there took 14 s of system CPU, against 0.76 s on a
    fresh journaled ext4. Production nodes' file systems keep a journal (where that check
    is off), so every tree a benchmark writes and times goes here. The loop device reads
    and writes its backing file with direct I/O: one page cache, not two."""
    image = mountpoint.with_name(mountpoint.name + ".img")
    mountpoint.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size)
    device = None
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                        str(image)], check=True)
        device = subprocess.run(["losetup", "--find", "--show", "--direct-io=on", str(image)],
                                check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run(["mount", device, str(mountpoint)], check=True)
        try:
            yield mountpoint
        finally:
            subprocess.run(["umount", "--recursive", str(mountpoint)], check=False)
    finally:
        if device:
            subprocess.run(["losetup", "--detach", device], check=False)
        image.unlink(missing_ok=True)


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat: two readings around a
    run give its CPU busy fraction (near 1.0: the run was bound by CPU, not by the link)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The machine's CPU busy fraction between two :func:`cpu_times` readings."""
    return (after[0] - before[0]) / max(1, after[1] - before[1])


def figure(runs: list[float], digits: int = 3) -> dict[str, Any]:
    """A reported figure: the median and the raw runs it comes from."""
    return {"median": round(statistics.median(runs), digits),
            "runs": [round(r, digits) for r in runs]}


class RunFailed(RuntimeError):
    """A measured run did not do what it was supposed to: the figures would be wrong."""


def median_of(values: list[Any]) -> Any:
    """The median of the values that are there (None where a run did not report one)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def select_cases(spec: str, known: tuple[str, ...]) -> list[str]:
    """``--cases a,b``: the named subset, or a clear exit for an unknown name."""
    cases = [c.strip() for c in spec.split(",") if c.strip()]
    unknown = set(cases) - set(known)
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; known: {', '.join(known)}")
    return cases


# -- the result's header ---------------------------------------------------------------------

def machine() -> dict[str, Any]:
    """The machine a result was measured on, in the one shape every result uses."""
    memory = None
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory = int(line.split()[1]) * 1024
            break
    return {"cpus": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
            "memory_bytes": memory, "kernel": platform.release(),
            "platform": platform.platform(), "python": platform.python_version(),
            "file_create_us": file_create_us()}


def file_create_us(directory: str = "/var/tmp", count: int = 200) -> float:
    """Microseconds of CPU to create (and close) an empty file where the benchmarks work,
    the median of ``count``. Every cache entry a start writes pays it, and it is not the
    same on every machine: 30-40 on a journaled ext4, up to 1,100-1,400 on a root ext4
    without a journal after many deletions (ext4 then checks the recently deleted inodes
    one by one before it reuses one: ``recently_deleted`` in its inode allocator)."""
    with tempfile.TemporaryDirectory(dir=directory, prefix="bench-probe-") as scratch:
        times = []
        for n in range(count):
            began = time.process_time()
            os.close(os.open(f"{scratch}/{n}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            times.append(time.process_time() - began)
    return round(statistics.median(times) * 1e6, 1)


def code_state(root: Path = REPO) -> dict[str, Any]:
    """The code measured in checkout ``root``: its commit, the files of :data:`CODE_DIRS`
    changed on top of it, and a digest of those folders' Python files (compared at the
    start and the end of a run: others may be editing the tree meanwhile)."""
    def git(*args: str) -> str | None:
        result = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                text=True)
        return result.stdout.strip() if result.returncode == 0 else None

    digest = hashlib.sha256()
    for directory in CODE_DIRS:
        for path in sorted((root / directory).rglob("*.py")):
            digest.update(f"{path.relative_to(root)}\0".encode() + path.read_bytes())
    changed = (git("status", "--porcelain", "--", *CODE_DIRS) or "").splitlines()
    return {"dir": str(root), "commit": git("rev-parse", "HEAD"), "changed": changed,
            "sha256": digest.hexdigest()}


class Recording:
    """One benchmark run, from its start: what the header of its result needs to know
    (when it began, the CPU meanwhile, the code it measured at the start)."""

    def __init__(self, benchmark: str, code_root: Path = REPO) -> None:
        self.benchmark, self.code_root = benchmark, code_root
        self.code = code_state(code_root)
        self._began, self._cpu = time.monotonic(), cpu_times()

    def header(self, *, runs: int, caps: dict[str, Any]) -> dict[str, Any]:
        """The result's common fields (the module docstring lists them); ``caps`` states
        each link cap applied (:meth:`CappedCluster.caps` for the store's)."""
        return {
            "benchmark": self.benchmark,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": self.code["commit"],
            "dirty": bool(self.code["changed"]),
            "code": self.code,
            "code_changed_during_run":
                code_state(self.code_root)["sha256"] != self.code["sha256"],
            "machine": machine(),
            "caps": caps,
            "runs": runs,
            "cpu_busy": round(busy_fraction(self._cpu, cpu_times()), 3),
            "elapsed_s": round(time.monotonic() - self._began, 1),
        }


# -- the capped cluster ----------------------------------------------------------------------

class CappedCluster:
    """The HDFS cluster a store benchmark reads from, each DataNode's egress capped with tc
    (one link per DataNode), and any other server the benchmark runs (a registry, a package
    index) capped at the same rate on a class of its own.

    Objects live under ``<namenode>/bench`` (:attr:`url`). The cap is off while the
    cluster is written (:meth:`uncapped`: only reads are measured) and on otherwise once
    :meth:`cap_datanodes` was called; :meth:`stop` removes every cap and stops the cluster.
    """

    def __init__(self, work: Path, *, base_port: int, cap: LinkCap, block_size: int,
                 datanodes: int = 1, replication: int = 1, datanode_heap_mb: int | None = None,
                 capped_from_start: bool = False) -> None:
        heap = {} if datanode_heap_mb is None else {"datanode_heap_mb": datanode_heap_mb}
        self.link = cap
        self.cluster = Cluster(ClusterSpec.with_base_port(
            base_port, datanodes=datanodes, replication=replication, block_size=block_size,
            state_dir=work / "hdfs", link=cap if capped_from_start else None, **heap))
        self.url = f"{self.cluster.namenode_rpc_url}/bench"
        self._port_records: list[Path] = []

    def start(self) -> None:
        self.cluster.start()

    def cap_datanodes(self) -> None:
        """Cap the DataNodes' egress from now on."""
        self.cluster.set_link(self.link)

    @contextmanager
    def uncapped(self) -> Iterator[None]:
        """The DataNodes uncapped for the block (writing the inputs), capped after it."""
        self.cluster.set_link(None)
        try:
            yield
        finally:
            self.cluster.set_link(self.link)

    def cap_port(self, port: int, record: Path) -> None:
        """Cap the egress of another server's ``port`` at the same rate; ``record`` keeps
        what tc was given, for :meth:`stop` (and ``linkcap.describe``) to find."""
        apply_link_cap(self.link, [[port]], record)
        self._port_records.append(record)

    def caps(self, **others: str) -> dict[str, Any]:
        """The ``caps`` of a result: the DataNodes' cap, and what else it applies to."""
        return {"rate_bytes_per_s": self.link.rate_bytes_per_s, "delay_s": self.link.delay_s,
                "text": str(self.link),
                "per": f"DataNode (egress of its transfer port), each of "
                       f"{self.cluster.spec.datanodes}",
                **others}

    def stop(self) -> None:
        """Remove the other servers' caps and stop the cluster (which removes its own),
        the cluster even when a cap cannot be removed."""
        try:
            for record in self._port_records:
                remove_link_cap(record)
        finally:
            self.cluster.stop()

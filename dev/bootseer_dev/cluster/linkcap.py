"""Cap each DataNode's egress on `lo` with tc, so one machine behaves like a real network.

Layout (shared by every dev cluster on the machine, guarded by a file lock):

    lo root qdisc  htb handle 1b5e:  default 0   <- unclassified traffic bypasses shaping
      class 1b5e:<m>  htb rate R ceil R          <- one per DataNode of one cluster
        [qdisc netem delay D]                    <- only with a delay (needs sch_netem)
      filters (u32, prio P of this cluster): ip sport <port> -> 1b5e:<m>, per shaped port

Which ports: every byte a DataNode serves leaves its *data transfer* port exactly once.
RPC readers (hdfs:// stores) read it from there directly; a WebHDFS read is served by the DataNode's
HTTP (Netty) handler, which itself reads the block through a DFSClient from the same
DataNode's transfer port over loopback and then relays it from the HTTP port. Shaping the
HTTP port as well would therefore charge WebHDFS bytes twice to the same class (measured:
a 20 MB/s cap gave WebHDFS exactly 9.9 MB/s), so the cluster shapes the transfer port
only; apply_link_cap() still takes any list of ports per DataNode.

`default 0` keeps the rest of loopback (other services, the NameNode, client->DataNode
writes) unshaped. Each cluster records the classes and the filter priority it took in its
state dir and removes exactly those; the root qdisc goes only when no class is left.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from bootseer.filelock import file_lock

from .units import LinkCap

__all__ = ["LinkCapError", "TcRecord", "apply_link_cap", "remove_link_cap", "tc_available",
           "ROOT_HANDLE", "DEV"]

log = logging.getLogger(__name__)

DEV = "lo"
ROOT_MAJOR = 0x1B5E
ROOT_HANDLE = f"{ROOT_MAJOR:x}:"
LOCK_PATH = Path("/run/lock/bootseer-devcluster-tc.lock") if Path("/run/lock").is_dir() \
    else Path("/tmp/bootseer-devcluster-tc.lock")
FIRST_MINOR = 0x10
FIRST_PRIO = 10
# A GSO packet on lo is up to 64 KiB; htb needs burst and quantum above that to shape
# smoothly (and quantum <= 200000 to avoid "quantum is big" warnings).
MIN_BURST = 256 * 1024
QUANTUM = 131072


class LinkCapError(RuntimeError):
    """tc is missing, not permitted, or the kernel lacks a needed qdisc/classifier."""


@dataclass
class TcRecord:
    """What one cluster added to `lo`, saved as tc.json in its state dir."""

    dev: str
    prio: int
    classes: list[str]          # "1b5e:10", ...
    ports: list[list[int]]      # per DataNode: the source ports shaped into its class
    cap: dict

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> TcRecord | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def _tc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    tc = shutil.which("tc") or "/usr/sbin/tc"
    proc = subprocess.run([tc, *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise LinkCapError(f"`tc {' '.join(args)}` failed (rc={proc.returncode}): "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def tc_available() -> str | None:
    """None if tc can shape lo here, else the reason why not."""
    if not (shutil.which("tc") or Path("/usr/sbin/tc").exists()):
        return "tc not found (apt-get install iproute2)"
    if os.geteuid() != 0:
        return "tc needs root (CAP_NET_ADMIN) to change qdiscs on lo"
    proc = _tc("qdisc", "show", "dev", DEV, check=False)
    if proc.returncode != 0:
        return f"tc cannot read qdiscs on {DEV}: {proc.stderr.strip()}"
    return None


def _root_qdisc() -> str:
    for line in _tc("qdisc", "show", "dev", DEV).stdout.splitlines():
        if " root " in line:
            return line.strip()
    return ""


def _ensure_root() -> None:
    root = _root_qdisc()
    if root.startswith(f"qdisc htb {ROOT_HANDLE} "):
        return
    # Only replace the kernel's default root (noqueue on lo); never someone's own setup.
    if root and not re.match(r"qdisc (noqueue|pfifo_fast|fq_codel|mq) 0: ", root):
        raise LinkCapError(f"{DEV} already has a root qdisc we did not create ({root!r}); "
                           "refusing to replace it")
    _tc("qdisc", "add", "dev", DEV, "root", "handle", ROOT_HANDLE, "htb", "default", "0")
    log.info("added root qdisc htb %s on %s (default: unshaped)", ROOT_HANDLE, DEV)


def _used_minors() -> set[int]:
    out = _tc("class", "show", "dev", DEV).stdout
    return {int(m, 16) for m in re.findall(rf"class htb {ROOT_MAJOR:x}:([0-9a-f]+)", out)}


def _used_prios() -> set[int]:
    out = _tc("filter", "show", "dev", DEV, "parent", ROOT_HANDLE, check=False).stdout
    return {int(p) for p in re.findall(r"pref (\d+)", out)}


def _used_qdisc_majors() -> set[int]:
    out = _tc("qdisc", "show", "dev", DEV).stdout
    return {int(m, 16) for m in re.findall(r"qdisc \S+ ([0-9a-f]+):", out)}


def apply_link_cap(cap: LinkCap, ports: list[list[int]], record_path: Path) -> TcRecord:
    """Give every DataNode its own `cap` on the egress of its `ports` (one list per
    DataNode); record what was added in record_path so remove_link_cap() undoes exactly it."""
    reason = tc_available()
    if reason:
        raise LinkCapError(reason)
    rate_bit = int(cap.rate_bytes_per_s * 8)
    burst = max(MIN_BURST, int(cap.rate_bytes_per_s / 100))
    with file_lock(LOCK_PATH):
        _ensure_root()
        used, prios, majors = _used_minors(), _used_prios(), _used_qdisc_majors()
        prio = next(p for p in range(FIRST_PRIO, 65535) if p not in prios)
        record = TcRecord(dev=DEV, prio=prio, classes=[], ports=[list(p) for p in ports],
                          cap=cap.to_json())
        try:
            minor = FIRST_MINOR
            for dn_ports in ports:
                while minor in used:
                    minor += 1
                used.add(minor)
                classid = f"{ROOT_MAJOR:x}:{minor:x}"
                _tc("class", "add", "dev", DEV, "parent", ROOT_HANDLE, "classid", classid,
                    "htb", "rate", f"{rate_bit}bit", "ceil", f"{rate_bit}bit",
                    "burst", str(burst), "cburst", str(burst), "quantum", str(QUANTUM))
                record.classes.append(classid)
                record.save(record_path)  # so a failure half-way can still be undone
                if cap.delay_s:
                    major = next(m for m in range(0x2000, 0xFFFF) if m not in majors)
                    majors.add(major)
                    proc = _tc("qdisc", "add", "dev", DEV, "parent", classid, "handle",
                               f"{major:x}:", "netem", "delay", f"{cap.delay_s * 1e6:.0f}us",
                               "limit", "100000", check=False)
                    if proc.returncode != 0:
                        raise LinkCapError(
                            f"cannot add a netem delay ({proc.stderr.strip()}): this kernel "
                            "lacks sch_netem (CONFIG_NET_SCH_NETEM); use a rate-only --link")
                for port in dn_ports:
                    _tc("filter", "add", "dev", DEV, "parent", ROOT_HANDLE, "protocol", "ip",
                        "prio", str(prio), "u32", "match", "ip", "sport", str(port), "0xffff",
                        "flowid", classid)
            record.save(record_path)
        except Exception:
            _remove_locked(record)
            record_path.unlink(missing_ok=True)
            raise
    log.info("link cap %s per DataNode on %s: classes %s, filter prio %d", cap, DEV,
             record.classes, prio)
    return record


def _remove_locked(record: TcRecord) -> None:
    # Deleting a prio removes only our filters (each cluster has its own prio).
    if record.prio in _used_prios():
        _tc("filter", "del", "dev", record.dev, "parent", ROOT_HANDLE, "prio", str(record.prio),
            check=False)
    existing = _used_minors()
    for classid in record.classes:
        if int(classid.split(":")[1], 16) in existing:
            # Deleting a class also deletes the netem qdisc attached under it.
            _tc("class", "del", "dev", record.dev, "classid", classid, check=False)
    if not _used_minors() and not _used_prios() and \
            _root_qdisc().startswith(f"qdisc htb {ROOT_HANDLE} "):
        _tc("qdisc", "del", "dev", record.dev, "root", check=False)
        log.info("removed root qdisc %s on %s (no classes left)", ROOT_HANDLE, record.dev)


def remove_link_cap(record_path: Path) -> bool:
    """Remove what apply_link_cap recorded at record_path. True if there was something."""
    record = TcRecord.load(record_path)
    if record is None:
        return False
    with file_lock(LOCK_PATH):
        _remove_locked(record)
    record_path.unlink(missing_ok=True)
    log.info("removed link cap classes %s from %s", record.classes, record.dev)
    return True


def sent_bytes(record_path: Path) -> list[int]:
    """Bytes each DataNode's class has sent so far, in DataNode order (``tc -s``)."""
    record = TcRecord.load(record_path)
    if record is None:
        return []
    out = _tc("-s", "class", "show", "dev", record.dev, check=False).stdout
    sent: dict[str, int] = {}
    for block in re.split(r"\n(?=class )", out):
        head = re.match(r"class htb (\S+) ", block.strip())
        count = re.search(r"Sent (\d+) bytes", block)
        if head and count:
            sent[head[1]] = int(count[1])
    return [sent.get(classid, 0) for classid in record.classes]


def describe(record_path: Path) -> str:
    """`tc -s class show` lines for this cluster's classes (bytes sent per DataNode)."""
    record = TcRecord.load(record_path)
    if record is None:
        return ""
    out = _tc("-s", "class", "show", "dev", record.dev, check=False).stdout
    blocks = re.split(r"\n(?=class )", out)
    return "\n".join(b.strip() for b in blocks
                     if any(b.startswith(f"class htb {c} ") for c in record.classes))

"""Cap a lab member's link in both directions with tc htb, and read what passed.

A veth pair is one cable: what leaves one end arrives at the other. Egress is shaped on
the member's end (eth0 in its namespace), ingress as the egress of the peer end (in the
switch namespace), each with a root htb whose default class carries every packet at the
cap. This kernel has no sch_netem, so the lab adds no latency: transfer time is bytes over
rate, and anything latency-bound is faster here than in production.

Each qdisc is recorded before it is added and removed by `down` (deleting the lab's
namespaces would remove it anyway; removing it explicitly keeps the record honest).
"""

from __future__ import annotations

import re
import shutil
import subprocess

from bootseer_dev import netns
from bootseer_dev.cluster.linkcap import MIN_BURST, QUANTUM, LinkCapError
from bootseer_dev.cluster.units import LinkCap

from .state import Iface, LabState

__all__ = ["CLASSID", "cap_iface", "sent_bytes", "tc_available", "uncap_iface"]

ROOT = "1:"
CLASSID = "1:10"


def tc_available() -> str | None:
    """None if tc is installed, else why the lab cannot cap its links."""
    if not (shutil.which("tc") or shutil.which("/usr/sbin/tc")):
        return "tc not found (apt-get install iproute2)"
    return None


def _tc(iface: Iface, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["tc", "-n", iface.netns, *args], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise LinkCapError(f"`tc -n {iface.netns} {' '.join(args)}` failed "
                           f"(rc={proc.returncode}): {proc.stderr.strip()}")
    return proc


def cap_iface(iface: Iface, cap: LinkCap, state: LabState) -> None:
    """Every packet leaving iface at most cap.rate_bytes_per_s (bursts of 10 ms)."""
    rate = f"{int(cap.rate_bytes_per_s * 8)}bit"
    burst = str(max(MIN_BURST, int(cap.rate_bytes_per_s / 100)))
    state.add(state.qdiscs, iface)
    _tc(iface, "qdisc", "add", "dev", iface.dev, "root", "handle", ROOT, "htb", "default",
        CLASSID.split(":")[1])
    _tc(iface, "class", "add", "dev", iface.dev, "parent", ROOT, "classid", CLASSID, "htb",
        "rate", rate, "ceil", rate, "burst", burst, "cburst", burst, "quantum", str(QUANTUM))


def uncap_iface(iface: Iface) -> None:
    """Remove the root qdisc cap_iface added (and its class), if it is still there."""
    if netns.exists(iface.netns):
        out = _tc(iface, "qdisc", "show", "dev", iface.dev, "root", check=False).stdout
        if out.startswith(f"qdisc htb {ROOT} "):
            _tc(iface, "qdisc", "del", "dev", iface.dev, "root", check=False)


def sent_bytes(iface: Iface) -> int:
    """Bytes the cap's class on iface has sent (tc's own counter)."""
    out = _tc(iface, "-s", "class", "show", "dev", iface.dev, "classid", CLASSID).stdout
    m = re.search(r"Sent (\d+) bytes", out)
    if not m:
        raise LinkCapError(f"no htb class {CLASSID} on {iface.dev} in {iface.netns}: {out!r}")
    return int(m.group(1))

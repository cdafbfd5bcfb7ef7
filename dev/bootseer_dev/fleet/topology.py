"""The lab's network: a switch namespace with one bridge, every member in a namespace of
its own, joined to the bridge by a veth pair.

Why the bridge lives in a namespace of its own and not in the host's: nothing of the lab
then touches the host's network. The host has no address on the lab segment and no veth
end, so a node cannot reach any host service (not even through 127.0.0.1, which in a node
namespace is the node's own loopback), the host's routes, firewall and forwarding settings
do not matter, and deleting the lab's namespaces removes every link with them. The veths
are created with both ends already in their namespaces, so not even a transient interface
appears in the host's namespace. IPv6 is turned off in every lab namespace, so the only
traffic is IPv4 inside 198.18.0.0/15 (no default route, no NAT, nothing forwarded).
"""

from __future__ import annotations

import logging
import subprocess

from bootseer_dev import netns

from .spec import LAB_NET, LabSpec, Member
from .state import Iface, LabState

__all__ = ["BRIDGE", "NODE_DEV", "build", "teardown"]

log = logging.getLogger(__name__)

BRIDGE = "br0"
#: Every member's one interface, inside its namespace.
NODE_DEV = "eth0"


class TopologyError(RuntimeError):
    """A namespace or link could not be made; the message says which and why."""


def _new_netns(state: LabState, name: str) -> None:
    if netns.exists(name):
        raise TopologyError(f"network namespace {name} already exists: a lab of this name "
                            "was not taken down (run `down` with its state dir) or another "
                            "lab uses the name (pick another --name)")
    state.add(state.namespaces, name)
    netns.add(name)
    # Link-local IPv6 would be a second, unplanned network; keep the lab IPv4-only.
    subprocess.run([*netns.enter_argv(name), "sysctl", "-qw",
                    "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv6.conf.default.disable_ipv6=1"],
                   check=True, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)


def _plug(spec: LabSpec, state: LabState, member: Member) -> None:
    """Member's namespace, its veth to the switch, its address (and only its /15 route)."""
    _new_netns(state, member.netns)
    state.add(state.links, Iface(member.netns, NODE_DEV))
    netns.ip("link", "add", "name", NODE_DEV, "netns", member.netns, "type", "veth",
             "peer", "name", member.port, "netns", spec.switch_netns)
    netns.ip("link", "set", member.port, "master", BRIDGE, "up", netns=spec.switch_netns)
    netns.ip("addr", "add", f"{member.address}/{LAB_NET.prefixlen}", "dev", NODE_DEV,
             netns=member.netns)
    netns.ip("link", "set", NODE_DEV, "up", netns=member.netns)


def build(spec: LabSpec, state: LabState) -> None:
    """The switch and every member of spec, recorded in state as they are made."""
    _new_netns(state, spec.switch_netns)
    state.add(state.links, Iface(spec.switch_netns, BRIDGE))
    netns.ip("link", "add", BRIDGE, "type", "bridge", netns=spec.switch_netns)
    netns.ip("link", "set", BRIDGE, "up", netns=spec.switch_netns)
    for member in spec.members():
        _plug(spec, state, member)
    log.info("lab network: %d namespaces on bridge %s in %s", len(spec.members()), BRIDGE,
             spec.switch_netns)


def teardown(state: LabState) -> None:
    """Delete the recorded links, then the recorded namespaces (whatever still exists).

    Links go first so that a namespace some stray process still holds open (its record
    is gone, but the kernel keeps the namespace alive) no longer connects to anything.
    """
    for iface in reversed(state.links):
        if netns.exists(iface.netns):
            # The peer of a veth already deleted is gone too: "Cannot find device" is fine.
            netns.ip("link", "del", "dev", iface.dev, netns=iface.netns, check=False)
    for name in reversed(state.namespaces):
        if netns.delete(name):
            log.info("deleted network namespace %s", name)

"""What the fleet lab needs of the machine (network namespaces, tc), checked before a test
builds one: shared by the lab's own tests and the p2p warm through it."""

from __future__ import annotations

from bootseer_dev import netns
from bootseer_dev.fleet import shaping
from support.ci import require


def need_lab_tools() -> None:
    """Fail under CI, skip elsewhere, when this machine cannot run the fleet lab."""
    require(netns.netns_available() or shaping.tc_available(), "the fleet lab")

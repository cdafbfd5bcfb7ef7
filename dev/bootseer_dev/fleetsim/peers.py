"""Where a node's bytes from its job's other nodes come from: a share of each one's uplink.

A swarm (``bootseer warm --job J --nodes N``: the agents' libtorrent session) is the M
nodes that read the same part of an artifact. Member k reads pieces p % M == k from the
store and every other piece from the members that read it, so a node receives
(M - 1) / M of the artifact from the others, in equal parts, and sends about as much.

At flow level that is one flow per node: over its own NIC (down), and over every other
member's uplink (``nic_up``, and the upload cap's link when ``p2p.upload_rate`` is set)
at a share 1 / (M - 1) of its rate (:mod:`.network`'s partial crossings). For a class of
nodes (:mod:`.restart`), the flow crosses class d's uplinks at (members of d, less
itself if d is its own class) / (M - 1): summed over the classes, each node's uplink
then carries exactly what the node receives, as in a symmetric swarm. A class's flow
crosses at most one link per class of the swarm, so 1,000 nodes in a few classes stay
cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .network import Link

if TYPE_CHECKING:
    from .placement import Layout
    from .restart import Fetch


@dataclass(frozen=True)
class Swarms:
    """The nodes' uplinks by class, and which classes share which part of an artifact."""

    layout: Layout
    classes: list[list[int]]  # the nodes of each class (each in one swarm per artifact)
    uplinks: list[Link]  # each class's NIC uplinks (nic_up)
    caps: list[Link] | None = None  # each class's upload cap to peers; None: no cap

    def path(self, fetch: Fetch, index: int) -> tuple[list[Link], list[float]]:
        """The links the peer flow of class ``index`` crosses for ``fetch`` (not its own
        NIC), and its share of each: every class of its swarm but a lone itself."""
        node = self.classes[index][0]
        part, swarm = node % fetch.pieces, self.layout.members(fetch, node)
        links: list[Link] = []
        shares: list[float] = []
        for other, members in enumerate(self.classes):
            senders = len(members) - (other == index)
            if members[0] % fetch.pieces != part or senders == 0:
                continue
            share = senders / (swarm - 1)
            for link in [self.uplinks[other]] + ([self.caps[other]] if self.caps else []):
                links.append(link)
                shares.append(share)
        return links, shares

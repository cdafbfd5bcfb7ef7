"""A peer's address: an IP literal and a TCP port, checked before anything dials it.

Peer addresses arrive from places that may be hostile (a rendezvous record any node of the
job could have written, a list a scheduler passed on a command line), so they are parsed
with :mod:`ipaddress` and never resolved: a host name would make every node ask DNS, and
an address must name exactly one machine. One member per address: the swarm tells peers
apart by IP (a peer that connects to us does so from an ephemeral port).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from bootseer.errors import BootseerError


class PeerAddressError(BootseerError, ValueError):
    """A peer address is not an IP literal with a port in 1-65535."""


@dataclass(frozen=True, order=True)
class Peer:
    """One member of a job's swarm, as peers dial it."""

    address: str  # an IP literal in its canonical form ("198.18.64.2", "fd00::2")
    port: int

    def __post_init__(self) -> None:
        try:
            canonical = str(ipaddress.ip_address(self.address))
        except ValueError:
            raise PeerAddressError(f"{self.address!r} is not an IP address") from None
        if canonical != self.address:
            raise PeerAddressError(f"{self.address!r} is not in canonical form "
                                   f"({canonical!r})")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or \
                not 0 < self.port < 65536:
            raise PeerAddressError(f"port {self.port!r} of {self.address} is not in 1-65535")

    @classmethod
    def of(cls, address: str, port: int) -> Peer:
        """A peer from any spelling of its IP address (canonicalized)."""
        try:
            return cls(str(ipaddress.ip_address(address)), port)
        except ValueError:
            raise PeerAddressError(f"{address!r} is not an IP address") from None

    @classmethod
    def parse(cls, text: str) -> Peer:
        """``"198.18.64.2:6881"`` or ``"[fd00::2]:6881"``."""
        host, sep, port = text.strip().rpartition(":")
        if not sep or not port.isdigit() or len(port) > 5:
            raise PeerAddressError(f"{text!r} is not ADDRESS:PORT")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            raise PeerAddressError(f"{text!r}: an IPv6 address goes in brackets, "
                                   f"[ADDRESS]:PORT")
        return cls.of(host, int(port))

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"


def parse_peers(text: str) -> list[Peer]:
    """A peer list as a scheduler passes it: addresses separated by commas or spaces."""
    return sorted({Peer.parse(item) for item in text.replace(",", " ").split()})

"""Who is a node of the job: the holder of the operator's peer key, on the job's networks.

A node's swarm serves checkpoint bytes a local user may not read, and believes records
(who the job's members are, a checkpoint's piece hashes) that anyone who can write the
store could have written. Neither a store writer, nor a container, nor a member of the
agent socket's group, nor a host that merely reaches a node's port may be trusted with
either, so both rest on one secret the operator provisions to every node's agent
(``p2p.key_file``, root's alone):

* **Records are authenticated.** Peer records and the piece hashes of shared files carry
  an HMAC-SHA256 tag (:meth:`PeerKey.tag`) over what they say and where they are filed; a
  record whose tag does not verify is skipped as if it were not there, so the bytes it
  would have vouched for come from the store.
* **Connections are authenticated.** Each torrent enters the session with its info
  dictionary extended by ``bootseer auth``, a tag of its public info-hash
  (:meth:`Trust.swarm_tag`), so the info-hash peers must name is known to key holders
  only; the session forces BitTorrent's protocol encryption, whose handshake proves
  knowledge of that info-hash without sending it, and encrypts the payload (RC4) with it.
  A peer without the key can neither ask for a piece nor read one off the wire, whatever
  the torrent in the store says.
* **Addresses are the operator's.** The swarm dials and answers addresses in
  ``p2p.networks`` only (:class:`Networks`), never a loopback, link-local, unspecified,
  multicast or reserved one, whatever a record or a list names.

A node whose root is compromised holds the key: the key's trust is the nodes' own.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bootseer.config import P2PConfig
from bootseer.errors import BootseerError, ConfigError

#: The shortest key accepted: 256 bits of the operator's randomness.
MIN_KEY_BYTES = 32
MAX_KEY_BYTES = 4096
TAG_BYTES = 32  # HMAC-SHA256

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class PeerKeyError(BootseerError):
    """The peer key file is missing or unsafe: peer-to-peer cannot start."""


class PeerKey:
    """The operator's secret shared by a cluster's agents: tags records and torrents."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_KEY_BYTES:
            raise PeerKeyError(f"a peer key has at least {MIN_KEY_BYTES} bytes")
        self._secret = secret

    def __repr__(self) -> str:
        return "PeerKey(...)"

    @classmethod
    def load(cls, path: Path) -> PeerKey:
        """The key in ``path``: a regular file of root's (or this user's), readable by
        its owner only; anything else is refused, saying how to make one."""
        make = (f"create it on every node of the cluster with the same bytes, e.g. "
                f"`install -m 0600 /dev/null {path} && head -c 32 /dev/urandom > {path}` "
                f"on one node, then copy it (p2p.key_file)")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise PeerKeyError(f"p2p: no peer key at {path}: {make}") from None
        except OSError as exc:
            raise PeerKeyError(f"p2p: cannot open the peer key {path} ({exc.strerror}): "
                               f"it must be a plain file, not a link") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise PeerKeyError(f"p2p: the peer key {path} is not a regular file")
            if info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o077:
                raise PeerKeyError(
                    f"p2p: the peer key {path} must be owned by root and readable by its "
                    f"owner only (chown root {path} && chmod 0600 {path})")
            secret = os.read(fd, MAX_KEY_BYTES + 1)
        finally:
            os.close(fd)
        if not MIN_KEY_BYTES <= len(secret) <= MAX_KEY_BYTES:
            raise PeerKeyError(f"p2p: the peer key {path} has {len(secret)} bytes, not "
                               f"{MIN_KEY_BYTES}-{MAX_KEY_BYTES}: {make}")
        return cls(secret)

    def tag(self, domain: str, *parts: bytes | str | int) -> bytes:
        """HMAC-SHA256 of ``parts`` for the use ``domain`` (each part length-prefixed:
        no two different lists of parts, nor uses, give the same input)."""
        mac = hmac.new(self._secret, domain.encode() + b"\0", hashlib.sha256)
        for part in parts:
            data = part if isinstance(part, bytes) else str(part).encode()
            mac.update(len(data).to_bytes(8, "big") + data)
        return mac.digest()


#: Addresses no record or list may make a node dial, whatever p2p.networks says.
_NEVER = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
    "::/128", "::1/128", "fe80::/10", "ff00::/8"))


@dataclass(frozen=True)
class Networks:
    """``p2p.networks``: where peers may be."""

    networks: tuple[IPNetwork, ...]

    @classmethod
    def parse(cls, cidrs: Iterable[str]) -> Networks:
        try:
            return cls(tuple(ipaddress.ip_network(c, strict=False) for c in cidrs))
        except ValueError as exc:
            raise ConfigError(f"p2p.networks: {exc}") from None

    def allows(self, address: str) -> bool:
        """Whether a peer at ``address`` (an IP literal) may be dialed or answered."""
        try:
            ip: IPAddress = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return not any(ip in never for never in _NEVER) and \
            any(ip in network for network in self.networks)

    def rules(self) -> list[tuple[str, str, bool]]:
        """(first, last, allowed) address ranges, the later overriding the earlier: all
        refused, ``networks`` allowed, the never-dialed refused again (an IP filter)."""
        rules = [("0.0.0.0", "255.255.255.255", False),
                 ("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", False)]
        rules += [(str(n[0]), str(n[-1]), True) for n in self.networks]
        rules += [(str(n[0]), str(n[-1]), False) for n in _NEVER]
        return rules


@dataclass(frozen=True)
class Trust:
    """A node's peer key and the networks its peers are on."""

    key: PeerKey = field(repr=False)
    networks: Networks

    @classmethod
    def from_config(cls, config: P2PConfig) -> Trust:
        if not config.networks:
            raise ConfigError("p2p.networks is empty: list the networks the job's nodes "
                              "reach each other on (e.g. networks = [\"10.0.3.0/24\"])")
        return cls(PeerKey.load(config.key_file), Networks.parse(config.networks))

    def swarm_tag(self, info_hash: bytes) -> bytes:
        """What a torrent's info dictionary gains in this cluster's swarms: only key
        holders know the resulting info-hash, hence can connect for it."""
        return self.key.tag("swarm", info_hash)

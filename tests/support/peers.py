"""The addresses of in-process swarms: a link of their own (the ``local_peer_key`` fixture
adds it), so a swarm never dials loopback."""

from __future__ import annotations

LOCAL_PEER_NET = "198.19.254.0/24"
LOCAL_PEERS = tuple(f"198.19.254.{i}" for i in range(1, 5))

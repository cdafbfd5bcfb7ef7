"""One checkpoint mount's server: a store directory served read-only through the one FUSE
layer, what ``bootseer ckpt mount --foreground`` runs.

:class:`ServerOptions` is the server's whole contract with whoever starts it (``bootseer
ckpt mount`` for a user, the node agent for a container): it builds the server's command
line, once, for both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bootseer.config import Config
from bootseer.fuse.server import serve as serve_connection
from bootseer.fuse.server import serve_at
from bootseer.fuse.tree import ROOT
from bootseer.stripedfs.checkpoint_cache import CheckpointCache
from bootseer.stripedfs.config import StripeConfig
from bootseer.stripedfs.files import CheckpointSource, PeerFiles
from bootseer.stripedfs.tree import CheckpointTree


@dataclass(frozen=True)
class ServerOptions:
    mode: int  # the widest permission bits files show (checkpoint.mount_mode)
    memory: int  # stripe memory across all open files (checkpoint.mount_memory)
    metadata_ttl: float = 30.0  # seconds a listing is kept
    direct_io: bool = True  # reads bypass the page cache (measured faster for big files)
    #: Serve this already-mounted /dev/fuse connection (held by the agent, so it survives
    #: its server) instead of mounting one; the two paths below go with it.
    fuse_fd: int | None = None
    takeover_state: Path | None = None
    ready_file: Path | None = None  # created once the store is open and listed
    #: A job whose nodes share their staged checkpoints (peer-to-peer): stripes are asked
    #: of the node agent on ``agent_socket`` first, which reads them from the job's peers.
    peer_job: str | None = None
    agent_socket: Path | None = None

    def argv(self, bootseer: list[str], url: str, mountpoint: Path) -> list[str]:
        """The server's command line; ``bootseer`` is how the caller runs Bootseer."""
        args = [*bootseer, "ckpt", "mount", "--foreground", "--mode", f"{self.mode:o}",
                "--memory", str(self.memory), "--metadata-ttl", str(self.metadata_ttl),
                "--direct-io" if self.direct_io else "--page-cache"]
        for flag, value in (("--fuse-fd", self.fuse_fd),
                            ("--takeover-state", self.takeover_state),
                            ("--ready-file", self.ready_file),
                            ("--peer-job", self.peer_job),
                            ("--agent-socket", self.agent_socket)):
            if value is not None:
                args += [flag, str(value)]
        return [*args, "--", url, str(mountpoint)]


def serve(config: Config, url: str, mountpoint: Path, options: ServerOptions,
          peers: PeerFiles | None = None) -> None:
    """Serve the store directory ``url`` at ``mountpoint`` until it is unmounted: stores
    opened as ``config`` says, and the node's staged copies where this process may read
    them (they are root's, the agent's cache); ``peers`` (with ``options.peer_job``)
    reads stripes through the node's peers."""
    copies = CheckpointCache.for_config(config) if os.geteuid() == 0 else None
    tree = CheckpointTree(CheckpointSource(config).store(url),
                          config=StripeConfig(max_memory=options.memory), copies=copies,
                          ttl=options.metadata_ttl, mode=options.mode,
                          direct_io=options.direct_io, peers=peers)
    if options.fuse_fd is None:
        serve_at(tree, mountpoint, f"bootseer:{url}")
        return
    tree.node(ROOT)  # the store answers: list it before saying so
    if options.ready_file is not None:
        options.ready_file.touch()
    serve_connection(tree, options.fuse_fd, takeover_state=options.takeover_state)

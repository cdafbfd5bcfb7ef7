"""One checkpoint mount's server: a store directory served read-only through the one FUSE
layer, given its spec (:class:`bootseer.stripedfs.serverspec.CheckpointServerSpec`, which
:mod:`bootseer.serve` carries to the server process)."""

from __future__ import annotations

import os

from bootseer.fuse.server import serve as serve_connection
from bootseer.fuse.server import serve_at
from bootseer.fuse.tree import ROOT
from bootseer.stripedfs.checkpoint_cache import CheckpointCache
from bootseer.stripedfs.files import CheckpointSource, PeerFiles
from bootseer.stripedfs.serverspec import CheckpointServerSpec
from bootseer.stripedfs.tree import CheckpointTree


def serve(spec: CheckpointServerSpec, peers: PeerFiles | None = None) -> None:
    """Serve the store directory ``spec.url`` until it is unmounted: stores opened as
    ``spec.config`` says, and the node's staged copies where this process may read them
    (they are root's, the agent's cache); ``peers`` (with ``spec.peer_job``) reads
    stripes through the node's peers."""
    copies = CheckpointCache.for_config(spec.config) if os.geteuid() == 0 else None
    tree = CheckpointTree(CheckpointSource(spec.config).store(spec.url), config=spec.stripes,
                          copies=copies, ttl=spec.metadata_ttl, mode=spec.mode,
                          direct_io=spec.direct_io, peers=peers)
    if spec.fuse_fd is None:
        serve_at(tree, spec.mountpoint, spec.fsname)
        return
    tree.node(ROOT)  # the store answers: list it before saying so
    if spec.ready_file is not None:
        spec.ready_file.touch()
    serve_connection(tree, spec.fuse_fd, takeover_state=spec.takeover_state)

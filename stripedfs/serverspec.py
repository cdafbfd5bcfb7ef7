"""What a checkpoint mount's FUSE server is told: its whole contract with whoever starts it.

:class:`CheckpointServerSpec` holds everything the server needs (the node's configuration,
for the stores and the staged copies, and the striped reader's knobs): the server reads
no config file and no command line. ``bootseer ckpt mount`` and the node agent build one;
:mod:`bootseer.serve` carries it to the server process as JSON;
:func:`bootseer.stripedfs.server.serve` serves it. Kept apart from the server so that
building a spec imports no FUSE or store code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from bootseer.config import Config
from bootseer.stripedfs.config import StripeConfig


@dataclass(frozen=True)
class CheckpointServerSpec:
    """Serve the store directory ``url`` read-only at ``mountpoint`` (or on ``fuse_fd``)."""

    KIND: ClassVar[str] = "checkpoint"

    config: Config  # the node's: its stores' options, its staged copies
    url: str
    mountpoint: Path
    mode: int  # the widest permission bits files show (checkpoint.mount_mode)
    stripes: StripeConfig  # max_memory: across all open files (checkpoint.mount_memory)
    metadata_ttl: float = 30.0  # seconds a listing is kept
    direct_io: bool = True  # reads bypass the page cache (measured faster for big files)
    #: Serve this already-mounted /dev/fuse connection (held by the agent, so it survives
    #: its server) instead of mounting one; the two paths below go with it.
    fuse_fd: int | None = None
    takeover_state: Path | None = None
    ready_file: Path | None = None  # created once the store is open and listed
    #: A job whose nodes share their staged checkpoints (peer-to-peer): stripes are asked
    #: of the node agent on ``agent_socket`` (default: the config's) first, which reads
    #: them from the job's peers.
    peer_job: str | None = None
    agent_socket: Path | None = None

    @classmethod
    def of(cls, config: Config, url: str, mountpoint: Path, *, mode: int | None = None,
           memory: int | None = None, **options: Any) -> CheckpointServerSpec:
        """A spec for the node ``config`` describes: its mount mode and memory (unless
        given) and its striped reader's knobs; ``options`` set the other fields."""
        cfg = config.checkpoint
        stripes = dataclasses.replace(StripeConfig.from_config(config),
                                      max_memory=cfg.mount_memory if memory is None else memory)
        return cls(config=config, url=url, mountpoint=mountpoint,
                   mode=cfg.mount_mode if mode is None else mode, stripes=stripes, **options)

    @property
    def what(self) -> str:
        return f"checkpoint {self.url}"

    @property
    def source(self) -> str:
        return self.url

    @property
    def fsname(self) -> str:
        return f"bootseer:{self.url}"

    def takeover(self) -> CheckpointServerSpec:
        """The spec of a server that takes this one's connection over: the same (files
        stay open; the new server re-creates their readers on their next read)."""
        return self

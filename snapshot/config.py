"""The knobs of snapshotting, named after what they do, built once from ``[snapshot]``.

Packing (:func:`bootseer.snapshot.pack.build_manifest`), restoring
(:func:`bootseer.snapshot.restore.restore`) and staging
(:func:`bootseer.snapshot.stage.stage_snapshot`) take one :class:`SnapshotOptions`
instead of loose scalars, so a default is written once: here, from the config file's
defaults (:class:`bootseer.config.SnapshotConfig`, where each one's reason is given).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bootseer.config import SnapshotConfig, default_snapshot_concurrency


@dataclass(frozen=True)
class SnapshotOptions:
    """How snapshots are cut, compressed, and packed, restored or staged in parallel."""

    #: Content bytes per shard: shards are restored in parallel.
    shard_size: int = SnapshotConfig.shard_size
    #: zstd level of the shards (packed once, restored at every restart).
    compression_level: int = SnapshotConfig.compression_level
    #: Shards packed, restored or staged at once.
    concurrency: int = field(default_factory=default_snapshot_concurrency)
    #: Compile captured .py files before snapshotting.
    bytecode: bool = SnapshotConfig.bytecode
    #: Restore as root by mounting the node's unpacked tree; a warm as root unpacks it.
    mount: bool = SnapshotConfig.mount

    @classmethod
    def from_config(cls, section: SnapshotConfig) -> SnapshotOptions:
        """The options the config file's ``[snapshot]`` section sets."""
        return cls(section.shard_size, section.compression_level, section.concurrency,
                   section.bytecode, section.mount)

"""The knobs of the striped reader, named after what they do (the mountpoint-s3 way)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from bootseer.config import Config
from bootseer.errors import ConfigError

MIB = 1 << 20


@dataclass(frozen=True)
class StripeConfig:
    """How a file is cut into stripes and how far ahead the reader fetches them.

    Each knob is settable in the config file's ``[checkpoint]`` table under its own name
    (``checkpoint.stripe_size = "8m"``); :meth:`from_config` reads them.
    """

    #: Bytes fetched by one ranged read. Big enough that a request's fixed cost (a
    #: NameNode lookup, a DataNode connection) is small next to its transfer, small enough
    #: that a 128 MiB HDFS block is served by many DataNode streams at once. Stripes never
    #: span an HDFS block boundary, so each is served by one DataNode.
    stripe_size: int = 4 * MIB
    #: Ranged reads in flight at once, per process. Several per DataNode keeps every link
    #: busy while a request is being set up (each is a NameNode lookup and a DataNode
    #: connection). Chosen by bench-ckpt's sweep (4 DataNodes at 40 MB/s, 2 GiB, 4 MiB
    #: stripes): 8, 16, 32 and 64 in flight read in 22.1, 18.8, 17.6 and 15.7 s; stripes of
    #: 2-16 MiB were within 6% of one another.
    max_concurrent_fetches: int = 64
    #: Positional reads of a local file (a staged copy, a ``file://`` object) in flight at
    #: once, per load. From the page cache a read is a memory copy, CPU work: more readers
    #: than cores only contend. 0: one per core. On a 16-core H200 node (4 GiB from the
    #: page cache onto the GPU in 16 MiB reads) 8, 16, 32 and 64 loaded at 26, 32, 26 and
    #: 26 GB/s; cold, 16 read as fast as 64 (the disk's queue is full either way).
    max_concurrent_local_reads: int = 0
    #: Read-ahead after the first read, and after every seek: two stripes, so a reader that
    #: turns out to be sequential already has its next stripe on the way.
    initial_read_window: int = 8 * MIB
    #: While reads stay sequential the window grows by this factor per read...
    sequential_window_multiplier: int = 2
    #: ...up to this size: twice what max_concurrent_fetches keeps in flight, so that a
    #: slow stripe at the front does not stop the fetches behind it.
    max_read_window: int = 512 * MIB
    #: A forward jump up to this far still counts as sequential (the bytes are probably in
    #: the window already); anything else is a seek that resets the window.
    max_forward_seek_distance: int = 16 * MIB
    #: A step back this far still counts as sequential too, and the stripes it spans are
    #: kept: a FUSE mount answers a file's requests (up to 1 MiB each) on 8 threads while
    #: the kernel's read-ahead keeps several in flight, so they arrive up to ~8 MiB out of
    #: order. At 1 MiB, a page-cache mount read a 2 GiB file 2.5 times over (each late
    #: request reset the window and dropped the stripes read ahead).
    max_backward_seek_distance: int = 8 * MIB
    #: Memory cap for stripes, fetched or in flight, across every reader of the process:
    #: a FUSE server's open files share it, so a hundred open handles cost what one does.
    #: Read-ahead stops where it would exceed it; a read waits for memory, taking it back
    #: from read-ahead nobody is reading.
    max_memory: int = 1024 * MIB
    #: Attempts per stripe before a read fails; transient errors (a DataNode restarting,
    #: a dropped connection) are retried with exponential backoff from retry_initial_delay.
    max_attempts: int = 4
    retry_initial_delay: float = 0.1

    def __post_init__(self) -> None:
        if self.stripe_size <= 0 or self.max_concurrent_fetches <= 0:
            raise ValueError("stripe_size and max_concurrent_fetches must be positive")
        if self.max_concurrent_local_reads < 0:
            raise ValueError("max_concurrent_local_reads must be 0 (one per core) or more")
        if not self.stripe_size <= self.initial_read_window <= self.max_read_window:
            raise ValueError("need stripe_size <= initial_read_window <= max_read_window")
        if self.max_memory < 2 * self.stripe_size or self.max_attempts < 1:
            raise ValueError("max_memory must hold two stripes; max_attempts must be >= 1")

    @property
    def local_reads(self) -> int:
        """Local reads in flight at once: :attr:`max_concurrent_local_reads`, or one per
        core this process may run on."""
        return self.max_concurrent_local_reads or len(os.sched_getaffinity(0))

    @classmethod
    def from_config(cls, config: Config) -> StripeConfig:
        """The knobs ``config``'s ``[checkpoint]`` table sets, defaults for the rest."""
        table = config.checkpoint
        knobs = {f.name: getattr(table, f.name) for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in knobs.items() if v is not None})
        except ValueError as exc:
            raise ConfigError(f"checkpoint: {exc}") from exc

"""One FUSE layer: a read-only tree interface (:mod:`.tree`) served on ``/dev/fuse`` by our
own protocol server (:mod:`.server`), on a connection mounted by root or by fusermount3
(:mod:`.connection`). Lazy images and checkpoint directories are both served this way."""

from __future__ import annotations

from bootseer.errors import BootseerError


class FuseError(BootseerError):
    """A FUSE mount could not be made or served (no /dev/fuse, no fusermount3, a dead fd)."""

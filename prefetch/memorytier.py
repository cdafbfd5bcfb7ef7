"""Verified blocks kept in memory, in front of the node's disk cache; two bounded parts.

* **recent**: the last ``recent_blocks`` blocks read, least recently used out first. FUSE
  reads 128 KiB at a time, so a 2 MiB block is asked for many times in a row: it stays here
  rather than being read back, and verified again, from the disk cache for every request.
* **prefetched**: blocks the prefetcher fetched and nobody has read yet, up to
  ``prefetch_bytes``, oldest out first (they are on disk too). The first read of such a
  block then costs neither a disk read nor a second digest check; it moves to *recent*.
  Prefetched blocks never enter *recent* on their own: they must not push out the blocks
  being read.

Everything here was verified before it came in; the tier only keeps and forgets.
"""

from __future__ import annotations

import threading
from collections import OrderedDict


class MemoryTier:
    def __init__(self, recent_blocks: int = 32, prefetch_bytes: int = 512 << 20) -> None:
        self.recent_blocks, self.prefetch_bytes = recent_blocks, prefetch_bytes
        self._recent: OrderedDict[str, bytes] = OrderedDict()
        self._prefetched: OrderedDict[str, bytes] = OrderedDict()
        self._prefetched_size = 0
        self._lock = threading.Lock()

    def get(self, digest: str) -> bytes | None:
        """The block, if either part has it; a prefetched one moves to *recent*."""
        with self._lock:
            data = self._recent.get(digest)
            if data is not None:
                self._recent.move_to_end(digest)
                return data
            data = self._prefetched.pop(digest, None)
            if data is not None:
                self._prefetched_size -= len(data)
                self._keep_recent(digest, data)
            return data

    def peek(self, digest: str) -> bytes | None:
        """The block, if either part has it, moving nothing: a look that is not a read."""
        with self._lock:
            data = self._recent.get(digest)
            return data if data is not None else self._prefetched.get(digest)

    def put_read(self, digest: str, data: bytes) -> None:
        """A block being read (fetched, or found in the disk cache)."""
        with self._lock:
            self._keep_recent(digest, data)

    def put_prefetched(self, digest: str, data: bytes) -> None:
        """A block the prefetcher fetched: kept until read or pushed out by newer ones."""
        if len(data) > self.prefetch_bytes:
            return
        with self._lock:
            if digest in self._recent or digest in self._prefetched:
                return
            self._prefetched[digest] = data
            self._prefetched_size += len(data)
            while self._prefetched_size > self.prefetch_bytes:
                _, old = self._prefetched.popitem(last=False)
                self._prefetched_size -= len(old)

    def __contains__(self, digest: str) -> bool:
        with self._lock:
            return digest in self._recent or digest in self._prefetched

    def _keep_recent(self, digest: str, data: bytes) -> None:
        self._recent[digest] = data
        self._recent.move_to_end(digest)
        while len(self._recent) > self.recent_blocks:
            self._recent.popitem(last=False)

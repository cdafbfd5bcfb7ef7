"""The node's local block cache: verified image blocks on disk, bounded, LRU, crash-safe.

A block file is written under ``tmp/``, then renamed to ``blocks/<2 hex>/<64 hex>``: a
killed process leaves at most a temporary, which the next start removes. Blocks enter the
cache only after their digest was checked, and are checked again when read back (a disk
or a power loss can still damage a file after the rename), so a cache hit is never
trusted blindly. When the cache grows past ``max_bytes``, the least recently used blocks
go first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger(__name__)


class BlockCache:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory, self.max_bytes = Path(directory), max_bytes
        self._blocks = self.directory / "blocks"
        self._tmp = self.directory / "tmp"
        self._lru: OrderedDict[str, int] = OrderedDict()  # digest -> size, oldest first
        self._lock = threading.Lock()
        self.size = 0
        self._load()

    def _path(self, digest: str) -> Path:
        return self._blocks / digest[:2] / digest

    def _load(self) -> None:
        """Rebuild the LRU from disk (oldest access first); drop what a crash left behind."""
        self._tmp.mkdir(parents=True, exist_ok=True)
        for leftover in self._tmp.iterdir():
            leftover.unlink(missing_ok=True)
        found = []
        for path in self._blocks.glob("*/*") if self._blocks.is_dir() else ():
            st = path.stat()
            found.append((st.st_atime, path.name, st.st_size))
        for _, digest, size in sorted(found):
            self._lru[digest] = size
            self.size += size

    def __contains__(self, digest: str) -> bool:
        with self._lock:
            return digest in self._lru

    def get(self, digest: str) -> bytes | None:
        """The block's bytes, or None if absent or damaged (a damaged file is removed)."""
        with self._lock:
            if digest not in self._lru:
                return None
            self._lru.move_to_end(digest)
        try:
            data = self._path(digest).read_bytes()
        except FileNotFoundError:
            data = None
        if data is None or hashlib.sha256(data).hexdigest() != digest:
            log.warning("cached block %s is missing or damaged; dropping it", digest)
            self._forget(digest)
            return None
        return data

    def put(self, digest: str, data: bytes) -> None:
        """Add a block whose digest the caller has verified."""
        with self._lock:
            if digest in self._lru:
                return
        tmp = self._tmp / f"{digest}.{secrets.token_hex(4)}"
        with open(tmp, "wb") as f:
            f.write(data)
        dest = self._path(digest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
        with self._lock:
            if digest not in self._lru:
                self._lru[digest] = len(data)
                self.size += len(data)
            evict = []
            while self.size > self.max_bytes and len(self._lru) > 1:
                old, size = self._lru.popitem(last=False)
                self.size -= size
                evict.append(old)
        for old in evict:
            self._path(old).unlink(missing_ok=True)

    def _forget(self, digest: str) -> None:
        with self._lock:
            size = self._lru.pop(digest, None)
            if size is not None:
                self.size -= size
        self._path(digest).unlink(missing_ok=True)

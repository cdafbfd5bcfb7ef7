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
import io
import logging
import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from bootseer.errors import IntegrityError

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

    def open(self, digest: str) -> BinaryIO | None:
        """The entry as a stream, or None if absent: for entries too large to hold in
        memory at once (snapshot shards). It is checked against its digest as it is read;
        a mismatch at the end raises :class:`IntegrityError` (the file is dropped), so a
        reader must not act on the bytes before reaching the end."""
        with self._lock:
            if digest not in self._lru:
                return None
            self._lru.move_to_end(digest)
        try:
            raw = open(self._path(digest), "rb", buffering=0)
        except FileNotFoundError:
            self._forget(digest)
            return None
        return io.BufferedReader(_Verified(raw, digest, lambda: self._forget(digest)))

    def put(self, digest: str, data: bytes) -> None:
        """Add a block whose digest the caller has verified."""
        self.put_stream(digest, [data], verified=True)

    def put_stream(self, digest: str, chunks: Iterable[bytes], *,
                   verified: bool = False) -> None:
        """Add an entry from a stream of chunks, never holding it whole; unless the caller
        has ``verified`` it, it is hashed while written and kept only if it matches
        (:class:`IntegrityError` otherwise)."""
        with self._lock:
            if digest in self._lru:
                return
        tmp = self._tmp / f"{digest}.{secrets.token_hex(4)}"
        sha = hashlib.sha256()
        size = 0
        try:
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    if not verified:
                        sha.update(chunk)
                    f.write(chunk)
                    size += len(chunk)
            if not verified and sha.hexdigest() != digest:
                raise IntegrityError(f"{digest}: the bytes do not match the digest; not "
                                     f"cached")
            dest = self._path(digest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        with self._lock:
            if digest not in self._lru:
                self._lru[digest] = size
                self.size += size
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


class _Verified(io.RawIOBase):
    """A cache file read through: hashed as it goes, checked against its name at the end."""

    def __init__(self, raw: io.FileIO, digest: str, on_mismatch) -> None:
        self._raw, self._digest, self._on_mismatch = raw, digest, on_mismatch
        self._sha = hashlib.sha256()
        self._checked = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        n = self._raw.readinto(buffer)
        if n:
            self._sha.update(memoryview(buffer)[:n])
        elif not self._checked:
            self._checked = True
            if self._sha.hexdigest() != self._digest:
                log.warning("cached entry %s is damaged; dropping it", self._digest)
                self._on_mismatch()
                raise IntegrityError(f"cached entry {self._digest} is damaged (it does not "
                                     f"match its digest)")
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()

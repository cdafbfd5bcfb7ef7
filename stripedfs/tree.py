"""A store directory as a file tree, for the FUSE mount: the data layer, no FUSE in it.

One recursive listing gives every path, its size and mtime; directories are implied by
keys. The listing is cached for ``ttl`` seconds, so ``ls`` and ``stat`` of a checkpoint
directory cost one round trip to the NameNode per TTL rather than one per call. Who may
read a file (:meth:`StoreTree.access`, the store's owner, group and permissions) is asked
once per file and TTL, when the file is first looked at.
"""

from __future__ import annotations

import posixpath
import threading
import time
from dataclasses import dataclass

from bootseer.store import Store
from bootseer.store.base import Access


@dataclass(frozen=True)
class Entry:
    is_dir: bool
    size: int = 0
    mtime: float = 0.0


class StoreTree:
    def __init__(self, store: Store, ttl: float = 30.0) -> None:
        self.store, self.ttl = store, ttl
        self._entries: dict[str, Entry] = {}
        self._children: dict[str, list[str]] = {}
        self._loaded_at = float("-inf")
        self._access: dict[str, Access | None] = {}
        self._lock = threading.Lock()

    def lookup(self, path: str) -> Entry | None:
        """The entry at ``path`` ("/" is the root), or None."""
        self._refresh_if_stale()
        return self._entries.get(_norm(path))

    def listdir(self, path: str) -> list[str] | None:
        """Names in directory ``path``, or None if it is not a directory."""
        self._refresh_if_stale()
        return self._children.get(_norm(path))

    def key(self, path: str) -> str:
        return _norm(path).lstrip("/")

    def access(self, path: str) -> Access | None:
        """Who may read the file at ``path`` as the store says (None: it cannot say)."""
        self._refresh_if_stale()
        key = self.key(path)
        with self._lock:
            if key in self._access:
                return self._access[key]
        try:
            found = self.store.access(key)
        except FileNotFoundError:
            found = Access(None, None, 0)  # gone since the listing: nobody reads it
        with self._lock:
            self._access[key] = found
        return found

    def _refresh_if_stale(self) -> None:
        with self._lock:
            if time.monotonic() - self._loaded_at < self.ttl:
                return
            entries: dict[str, Entry] = {"/": Entry(True)}
            children: dict[str, set[str]] = {"/": set()}
            for info in self.store.list():
                path = "/" + info.key
                entries[path] = Entry(False, info.size, info.mtime)
                child = path
                while child != "/":
                    parent = posixpath.dirname(child)
                    children.setdefault(parent, set()).add(posixpath.basename(child))
                    if parent not in entries:
                        entries[parent] = Entry(True, 0, info.mtime)
                    child = parent
            self._entries = entries
            self._children = {k: sorted(v) for k, v in children.items()}
            self._access = {}
            self._loaded_at = time.monotonic()


def _norm(path: str) -> str:
    return posixpath.normpath("/" + path.lstrip("/"))  # normpath keeps a leading "//"

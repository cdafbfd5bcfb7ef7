"""Image files kept whole on the node, for the kernel to read in place of the mount server.

A lazy image's content is blocks; a file whose bytes are all on the node can also be kept
as one plain file, which the mount names as the file's backing file (FUSE passthrough,
:mod:`bootseer.fuse.passthrough`): the kernel then reads it, mmaps included, as it reads a
local file, and no read of it reaches Python. ``bootseer warm`` makes the files it stages
whole (:meth:`WholeFiles.make_whole`), and marks the image as having whole files on the
node (:meth:`WholeFiles.any`): a mount asks the kernel for passthrough only then, since a
passthrough mount must answer every open, a round trip an image with nothing to pass
through would pay for nothing.

* **Where.** In a node cache of their own beside the blocks
  (:func:`~bootseer.nodecache.whole_files_beside`: ``<cache_dir>/files``, root-only,
  0700 directories and 0600 entries, the block cache's limit, least recently used
  evicted first), so a whole file may cost its bytes twice on disk (as blocks and whole).
  An entry is named by the file's *key*: the sha256 of a tag, the file's size and its
  blocks' digests in order. Files with the same content in any image share one entry.
* **Verified.** Before anything is written, the manifest's claims about the file must
  add up (every block but the last is a whole block, the sizes sum to the file's size,
  each block's size is its table size): a hostile manifest naming another file's blocks
  makes only a file of those blocks' bytes, under a key that says so. The file is
  assembled from blocks each checked against its digest as it is read from the cache,
  and is renamed into place only when complete. Like a checkpoint copy, it is opened
  unverified afterwards (hashing a 500 MB library before a start's first open of it
  would cost more than serving it): its size is checked against the manifest's at every
  open, and nobody but root can write to it or even name it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterable

from bootseer.errors import BootseerError
from bootseer.fuse.tree import Backing
from bootseer.nodecache import NotCached, whole_files_beside
from bootseer.prefetch.blockformat import FileEntry
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.prefetch.rootfs import Kind
from bootseer.readahead import will_need

log = logging.getLogger(__name__)

_TAG = b"bootseer-whole-file/1\0"
#: Blocks held in memory at once while a file's missing blocks are fetched.
FETCH_BLOCKS = 16


class WholeFiles:
    """The whole files of one image's regular files, in the node's block cache."""

    def __init__(self, image: LazyImage) -> None:
        self.image = image
        self.cache = whole_files_beside(image.cache)
        self._marker = self.cache.directory / "images" / self.cache.check_digest(
            image.image_id.removeprefix("sha256:"))
        self._keys: dict[str, str | None] = {}  # by path: a mount asks at every lookup
        #: Keys found whole: a start's prefetch and its read-ahead both ask of every hot
        #: file, one ``stat`` of a cold inode each. One evicted since is found when opened.
        self._present: set[str] = set()

    def key(self, entry: FileEntry) -> str | None:
        """The cache entry naming ``entry``'s content; None for a file that is not a
        regular one with content, or whose blocks do not add up to it (see the module
        docstring)."""
        try:
            return self._keys[entry.path]
        except KeyError:
            key = self._keys[entry.path] = self._key(entry)  # atomic under the GIL
            return key

    def _key(self, entry: FileEntry) -> str | None:
        if entry.kind not in (Kind.FILE, Kind.HARDLINK) or entry.size <= 0:
            return None
        manifest = self.image.manifest
        size, table = manifest.block_size, manifest.blocks
        blocks = [table[i] for i in entry.blocks]
        if len(blocks) != -(-entry.size // size):
            return None
        if any(b.size != size for b in blocks[:-1]) or \
                blocks[-1].size != entry.size - size * (len(blocks) - 1):
            return None
        sha = hashlib.sha256(_TAG + entry.size.to_bytes(8, "little"))
        for block in blocks:
            sha.update(bytes.fromhex(block.digest))
        return sha.hexdigest()

    def has(self, path: str) -> bool:
        """Whether the image's file at ``path`` is whole on the node (unverified: its size
        is checked when it is opened)."""
        entry = self.image.manifest.by_path.get(path)
        key = self.key(entry) if entry is not None else None
        if key is None:
            return False
        if key in self._present:
            return True
        if key not in self.cache:
            return False
        self._present.add(key)  # a set's add is atomic under the GIL
        return True

    def open(self, entry: FileEntry) -> Backing | None:
        """The whole file as a backing file, if it is on the node and of the right size."""
        key = self.key(entry)
        if key is None:
            return None
        try:
            fd = self.cache.open_unverified(key)
        except FileNotFoundError:
            return None
        if os.fstat(fd).st_size != entry.size:
            os.close(fd)
            log.warning("whole file %s of %s has the wrong size; dropping it", key,
                        entry.path)
            self.cache.drop(key)
            return None
        return Backing(key, fd)

    def read_ahead(self, entry: FileEntry, ranges: Iterable[tuple[int, int]]) -> bool:
        """Have the kernel start reading ``ranges`` (offset, length) of the whole file into
        its page cache (``POSIX_FADV_WILLNEED``: asynchronous, nothing comes to Python);
        False if the file is not whole on the node. The mount serves nothing of a file the
        kernel reads in its place, so this is how such a file's hot blocks are ahead of
        the start, as pushed pages are for a served file."""
        backing = self.open(entry)
        if backing is None:
            return False
        try:
            will_need(backing.fd, ranges)
        finally:
            os.close(backing.fd)
        return True

    def any(self) -> bool:
        """Whether files of this image were made whole on this node (some may have been
        evicted since)."""
        return self._marker.is_file()

    def make_whole(self, entries: Iterable[FileEntry], *, fetch: bool = True,
                   before_fetch: Callable[[], None] | None = None) -> int:
        """Fetch what the files lack (``fetch``; else only files whose blocks are all on
        the node are made whole) and keep each whole; returns the files now whole. A
        file that cannot be (a block that will not come, a full cache) is skipped and
        logged: its reads are served by the server as before. ``before_fetch`` is
        called before each fetch (it may wait: the agent's priorities)."""
        table = self.image.manifest.blocks
        whole = 0
        for entry in entries:
            key = self.key(entry)
            if key is None:
                continue
            if key in self.cache:
                whole += 1
                continue
            missing = [i for i in entry.blocks if not self.image.is_local(table[i].digest)]
            if missing and not fetch:
                continue
            try:
                for start in range(0, len(missing), FETCH_BLOCKS):
                    if before_fetch is not None:
                        before_fetch()
                    self.image.blocks(missing[start:start + FETCH_BLOCKS])
                self._assemble(entry, key)
            except (OSError, BootseerError) as exc:
                log.warning("could not keep %s of %s whole: %s", entry.path,
                            self.image.image_id, exc)
                continue
            whole += 1
        if whole:
            self._mark()
        return whole

    def _mark(self) -> None:
        self._marker.parent.mkdir(mode=0o700, exist_ok=True)
        self._marker.touch(mode=0o600)

    def _assemble(self, entry: FileEntry, key: str) -> None:
        """Write the file from its blocks (each verified as it is read) and add it."""
        table = self.image.manifest.blocks
        tmp = self.cache.new_temporary(key)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                         os.O_CLOEXEC, 0o600)
            with open(fd, "wb") as out:
                for i in entry.blocks:
                    data = self.image.peek(table[i].digest)
                    if data is None:
                        raise NotCached(f"block {table[i].digest} left the cache")
                    out.write(data)
            self.cache.add_file(tmp, key)
        finally:
            tmp.unlink(missing_ok=True)

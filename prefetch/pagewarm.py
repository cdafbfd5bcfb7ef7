"""Hot blocks into the kernel's page cache before the start reads them.

Prefetching puts a start's hot blocks on the node, but every read of them still comes to
the mount server: a CUDA start makes some 6,000 FUSE reads, most of them mmap faults of a
few pages in the large libraries (2,400 in libcublasLt alone), each a trip through a
Python process while the start waits. Measured with every hot block already local, those
reads were 5.7 s of the start's ~10 s.

So once the kernel knows a file (its lookup was answered) and a hot block of it is on the
node, the :class:`PageWarmer` hands the whole block to the server's pusher, which puts it
into the file's page cache in one write; the start's reads of it are then page-cache hits.
A hot block that is not on the node yet is pushed when its fetch verifies (the
prefetcher's or a read's, :attr:`LazyImage.on_fetched`). Only hot blocks are pushed:
the ones a start of this workload was seen to read.

The warmer reads local blocks on a thread of its own, never on a FUSE reader thread. What
it keeps is bounded by the image: the files it has seen and, per hot block, where the
files it has seen hold it.
"""

from __future__ import annotations

import logging
import mmap
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bootseer.fuse.tree import PushPages
from bootseer.prefetch.blockformat import FileEntry
from bootseer.prefetch.lazyimage import LazyImage
from bootseer.readahead import behind_others

log = logging.getLogger(__name__)

Target = tuple[int, int, int]  # node, offset in the file, bytes of the block in the file
#: (the file, its hot (offset, length) ranges) -> whether the kernel reads it elsewhere
ReadAhead = Callable[[FileEntry, list[tuple[int, int]]], bool]


@dataclass
class ReadAheadCounts:
    """Hot blocks of files the kernel reads from elsewhere (whole files, passed through)
    that it was asked to read ahead, for a mount's report; ``cpu_s``: the warmer's CPU in
    asking (opening each file, and the kernel allocating the pages and queueing their
    reads in the asking thread: work a local start does in its own page faults)."""

    files: int = 0
    bytes: int = 0
    cpu_s: float = 0.0


class PageWarmer:
    def __init__(self, image: LazyImage, hot: Iterable[str], push: PushPages, *,
                 read_ahead: ReadAhead = lambda entry, ranges: False,
                 counts: ReadAheadCounts | None = None, behind: bool = False) -> None:
        """``read_ahead(entry, ranges)``: if the kernel reads the file from elsewhere (its
        pages are not the mount's to fill), have it read the hot ``ranges`` there and
        return True (counted in ``counts``); called on the warmer's thread, never a
        request's. ``behind``: the warmer's reads queue behind everyone else's
        (:func:`behind_others`), for a warmer given its files all at once, well ahead of
        need; not for one given each file as the kernel looks it up, whose start reads
        the file next and would then wait for reads queued behind its own."""
        self.image, self.push, self.read_ahead = image, push, read_ahead
        self.behind = behind
        self.counts = counts if counts is not None else ReadAheadCounts()
        self.hot = frozenset(hot)
        self._seen: set[int] = set()
        self._waiting: dict[str, list[Target]] = {}  # hot blocks not local when looked at
        self._lock = threading.Lock()
        self._files: queue.SimpleQueue[FileEntry] = queue.SimpleQueue()
        image.on_fetched = self.fetched
        threading.Thread(target=self._run, name="page-warmer", daemon=True).start()

    @classmethod
    def applies(cls, image: LazyImage) -> bool:
        """Blocks start on page boundaries (else a push would leave pages half filled)."""
        return image.manifest.block_size % mmap.PAGESIZE == 0

    def looked_up(self, entry: FileEntry) -> None:
        """The kernel knows this file now: push its hot blocks (cheap; the work is queued)."""
        if not entry.blocks or entry.ino in self._seen:
            return
        with self._lock:
            if entry.ino in self._seen:
                return
            self._seen.add(entry.ino)
        self._files.put(entry)

    def fetched(self, digest: str, data: bytes) -> None:
        """A block verified: push it where files already seen hold it."""
        if digest not in self.hot:
            return
        with self._lock:
            targets = self._waiting.pop(digest, ())
        for target in targets:
            self._push(target, data)

    def _run(self) -> None:
        if self.behind:
            behind_others()
        while True:
            entry = self._files.get()
            try:
                self._warm(entry)
            except Exception:  # a failure here costs reads, never the mount
                log.exception("putting the hot blocks of %s in the page cache failed",
                              entry.path)

    def _warm(self, entry: FileEntry) -> None:
        size = self.image.manifest.block_size
        table = self.image.manifest.blocks
        hot = [(k * size, min(size, entry.size - k * size), table[index].digest)
               for k, index in enumerate(entry.blocks) if table[index].digest in self.hot]
        if not hot:
            return
        began = time.thread_time()
        if self.read_ahead(entry, _merged((offset, length) for offset, length, _ in hot)):
            self.counts.files += 1  # one thread counts
            self.counts.bytes += sum(length for _, length, _ in hot)
            self.counts.cpu_s += time.thread_time() - began
            return
        for offset, length, digest in hot:
            target = (entry.ino, offset, length)
            # Waiting first, then looking: a fetch that ends in between finds the target.
            with self._lock:
                self._waiting.setdefault(digest, []).append(target)
            data = self.image.peek(digest)
            if data is None:
                continue  # fetched() pushes it
            with self._lock:
                targets = self._waiting.get(digest, [])
                if target not in targets:
                    continue  # fetched() took it meanwhile
                targets.remove(target)
                if not targets:
                    del self._waiting[digest]
            self._push(target, data)

    def _push(self, target: Target, data: bytes) -> None:
        ino, offset, length = target
        self.push(ino, offset, data[:length])


def _merged(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Adjacent (offset, length) ranges, in order, as one: one readahead call each."""
    out: list[tuple[int, int]] = []
    for offset, length in ranges:
        if out and out[-1][0] + out[-1][1] == offset:
            out[-1] = (out[-1][0], out[-1][1] + length)
        else:
            out.append((offset, length))
    return out

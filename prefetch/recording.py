"""Record a start at run time: from the mount to "the start is over", then store the result.

A recording notes the first access of every block on the lazy mount (see
:class:`~bootseer.prefetch.hotlist.Recorder`) until the earliest of:

* the workload's ready signal — the file ``$BOOTSEER_READY_FILE`` appears
  (``bootseer.mark_ready()``, ``bootseer ready``; see :mod:`bootseer.ready`);
* a marker file the workload is known to create (``--ready-marker``, a path the host can
  see, e.g. in the container's root);
* the timeout;
* the end of the mount (the container's process exited), via :meth:`Recording.finish`.

Then the recording is merged into the image's stored hot list and the hot blocks are laid
out in a hot pack (:func:`bootseer.prefetch.hotlist.save`), in the background while the container
keeps running. An empty recording (nothing was read) stores nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bootseer.prefetch import hotlist
from bootseer.prefetch.hotlist import HotList, Recorder
from bootseer.prefetch.lazyimage import LazyImage

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05


@dataclass(frozen=True)
class ReadyWhen:
    """What ends a recorded start (besides the end of the mount)."""

    ready_file: Path | None = None
    marker: Path | None = None
    timeout: float = 300.0


class Recording:
    def __init__(self, image: LazyImage, workload: str, when: ReadyWhen) -> None:
        self.image, self.workload, self.when = image, workload, when
        self.result: HotList | None = None
        self.reason: str | None = None  # why it ended: ready, marker, timeout, exit
        self._finish_lock = threading.Lock()
        self._ended = threading.Event()
        self._started = time.monotonic()

    def start(self) -> Recording:
        self.image.recorder = Recorder(self.image.image_id, self.workload)
        self._started = time.monotonic()  # the timeout counts from the start of recording
        threading.Thread(target=self._watch, name="recording", daemon=True).start()
        return self

    def _watch(self) -> None:
        while not self._ended.wait(POLL_SECONDS):
            reason = self._over()
            if reason is not None:
                self.finish(reason)
                return

    def _over(self) -> str | None:
        if self.when.ready_file is not None and _present(self.when.ready_file):
            return "ready"
        if self.when.marker is not None and _present(self.when.marker):
            return "marker"
        if time.monotonic() - self._started >= self.when.timeout:
            return "timeout"
        return None

    def finish(self, reason: str = "exit") -> HotList | None:
        """End the recording (once; later calls wait for the first and return its result)
        and store what it saw. Failures to store are logged: a recording is advice."""
        with self._finish_lock:
            if self._ended.is_set():
                return self.result
            self._ended.set()
            recorder = self.image.recorder
            if recorder is None:
                return None
            recording = recorder.stop()
            self.reason = reason
            seconds = time.monotonic() - self._started
            if not recording.blocks:
                log.info("recording of %s (%s) ended (%s) with no blocks read; not stored",
                         self.image.image_id, self.workload, reason)
                return None
            try:
                self.result = hotlist.save(self.image.blobs, recording, self.image.manifest,
                                           self.image.cache)
            except Exception as exc:
                log.warning("could not store the hot list of %s (%s): %s",
                            self.image.image_id, self.workload, exc)
                return None
            log.info("recorded %d blocks in %.1f s (%s); hot list now %d blocks from %d "
                     "recordings", len(recording.blocks), seconds, reason,
                     len(self.result.blocks), self.result.recordings)
            return self.result


def _present(path: Path) -> bool:
    """Whether ``path`` exists, itself: the container writes these places, so a symlink
    there is never followed (to a hung mount, say) by this root process."""
    try:
        os.lstat(path)
    except OSError:
        return False
    return True

"""What checkpoint readers tell about themselves, to whoever registered to hear it.

A reader knows nothing of where its telemetry goes: the start's timeline
(:class:`bootseer.ready.CheckpointMilestones`, registered by the checkpoint API) marks the
job's first checkpoint byte; a FUSE server or ``ckpt get`` may register another, or none.
"""

from __future__ import annotations

from typing import Protocol


class ReadObserver(Protocol):
    """Told what a checkpoint reader (striped or staged copy) does."""

    def first_byte(self, name: str) -> None:
        """The reader of ``name`` handed out its first bytes (once per reader)."""


class FirstByte:
    """Tells ``observer`` of a reader's first bytes, once; cheap on every later read."""

    def __init__(self, observer: ReadObserver | None, name: str) -> None:
        self._observer, self._name = observer, name

    def __call__(self) -> None:
        # No lock on the hot path: reads racing on the first byte may both tell, which
        # observers take (a phase's first mark stays).
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.first_byte(self._name)

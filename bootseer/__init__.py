"""Bootseer: cut the time between "a training job is (re)started" and "its first step runs".

The core package holds what every technique shares: configuration, the store (where image
blocks, environment snapshots and checkpoints live), errors and the command line. For
training scripts it exports :func:`mark_ready` (the start is over: see :mod:`bootseer.ready`)
and, in :mod:`bootseer.checkpoint`, the checkpoint-load API.
"""

from bootseer.ready import mark_ready

__version__ = "0.1.0"
__all__ = ["__version__", "mark_ready"]

"""Bootseer: cut the time between "a training job is (re)started" and "its first step runs".

The core package holds what every technique shares: configuration, the store (where image
blocks, environment snapshots and checkpoints live), errors and the command line.
"""

__version__ = "0.1.0"

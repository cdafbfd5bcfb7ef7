"""Bootseer's development tooling, not part of the product: a local HDFS cluster with
capped links (:mod:`bootseer_dev.cluster`), real Debian container images built offline
(:mod:`bootseer_dev.image`) and private starts of dockerd, docker-registry and the node
agent (:mod:`bootseer_dev.engines`), for the tests, the benchmarks and the demo.

It is its own distribution (``dev/pyproject.toml``), installed into the development
virtual environment by the Makefile, so that ``pip install .`` of Bootseer ships none of it.
"""

from __future__ import annotations

import logging
import sys


def log_to_stderr(verbose: bool) -> None:
    """The tools' logging: INFO (DEBUG with ``-v``) to stderr, one line per record."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)

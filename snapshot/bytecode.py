"""Compile the ``.py`` files a command installed, so restored environments import warm.

Bytecode must come from the interpreter that will import it (the magic number differs per
Python version). The interpreter is, in order: ``<target>/bin/python`` when a target is a
virtual environment (it has ``pyvenv.cfg``), else the ``python3`` on the command's
``PATH``, else the Python running Bootseer. Timestamp-based ``.pyc`` files stay valid after
a restore because the restore keeps the sources' mtimes exactly.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping

log = logging.getLogger(__name__)


def interpreter_for(target: str, environ: Mapping[str, str]) -> str:
    venv_python = os.path.join(target, "bin", "python")
    if os.path.isfile(os.path.join(target, "pyvenv.cfg")) and os.path.exists(venv_python):
        return venv_python
    return shutil.which("python3", path=environ.get("PATH")) or sys.executable


def compile_sources(target: str, sources: list[str], environ: Mapping[str, str]) -> None:
    """Byte-compile ``sources`` (absolute paths under ``target``); failures only warn, as
    Python itself would compile on first import."""
    if not sources:
        return
    python = interpreter_for(target, environ)
    done = subprocess.run([python, "-m", "compileall", "-q", "-i", "-"],
                          input="\n".join(sources).encode(), capture_output=True,
                          env=dict(environ), check=False)
    if done.returncode != 0:
        log.warning("%s -m compileall failed on some files under %s: %s", python, target,
                    done.stdout.decode(errors="replace")[-2000:])

"""Source distributions fetched from PyPI once and kept in the cache."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)


def download_sdist(requirement: str, filename: str, root: Path, pip_args: list[str],
                   error: type[Exception]) -> Path:
    """``pip download`` ``requirement`` into ``<root>/downloads/<filename>`` unless present.

    The download lands in a temporary directory beside the target and is renamed into place
    only when complete, so an interrupted download is never mistaken for a cached one.
    """
    target = root / "downloads" / filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".dl-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q",
               "--disable-pip-version-check", *pip_args, "-d", tmp, requirement]
        log.info("running %s", " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / filename
        if proc.returncode != 0 or not got.is_file():
            raise error(f"pip download {requirement} failed (rc={proc.returncode}):\n"
                        f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
        os.replace(got, target)
    return target

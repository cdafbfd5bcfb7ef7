"""Small JSON files that appear whole: the one way Bootseer writes a state or report file.

A reader (the agent reading a server's statistics, a restarted agent reading a mount's
state, a server taking a connection over) must never see half a file: each is written to a
temporary named by the writer's pid next to it and renamed into place. A writer killed
half-way leaves the old file or none, and at most its own temporary.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: Path, body: Any, *, mode: int = 0o644) -> None:
    """Write ``body`` as JSON to ``path`` atomically, with permission bits ``mode``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    try:
        with open(fd, "w") as out:
            json.dump(body, out, indent=2)
            out.write("\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

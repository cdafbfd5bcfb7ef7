"""Commands run as another user (``nobody``), as an attacker or a socket-group member would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

NOBODY = (65534, 65534)  # nobody, in nogroup: the agent socket's group in these tests


def as_nobody(*argv: str | Path, env: dict[str, str] | None = None,
              exec_from_shell: bool = True) -> subprocess.CompletedProcess:
    """``argv`` run by ``nobody``. ``exec_from_shell``: exec'd by a shell that is already
    nobody's, because setpriv's own exec still passes root's permission checks (that is
    how this venv's Python, under root's 0700 home, can run as nobody at all)."""
    uid, gid = NOBODY
    shell = ["sh", "-c", 'exec "$@"', "sh"] if exec_from_shell else []
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                           *shell, *map(str, argv)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "HOME": "/", **(env or {})},
                          stdin=subprocess.DEVNULL)

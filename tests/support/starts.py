"""A workload's start on a lazy image, as the engine tests run and check it: fresh node
agents on the engines' socket, and what every start through a shim or hook must show."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from bootseer.agents.client import AgentClient
from bootseer.agents.timeline import StartRecord
from bootseer.store import BlobStore, open_store
from bootseer_dev.engines import start_agent

# The workload's start: python3 runs, then it says it is up (the recording ends there).
SCRIPT = ('python3 -c "import json, sys; print(6 * 7, sys.version_info[0])"; '
          'touch "$BOOTSEER_READY_FILE"')
PLAIN = "echo plain $(cat /etc/debian_version | cut -c1-2); ls /run/bootseer 2>&1; exit 3"


class Nodes:
    """Node agents on the module's socket (the engines know that path), one at a time, each
    with a cache of its own: a start on a new node finds nothing local but the store's
    hot list. Stopping one checks that no container's mount was left behind."""

    def __init__(self, lazy: dict[str, Path], tmp_path: Path) -> None:
        self.lazy, self.tmp_path = lazy, tmp_path
        self.proc: subprocess.Popen | None = None
        self.client: AgentClient | None = None

    def start(self, name: str, **env: str) -> AgentClient:
        """A fresh agent named ``name`` (its cache), with settings ``env`` besides."""
        self.stop()
        self.proc = start_agent(self.lazy["sock"], {
            "BOOTSEER_STORE": f"file://{self.lazy['store']}",
            "BOOTSEER_CACHE_DIR": str(self.tmp_path / f"node-{name}"),
            "BOOTSEER_IMAGE_RECORD_IMAGES": "py", **env})  # the operator lets "py" record
        self.client = AgentClient(self.lazy["sock"])
        return self.client

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            left = self.client.mounts()
            for mount in left:
                self.client.release(mount["id"])
            assert left == [], "containers' mounts were not released"
        finally:
            self.client.__exit__()
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
            self.proc = None


def wait_start(client: AgentClient, timeout: float = 60) -> StartRecord:
    """The node's one start, once it has exited (the poststop hook released it)."""
    deadline = time.monotonic() + timeout
    while True:
        starts = client.starts()
        if starts and "exited" in starts[0].phases:
            (start,) = starts
            return start
        assert time.monotonic() < deadline, f"start not complete: {starts}"
        time.sleep(0.2)


def check_start(client: AgentClient, lazy: dict[str, Path], workload: str, runtime: str,
                 first: bool) -> None:
    """The start ran on the lazy root and reached every phase; the first one recorded the
    hot list, a later one (on another node) prefetched it."""
    start = wait_start(client)
    assert list(start.phases) == ["created", "image_ready", "ready", "exited"], start
    assert start.image == "py" and start.workload == workload
    assert start.runtime == runtime
    image = start.detail["image"]
    if first:
        assert image["blocks_fetched"] > 0  # read from the lazy image, on demand
        assert image.get("prefetch") is None  # no hot list yet
        assert image["recording"]["hot_blocks"] > 0 and image["recording"]["recordings"] == 1
        refs = BlobStore(open_store(f"file://{lazy['store']}")).list_refs("hot/")
        assert any(f"/{workload}/" in ref for ref in refs), refs  # hot/<image>/<wl>/<n>
    else:
        assert image["prefetch"]["blocks_fetched"] > 0  # the hot list, from the store
        # and the start found it: put in the page cache once a file was looked up (those
        # reads never reach the server), or by its reads
        assert image["pages_pushed"]["pushes"] + image["prefetch_hits"] > 0, image

"""The node cache shared with a running mount server (real FUSE): blocks another process
staged after the server opened the cache are found, not fetched."""

from __future__ import annotations

import json
import time
from pathlib import Path

from support.images import big_image, bootseer


def test_a_mount_server_sees_blocks_a_warm_added_after_it_started(tmp_path: Path) -> None:
    """The server opened the cache, then a standalone warm (another process) staged every
    block: the server's reads find them all on disk and fetch nothing."""
    dirs = {name: tmp_path / name for name in ("store", "cache", "image", "mnt")}
    for path in dirs.values():
        path.mkdir()
    bootseer("image", "convert", str(big_image(dirs["image"])), "--name", "big",
             store=dirs["store"], cache=dirs["cache"])
    bootseer("image", "mount", "big", str(dirs["mnt"]), "--no-prefetch",
             store=dirs["store"], cache=dirs["cache"])
    try:
        bootseer("warm", "--image", "big", "--all", "--no-agent", store=dirs["store"],
                 cache=dirs["cache"])
        assert (dirs["mnt"] / "data" / "big.bin").read_bytes()
        time.sleep(1)  # the server refreshes its statistics twice a second
        stats = json.loads(bootseer("image", "stats", str(dirs["mnt"]), store=dirs["store"],
                                    cache=dirs["cache"]).stdout)
        assert stats["blocks_fetched"] == 0 and stats["cache_hits"] > 0, stats
    finally:
        bootseer("image", "umount", str(dirs["mnt"]), store=dirs["store"], cache=dirs["cache"])

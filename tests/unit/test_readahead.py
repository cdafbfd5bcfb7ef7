"""Read-ahead in pieces the kernel reads whole: a range larger than the device's window is
in the page cache in full once asked for, not only its first window."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from support.pagecache import drop_cached, io_class, resident_pages

from bootseer.readahead import (
    DEFAULT_WINDOW,
    IOPRIO_CLASS_IDLE,
    behind_others,
    device_window,
    will_need,
)


def test_a_range_of_several_windows_is_read_ahead_in_full(tmp_path: Path) -> None:
    path = tmp_path / "data"
    window = device_window(os.stat(tmp_path).st_dev)
    size = 3 * window + 4096 + 5  # a partial page at the end
    with open(path, "wb") as out:
        out.write(os.urandom(size))
    drop_cached(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        will_need(fd, [(0, 4096), (4096, size - 4096)])
    finally:
        os.close(fd)
    deadline = time.monotonic() + 20
    while not all(pages := resident_pages(path)):
        assert time.monotonic() < deadline, f"{pages.count(False)} of {len(pages)} pages"
        time.sleep(0.02)


def test_a_window_is_at_least_the_kernels_default() -> None:
    assert device_window(os.stat("/").st_dev) >= DEFAULT_WINDOW
    assert device_window(os.makedev(4095, 4095)) == DEFAULT_WINDOW  # no such device


def test_a_thread_reading_ahead_queues_behind_the_others_and_only_it() -> None:
    seen: list[int] = []

    def ahead() -> None:
        behind_others()
        seen.append(io_class(threading.get_native_id()))

    before = io_class(threading.get_native_id())
    thread = threading.Thread(target=ahead)
    thread.start()
    thread.join()
    assert seen == [IOPRIO_CLASS_IDLE]
    assert io_class(threading.get_native_id()) == before != IOPRIO_CLASS_IDLE

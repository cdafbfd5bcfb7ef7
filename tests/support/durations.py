"""Seconds per test file, printed at the end of a run, slowest first: where a run's time goes
(``--durations`` names the slowest tests; this names the slowest files)."""

from __future__ import annotations

from collections import defaultdict

import pytest


class FileDurations:
    """A pytest plugin summing each test's setup, call and teardown by file (module fixtures
    count in the first test's setup: they cost that file)."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::")[0]] += report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if len(self.seconds) < 2:
            return
        terminalreporter.write_sep("=", f"seconds per file ({len(self.seconds)} files, "
                                        f"{sum(self.seconds.values()):.1f}s in all)")
        for path, total in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{total:8.2f}s  {path}")

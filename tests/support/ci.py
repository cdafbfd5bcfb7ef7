"""One rule for a component a test cannot start: in CI (``CI=true``) the test fails, so a
machine that lacks it is loud; elsewhere it is skipped, so a laptop can run what it can."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def require(missing: str | None, what: str) -> None:
    """Fail under CI, skip elsewhere, when ``missing`` (the reason ``what`` cannot run) is
    set; return when it is empty or None."""
    if not missing:
        return
    message = f"{what} cannot run here: {missing}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)

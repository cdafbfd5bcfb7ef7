"""``bootseer-runtime``, the sh front engines call: only a call that may be ``create`` or
``run`` reaches Python (``bootseer-runtime-shim``); every other goes to runc with its
arguments as they came. The runc here is a script that writes down what it got."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
FRONT = BIN / "bootseer-runtime"


@pytest.fixture
def fake_runc(tmp_path: Path) -> Path:
    runc = tmp_path / "runc"
    runc.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RUNC_GOT"\n')
    runc.chmod(0o755)
    return runc


def call(front: Path, args: list[str], runc: Path, tmp_path: Path,
         **env: str) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    got = tmp_path / "got"
    got.unlink(missing_ok=True)
    result = subprocess.run([str(front), *args], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path, env={**os.environ, "BOOTSEER_RUNC": str(runc),
                                               "RUNC_GOT": str(got), **env})
    return result, got.read_text().splitlines() if got.exists() else None


@pytest.mark.parametrize("args", [
    ["--root", "/run/r", "--log", "/l.json", "--log-format", "json", "start", "abc"],
    ["--root", "/run/r", "delete", "--force", "abc"],
    ["state", "abc"], ["kill", "abc", "9"], ["features"], ["--version"],
    ["--root", "/r", "exec", "--process", "/p.json", "abc"],
])
def test_other_calls_go_to_runc_without_python(args, fake_runc, tmp_path) -> None:
    # Python cannot start at all here: these calls must not need it.
    result, got = call(FRONT, args, fake_runc, tmp_path, PYTHONHOME="/nonexistent")
    assert result.returncode == 0, result.stderr
    assert got == args


def test_create_goes_to_the_python_shim(fake_runc, tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": "1.0.2"}))
    args = ["--root", "/run/r", "create", "--bundle", str(tmp_path), "abc"]
    broken, got = call(FRONT, args, fake_runc, tmp_path, PYTHONHOME="/nonexistent")
    assert broken.returncode != 0 and got is None  # it needed Python
    result, got = call(FRONT, args, fake_runc, tmp_path)
    assert result.returncode == 0, result.stderr
    assert got == args  # not a Bootseer container: forwarded as it came


@pytest.mark.parametrize("args", [["delete", "run"], ["--log", "create", "state", "x"]])
def test_a_word_that_only_looks_like_create_is_forwarded_by_the_shim(args, fake_runc,
                                                                      tmp_path) -> None:
    result, got = call(FRONT, args, fake_runc, tmp_path)
    assert result.returncode == 0, result.stderr
    assert got == args


def test_a_missing_runc_is_named(tmp_path) -> None:
    result, got = call(FRONT, ["state", "abc"], tmp_path / "nope", tmp_path)
    assert result.returncode == 127 and got is None
    assert f"runc not found at {tmp_path / 'nope'}" in result.stderr


def test_a_front_reached_through_a_link_finds_the_shim(fake_runc, tmp_path) -> None:
    """Deployed as /usr/local/bin/bootseer-runtime -> the venv's: the shim is beside the
    file, not the link."""
    link = tmp_path / "bin" / "bootseer-runtime"
    link.parent.mkdir()
    link.symlink_to(FRONT)
    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": "1.0.2"}))
    args = ["create", "--bundle", str(tmp_path), "abc"]
    result, got = call(link, args, fake_runc, tmp_path)
    assert result.returncode == 0, result.stderr
    assert got == args


def test_a_copied_front_says_to_link_it(fake_runc, tmp_path) -> None:
    copy = tmp_path / "bin" / "bootseer-runtime"
    copy.parent.mkdir()
    copy.write_bytes(FRONT.read_bytes())
    copy.chmod(0o755)
    result, got = call(copy, ["create", "--bundle", str(tmp_path), "abc"], fake_runc, tmp_path)
    assert result.returncode == 127 and got is None
    assert "bootseer-runtime-shim is missing" in result.stderr and "link" in result.stderr

"""The ``bootseer`` command as a user runs it: a real process, real files, real exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.store_contract import ramp

from bootseer import __version__


def bootseer(*args: str, store: Path | None = None, check: bool = True,
             stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if store is not None:
        env["BOOTSEER_STORE"] = f"file://{store}"
    result = subprocess.run([sys.executable, "-m", "bootseer", *args], input=stdin,
                            capture_output=True, env=env, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"bootseer {args} failed: {result.stderr.decode()}")
    return result


def test_version_and_help() -> None:
    assert bootseer("--version").stdout.decode().strip() == f"bootseer, version {__version__}"
    out = bootseer("--help").stdout.decode()
    assert "store" in out and "config" in out


def test_a_command_that_draws_no_bar_imports_neither_bars_nor_package_metadata(
        tmp_path: Path) -> None:
    """Every start pays for what the CLI imports (a cold ``env run`` is timed against a
    plain ``tar -x``): rich.progress (~30 ms) only when a terminal shows a bar,
    importlib.metadata (~30 ms) only for a store scheme no built-in backend serves."""
    probe = ("import sys; from bootseer.cli import main\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('rich.progress', 'importlib.metadata') "
             "if m in sys.modules))")
    env = dict(os.environ, BOOTSEER_STORE=f"file://{tmp_path}")
    result = subprocess.run([sys.executable, "-c", probe, "store", "put", "-"], input=b"x",
                            capture_output=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().splitlines()[-1] == "[]"


def test_config_show_reports_sources(tmp_path: Path) -> None:
    out = bootseer("--store", "file:///from/flag", "config", "show", "--json").stdout
    rows = json.loads(out)
    assert rows["store"] == {"value": "file:///from/flag", "source": "flag --store"}
    assert rows["hdfs.replication"]["source"] == "default"
    table = bootseer("config", "show", store=tmp_path).stdout.decode()
    assert "env BOOTSEER_STORE" in table


def test_config_show_gives_the_techniques_own_defaults_and_the_files_values(
        tmp_path: Path) -> None:
    """Prefetch's and the striped reader's knobs are declared once, by their technique;
    a key the files leave unset still shows the value that is used, and where from."""
    rows = json.loads(bootseer("config", "show", "--json").stdout)
    assert rows["image.prefetch_concurrency"] == {"value": 4, "source": "default (prefetch)"}
    assert rows["checkpoint.stripe_size"] == {"value": 4 << 20,
                                              "source": "default (stripedfs)"}
    config = tmp_path / "config.toml"
    config.write_text('[checkpoint]\nstripe_size = "8m"\n')
    rows = json.loads(bootseer("--config", str(config), "config", "show", "--json").stdout)
    assert rows["checkpoint.stripe_size"] == {"value": 8 << 20, "source": str(config)}


def test_store_round_trip_through_the_cli(tmp_path: Path) -> None:
    store = tmp_path / "store"
    source = tmp_path / "data.bin"
    source.write_bytes(ramp(0, 3 << 20))
    digest = bootseer("store", "put", str(source), "--ref", "demo/data",
                      store=store).stdout.decode().strip()
    assert digest.startswith("sha256:")
    part = bootseer("store", "get", "demo/data", "--offset", "1m", "--length", "100",
                    store=store).stdout
    assert part == ramp(1 << 20, 100)
    out = tmp_path / "copy.bin"
    bootseer("store", "get", digest, "-o", str(out), store=store)
    assert out.read_bytes() == source.read_bytes()
    stat = json.loads(bootseer("store", "stat", "demo/data", store=store).stdout)
    assert (stat["digest"], stat["size"], stat["chunks"]) == (digest, 3 << 20, 3)
    assert f"demo/data\t{digest}" in bootseer("store", "ls", store=store).stdout.decode()
    assert digest in bootseer("store", "ls", "--blobs", store=store).stdout.decode()
    from_stdin = bootseer("store", "put", "-", store=store, stdin=b"piped").stdout.decode()
    assert bootseer("store", "get", from_stdin.strip(), store=store).stdout == b"piped"
    assert "all intact" in bootseer("store", "verify", store=store).stderr.decode()
    bootseer("store", "rm", "demo/data", digest, store=store)
    assert bootseer("store", "ls", store=store).stdout == b""


def test_store_sweep_removes_what_dead_writers_left(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / ".tmp").mkdir(parents=True)
    (store / ".tmp" / "abcd.999999999").write_bytes(b"partial")  # no such PID
    kept = bootseer("store", "sweep", store=store)  # written just now: kept, nothing said
    assert (kept.stdout, kept.stderr) == (b"", b"") and list((store / ".tmp").iterdir())
    out = bootseer("store", "sweep", "--older-than", "0", store=store).stderr.decode()
    assert "1 temporaries" in out and not list((store / ".tmp").iterdir())


def test_corruption_is_reported_by_verify(tmp_path: Path) -> None:
    store = tmp_path / "store"
    source = tmp_path / "data.bin"
    source.write_bytes(b"precious")
    digest = bootseer("store", "put", str(source), store=store).stdout.decode().strip()
    hexd = digest.removeprefix("sha256:")
    (store / "blobs" / "sha256" / hexd[:2] / hexd).write_bytes(b"tampered")
    result = bootseer("store", "verify", store=store, check=False)
    assert result.returncode == 1
    assert digest in result.stderr.decode()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("store", "get", "no/such/ref"), "no reference 'no/such/ref'"),
        (("store", "put", "/no/such/file"), "/no/such/file: No such file or directory"),
        (("store", "get", "x", "--offset", "lots"), "not a byte size"),
        (("--store", "s3://b/x", "store", "ls"), "no store backend for 's3://'"),
    ],
)
def test_user_errors_are_one_line_without_traceback(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    result = bootseer(*args, store=tmp_path / "store", check=False)
    err = result.stderr.decode()
    assert result.returncode != 0
    assert message in err
    assert "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) <= 3  # usage + hint + error


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = bootseer("--debug", "store", "get", "no/such/ref", store=tmp_path, check=False)
    assert result.returncode != 0
    assert "Traceback" in result.stderr.decode()

"""The snapshot key: stable for the same inputs, different when anything that matters does."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bootseer.snapshot.key import IMAGE_ID_ENV, KeyInputs, key_material, snapshot_key


@pytest.fixture
def inputs(tmp_path: Path) -> KeyInputs:
    lock = tmp_path / "requirements.lock"
    lock.write_text("tiny==1.0\n")
    return KeyInputs(("pip", "install", "-r", "requirements.lock"), (lock,), ("PIP_INDEX_URL",),
                     (tmp_path / "venv",))


ENV = {"PIP_INDEX_URL": "https://pypi.example/simple", "PATH": "/usr/bin", "HOME": "/root"}


def key(inputs: KeyInputs, environ: dict[str, str] = ENV) -> str:
    return snapshot_key(key_material(inputs, environ))


def test_the_key_is_stable_and_ignores_what_does_not_matter(inputs, tmp_path, monkeypatch):
    first = key(inputs)
    assert key(inputs) == first and len(first) == 64
    assert key(inputs, ENV | {"UNRELATED": "1", "HOME": "/elsewhere"}) == first
    monkeypatch.chdir(tmp_path.parent)
    assert key(inputs) == first  # the working directory does not matter
    copy = tmp_path / "copy.lock"  # the key file's contents matter, not its name
    copy.write_bytes(inputs.key_files[0].read_bytes())
    assert key(replace(inputs, key_files=(copy,))) == first


def test_every_input_changes_the_key(inputs, tmp_path):
    first = key(inputs)
    changed = [
        key(replace(inputs, argv=(*inputs.argv, "--no-deps"))),
        key(replace(inputs, targets=(tmp_path / "other",))),
        key(replace(inputs, env_vars=("PIP_INDEX_URL", "CUDA_VERSION"))),
        key(inputs, ENV | {"PIP_INDEX_URL": "https://mirror.example/simple"}),
        key(inputs, {k: v for k, v in ENV.items() if k != "PIP_INDEX_URL"}),
        key(inputs, ENV | {IMAGE_ID_ENV: "sha256:" + "1" * 64}),
    ]
    inputs.key_files[0].write_text("tiny==1.1\n")
    changed.append(key(inputs))
    assert len({first, *changed}) == len(changed) + 1
    # unset and empty differ; two image ids differ
    assert key(inputs, ENV | {"PIP_INDEX_URL": ""}) != key(inputs, {})
    assert key(inputs, {IMAGE_ID_ENV: "a"}) != key(inputs, {IMAGE_ID_ENV: "b"})


def test_the_base_outside_a_container_is_os_python_machine_and_libc(inputs):
    base = key_material(inputs, {})["base"]
    assert set(base) == {"os", "python", "machine", "libc"} and base["os"].get("ID")
    assert key_material(inputs, {IMAGE_ID_ENV: "img"})["base"] == {"image": "img"}

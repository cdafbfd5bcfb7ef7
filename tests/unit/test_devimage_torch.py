"""The torch image's recipe and the pip step's helpers — cheap checks, nothing is built.

Building the image itself (``build_image(with_torch=True)``, ~1 min, ~1.1 GB) is left to
``make bench-image``, which uses it; its check command (``import torch`` in runc) runs at
build time.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, replace
from pathlib import Path

from bootseer_dev.image import pip
from bootseer_dev.image.build import (
    FORMAT_VERSION,
    TORCH_REQUIREMENTS,
    WHEELS_DIR,
    ImageRecipe,
)


def test_torch_recipe_is_the_python_image_plus_a_pip_layer_under_its_own_key() -> None:
    python = ImageRecipe(packages=("python3",))
    torch = replace(python, pip=TORCH_REQUIREMENTS, find_links=(WHEELS_DIR,))
    assert torch.base == python and python.base is None
    assert torch.key != python.key
    assert torch.key != replace(torch, pip=("torch==2.13.0+cpu",)).key
    assert torch.name.startswith(python.name + "-pip-torch")
    assert torch.cmd == ["python3"]


def test_images_without_pip_keep_the_keys_they_had() -> None:
    for recipe in (ImageRecipe(), ImageRecipe(packages=("python3",))):
        fields = {k: v for k, v in asdict(recipe).items() if k not in ("pip", "find_links")}
        old = json.dumps(fields | {"format": FORMAT_VERSION}, sort_keys=True)
        assert recipe.key == hashlib.sha256(old.encode()).hexdigest()[:12]


def test_pip_finds_the_image_python_and_rewrites_script_interpreters(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr" / "bin").mkdir(parents=True)
    (rootfs / "usr" / "lib" / "python3.11").mkdir(parents=True)
    os.symlink("python3.11", rootfs / "usr" / "bin" / "python3")
    assert pip.image_python_version(rootfs) == "3.11"
    target = pip.site_dir(rootfs, "3.11")
    assert target == rootfs / "usr/local/lib/python3.11/dist-packages"
    scripts = target / "bin"
    scripts.mkdir(parents=True)
    (scripts / "torchrun").write_text("#!/host/venv/bin/python\nimport sys\n")
    (scripts / "torchrun").chmod(0o755)
    (scripts / "plain").write_text("#!/bin/sh\necho hi\n")
    pip._move_scripts(scripts, rootfs / "usr" / "local" / "bin")
    moved = rootfs / "usr" / "local" / "bin" / "torchrun"
    assert moved.read_text() == "#!/usr/bin/python3\nimport sys\n"
    assert os.access(moved, os.X_OK)
    assert (rootfs / "usr/local/bin/plain").read_text() == "#!/bin/sh\necho hi\n"
    assert not scripts.exists()

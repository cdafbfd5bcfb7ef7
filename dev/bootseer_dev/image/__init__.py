"""Real Debian images for tests and demos: build them, unpack them, run them with runc.

Lazy image loading (issue 5) is only worth something on real images, so this package
builds one from the Debian archive the machine already uses — no registry, no Docker:

    from bootseer_dev.image import build_image, overlay_mount, run_rootfs, unpack_image
    layout = build_image(with_python=True)      # OCI layout, 2 layers; cached after once
    rootfs = unpack_image(layout, tmp / "lower")
    with overlay_mount(rootfs, tmp / "upper", tmp / "work", tmp / "merged") as root:
        run_rootfs(root, ["python3", "-c", "print(6*7)"]).stdout   # "42\\n"

Layer 1 is ``debootstrap --variant=minbase bookworm``, layer 2 (``--python``) the diff
that ``apt-get install python3`` made, as a Dockerfile step would. ``with_torch=True``
(``--torch``) adds layer 3 on top of those same two layers: torch 2.13.0 (CPU) and numpy
pip-installed into ``/usr/local/lib/python3.11/dist-packages``, a >= 1 GiB image for the
start-time benchmark. The layout is what :func:`bootseer.prefetch.image_source.open_image` reads.

Command line: ``python -m bootseer_dev.image build [--python|--torch] [--out DIR]``,
``unpack``, ``run``. All of it needs root, and ``debootstrap`` and ``runc`` from
``scripts/install-system-deps.sh``.
"""

from bootseer.mounts import mount_overlay, unmount
from bootseer.prefetch.container import RuncError, overlay_mount, run_rootfs

from .build import (
    BuildInfo,
    ImageRecipe,
    build_image,
    build_recipe,
    images_dir,
    place,
    read_build_info,
    summary,
)
from .debian import BuildError, find_mirror
from .unpack import UnpackError, unpack_image, unpack_layers

__all__ = [
    "BuildError", "BuildInfo", "ImageRecipe", "RuncError", "UnpackError", "build_image",
    "build_recipe", "find_mirror", "images_dir", "mount_overlay", "overlay_mount", "place",
    "read_build_info", "run_rootfs", "summary", "unmount", "unpack_image", "unpack_layers",
]

"""Build a real Debian image as an OCI layout, once, and keep it in the user's cache.

    from bootseer_dev.image import build_image
    layout = build_image(with_python=True)       # ~1 min the first time, instant after
    layout = build_image(tmp / "img", with_python=True)   # a private copy of it
    layout = build_image(with_torch=True)        # + torch and numpy: a >= 1 GiB image
    layout = build_image(with_torch_cuda=True)   # + the CUDA build of torch: ~6 GB of files

Layer 1 is ``debootstrap --variant=minbase SUITE`` from the machine's own Debian archive;
with packages (``with_python`` asks for ``python3``), layer 2 is what installing them in a
chroot changed, like a Dockerfile ``RUN apt-get install`` step (see
:mod:`bootseer_dev.image.layers` for how the diff is taken).

With pip requirements (``with_torch`` asks for the CPU build of torch 2.13.0 from
``/opt/wheels`` and numpy; ``with_torch_cuda`` for the CUDA build of torch 2.14.1, its
``nvidia-*`` libraries and numpy, a training image's size), the image is built ``FROM``
the cached image without them: its layer blobs are reused as they are (same digests, so a
store holding both keeps them once) and its rootfs is unpacked, then the host's pip
installs the requirements into the image's ``/usr/local/lib/python3.X/dist-packages``
(:mod:`bootseer_dev.image.pip`) and what that changed becomes layer 3, like ``RUN pip
install``. A check command (``import torch``) then runs in the image with runc before the
image is published.

The cache is ``<user cache dir>/bootseer/images/<name>-<key>``, where the key hashes every
input (suite, variant, mirror, packages, the builder's format version): change one and you
get a new image, not a stale one. A build happens in a temporary directory beside it under
an exclusive lock and is renamed into place only when complete, so a crash or a concurrent
build never leaves a half image under the final name. ``bootseer-build.json`` in the layout
records what was built and how big it is (layout readers ignore unknown files).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import platformdirs

from bootseer.filelock import file_lock
from bootseer.prefetch.container import run_rootfs
from bootseer.prefetch.image_source import open_image

from . import debian, layers, oci, pip
from .debian import BuildError
from .unpack import unpack_image

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when the builder's output changes: old cache entries then miss
BUILD_INFO = "bootseer-build.json"
WHEELS_DIR = "/opt/wheels"  # where the machine keeps wheels no index has (CPU torch)
TORCH_REQUIREMENTS = ("torch==2.13.0+cpu", "numpy")
TORCH_CUDA_REQUIREMENTS = ("torch==2.14.1", "numpy")  # the registry's build: CUDA, ~5.5 GB
TORCH_CHECK = ("python3", "-c", "import numpy, torch; print(torch.__version__, "
               "numpy.__version__, float(torch.ones(8, 8).sum()))")


@dataclass(frozen=True)
class ImageRecipe:
    """Everything an image is built from; two equal recipes give the same cache entry."""

    suite: str = "bookworm"
    variant: str = "minbase"
    mirror: str = debian.DEFAULT_MIRROR
    packages: tuple[str, ...] = ()  # installed with apt in a second layer; none: one layer
    pip: tuple[str, ...] = ()  # pip requirements, installed in a third layer (wheels only)
    find_links: tuple[str, ...] = ()  # local wheel directories pip may take them from

    @property
    def name(self) -> str:
        """Human-readable, e.g. ``debian-bookworm-minbase-python3``."""
        parts = ["debian", self.suite, self.variant, *self.packages]
        if self.pip:
            parts += ["pip", *(req.replace("==", "-") for req in self.pip)]
        return "-".join("".join(c if c.isalnum() or c in ".+" else "_" for c in p)
                        for p in parts)

    @property
    def key(self) -> str:
        fields = asdict(self)
        for name in ("pip", "find_links"):  # absent when empty: older images keep their keys
            if not fields[name]:
                del fields[name]
        data = json.dumps(fields | {"format": FORMAT_VERSION}, sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()[:12]

    @property
    def base(self) -> ImageRecipe | None:
        """The image this one is built ``FROM`` (the same without the pip layer), if any."""
        return replace(self, pip=(), find_links=()) if self.pip else None

    @property
    def cmd(self) -> list[str]:
        return ["python3"] if "python3" in self.packages else ["bash"]


@dataclass(frozen=True)
class BuildInfo:
    """What ``bootseer-build.json`` records about a built image."""

    name: str
    key: str
    recipe: dict
    manifest_digest: str
    created: str
    build_seconds: float
    rootfs_bytes: int  # regular-file bytes of the final root filesystem
    layers: list[dict] = field(default_factory=list)  # per layer: digest, sizes, entries...
    pip_installed: list[str] = field(default_factory=list)  # name-version, pip layer only
    check: dict | None = None  # the check command run in the image, and its output

    @property
    def compressed_bytes(self) -> int:
        return sum(layer["size"] for layer in self.layers)


def images_dir() -> Path:
    """Where built images are cached: ``<user cache dir>/bootseer/images``."""
    return Path(platformdirs.user_cache_dir("bootseer")) / "images"


def build_image(out_dir: str | Path | None = None, *, with_python: bool = False,
                with_torch: bool = False, with_torch_cuda: bool = False,
                suite: str = "bookworm", mirror: str | None = None,
                cache_dir: str | Path | None = None, rebuild: bool = False) -> Path:
    """The Debian ``suite`` minbase image (plus a python3 layer, plus a torch layer), as an
    OCI layout directory.

    Built into the cache on first use (needs root, ``debootstrap`` and the network to the
    Debian archive; ``with_torch`` also the torch wheel in :data:`WHEELS_DIR` and the
    package index for its dependencies); later calls with the same inputs return it at
    once. ``with_torch`` and ``with_torch_cuda`` (``import torch`` works without a GPU, so
    a start of it is a real one on any machine) imply ``with_python``. With ``out_dir``, a
    copy is placed there (replacing an OCI layout already there) and its path returned;
    otherwise the cached layout's path. ``mirror`` defaults to the machine's apt source.
    ``rebuild`` rebuilds the requested image only, not the one it is built from.
    """
    recipe = ImageRecipe(suite=suite, mirror=mirror or debian.find_mirror(suite),
                         packages=("python3",) if with_python or with_torch or with_torch_cuda
                         else ())
    check = None
    if with_torch and with_torch_cuda:
        raise BuildError("with_torch (CPU) and with_torch_cuda exclude each other")
    if with_torch:
        recipe = replace(recipe, pip=TORCH_REQUIREMENTS, find_links=(WHEELS_DIR,))
        check = TORCH_CHECK
    if with_torch_cuda:
        recipe = replace(recipe, pip=TORCH_CUDA_REQUIREMENTS)
        check = TORCH_CHECK
    cached = build_recipe(recipe, cache_dir=cache_dir, rebuild=rebuild, check=check)
    return cached if out_dir is None else place(cached, Path(out_dir))


def build_recipe(recipe: ImageRecipe, *, cache_dir: str | Path | None = None,
                 rebuild: bool = False, check: Sequence[str] | None = None) -> Path:
    """The cached OCI layout for ``recipe``, built first if missing (or if ``rebuild``).

    ``check`` is a command run (read-only, with runc) in a freshly built image before it
    is published; a non-zero exit fails the build. Its output is kept in the build info.
    """
    root = Path(cache_dir) if cache_dir is not None else images_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{recipe.name}-{recipe.key}"
    if not rebuild and (final / BUILD_INFO).is_file():
        return final
    with file_lock(root / f".{final.name}.lock"):
        if not rebuild and (final / BUILD_INFO).is_file():
            return final  # someone else built it while we waited
        for stale in root.glob(f".build-{final.name}-*"):
            log.info("removing %s, left by an interrupted build", stale)
            _remove_tree(stale)
        work = Path(tempfile.mkdtemp(dir=root, prefix=f".build-{final.name}-"))
        try:
            _build(recipe, work, cache_dir=root, check=check)
            _replace_dir(work / "image", final)
        finally:
            _remove_tree(work)
    info = read_build_info(final)
    log.info("built %s in %.1f s: rootfs %d bytes, layers %d bytes compressed", final,
             info.build_seconds, info.rootfs_bytes, info.compressed_bytes)
    return final


def read_build_info(layout: Path) -> BuildInfo:
    return BuildInfo(**json.loads((layout / BUILD_INFO).read_text()))


def _build(recipe: ImageRecipe, work: Path, *, cache_dir: Path,
           check: Sequence[str] | None = None) -> None:
    started = time.monotonic()
    rootfs, layout = work / "rootfs", work / "image"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    blobs_written: list[layers.LayerBlob] = []
    history: list[oci.History] = []
    pip_installed: list[str] = []
    created_by = ""  # of the layer on top, when there is one

    def add_layer(created_by: str, changes: list[layers.Change], states: layers.Snapshot) -> None:
        blob = layers.write_layer(rootfs, changes, states, blobs / f".layer-{len(history)}.tmp")
        os.replace(blob.path, oci.blob_path(layout, blob.digest))
        blobs_written.append(blob)
        history.append(oci.History(_now(), created_by))
        log.info("layer %d (%s): %d entries, %d whiteouts, %d bytes tar, %d bytes gzip",
                 len(history), created_by, blob.entries, blob.whiteouts, blob.tar_size,
                 blob.size)

    if recipe.base is not None:
        # FROM the cached base image: its layers as they are, its rootfs as the start.
        base = build_recipe(recipe.base, cache_dir=cache_dir)
        _reuse_layers(base, layout, blobs_written, history)
        unpack_image(base, rootfs)
        before = layers.snapshot(rootfs)
        version = pip.image_python_version(rootfs)
        pip_installed = pip.pip_install(rootfs, recipe.pip, recipe.find_links)
        after = layers.snapshot(rootfs)
        log.info("pip installed %s", ", ".join(pip_installed))
        links = "".join(f" --find-links {d}" for d in recipe.find_links)
        created_by = (f"RUN pip install --target /usr/local/lib/python{version}/dist-packages "
                      f"--only-binary=:all:{links} {' '.join(recipe.pip)}")
    else:
        debian.debootstrap(rootfs, suite=recipe.suite, variant=recipe.variant,
                           mirror=recipe.mirror)
        before = layers.snapshot(rootfs)
        add_layer(f"debootstrap --variant={recipe.variant} {recipe.suite} / {recipe.mirror}",
                  layers.full(before), before)
        after = before
        if recipe.packages:
            debian.apt_install(rootfs, recipe.packages)
            after = layers.snapshot(rootfs)
            created_by = (f"RUN apt-get update && apt-get install -y --no-install-recommends "
                          f"{' '.join(recipe.packages)} && apt-get clean && rm -rf "
                          f"/var/lib/apt/lists/*")
    check_result = _check(rootfs, check) if check else None  # before minutes of gzip
    if after is not before:
        add_layer(created_by, layers.diff(before, after), after)
    created = _now()
    manifest_digest = oci.write_layout(
        layout, blobs_written, history, cmd=recipe.cmd, created=created,
        ref_name=recipe.name, annotations={"dev.bootseer.devimage.key": recipe.key})
    info = BuildInfo(
        name=recipe.name, key=recipe.key, recipe=asdict(recipe),
        manifest_digest=manifest_digest, created=created,
        build_seconds=round(time.monotonic() - started, 1),
        rootfs_bytes=layers.tree_bytes(after),
        layers=[{"digest": b.digest, "diff_id": b.diff_id, "size": b.size,
                 "tar_size": b.tar_size, "entries": b.entries, "whiteouts": b.whiteouts,
                 "content_bytes": b.content_bytes, "created_by": h.created_by}
                for b, h in zip(blobs_written, history)],
        pip_installed=pip_installed, check=check_result)
    (layout / BUILD_INFO).write_text(json.dumps(asdict(info), indent=2) + "\n")


def _reuse_layers(base: Path, layout: Path, blobs_written: list[layers.LayerBlob],
                  history: list[oci.History]) -> None:
    """Take the layers of the built image ``base`` (blobs, sizes, history) as ours."""
    info = read_build_info(base)
    config = open_image(base).config
    steps = config.get("history") or []
    for i, layer in enumerate(info.layers):
        path = oci.blob_path(layout, layer["digest"])
        try:
            os.link(oci.blob_path(base, layer["digest"]), path)  # immutable: share it
        except OSError:
            shutil.copyfile(oci.blob_path(base, layer["digest"]), path)
        blobs_written.append(layers.LayerBlob(
            path, layer["digest"], layer["size"], layer["diff_id"], layer["tar_size"],
            layer["entries"], layer["whiteouts"], layer["content_bytes"]))
        step = steps[i] if i < len(steps) else {}
        history.append(oci.History(step.get("created") or info.created,
                                   step.get("created_by") or layer["created_by"]))
    log.info("reusing the %d layers of %s", len(info.layers), base.name)


def _check(rootfs: Path, argv: Sequence[str]) -> dict:
    """Run ``argv`` in the image (read-only root, runc); fail the build unless it exits 0."""
    started = time.monotonic()
    proc = run_rootfs(rootfs, list(argv), readonly=True, timeout=600)
    if proc.returncode != 0:
        raise BuildError(f"the image's check {list(argv)} failed (rc={proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    log.info("check %s: %s", list(argv), proc.stdout.strip())
    return {"argv": list(argv), "stdout": proc.stdout.strip(),
            "seconds": round(time.monotonic() - started, 1)}


def place(layout: Path, out_dir: Path) -> Path:
    """Copy the OCI layout ``layout`` to ``out_dir`` (atomically; an OCI layout already at
    ``out_dir`` is replaced, any other non-empty directory is an error)."""
    out_dir = out_dir.absolute()
    if out_dir == layout.absolute():
        return out_dir
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "oci-layout").exists():
        raise BuildError(f"{out_dir} exists, is not empty and is not an OCI layout; "
                         "not overwriting it")
    if out_dir.exists() and not out_dir.is_dir():
        raise BuildError(f"{out_dir} exists and is not a directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    try:
        shutil.copytree(layout, tmp / "image")
        _replace_dir(tmp / "image", out_dir)
    finally:
        _remove_tree(tmp)
    return out_dir


def _replace_dir(new: Path, final: Path) -> None:
    """Rename ``new`` to ``final``; an existing ``final`` is moved aside first, then removed."""
    if not final.exists():
        os.rename(new, final)
        return
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    os.rename(final, old)
    os.rename(new, final)
    _remove_tree(old)


def _remove_tree(path: Path) -> None:
    """``rmtree``, refusing to descend into anything mounted below ``path`` (a chroot's
    /proc left mounted would otherwise be walked)."""
    if not path.exists():
        return
    mounted = _mounts_below(path)
    if mounted:
        raise BuildError(f"not removing {path}: still mounted below it: {', '.join(mounted)}")
    shutil.rmtree(path)


def _mounts_below(path: Path) -> list[str]:
    prefix = str(path.resolve()).rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)),
                            line.split()[4])
            if (target + "/").startswith(prefix):
                found.append(target)
    return found


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def summary(layout: Path) -> str:
    """A few lines about a built image, for people."""
    info = read_build_info(layout)
    lines = [f"{layout}", f"  image    {info.name} ({info.manifest_digest})",
             f"  rootfs   {info.rootfs_bytes / 1e6:.1f} MB in files",
             f"  layers   {info.compressed_bytes / 1e6:.1f} MB gzip "
             f"(built in {info.build_seconds:.0f} s)"]
    for i, layer in enumerate(info.layers, 1):
        lines.append(f"  layer {i}  {layer['size'] / 1e6:.1f} MB gzip, "
                     f"{layer['tar_size'] / 1e6:.1f} MB tar, {layer['entries']} entries, "
                     f"{layer['whiteouts']} whiteouts: {layer['created_by']}")
    if info.pip_installed:
        lines.append(f"  pip      {' '.join(info.pip_installed)}")
    if info.check:
        lines.append(f"  check    {info.check['stdout']}")
    return "\n".join(lines)


__all__: Sequence[str] = ["BuildInfo", "ImageRecipe", "build_image", "build_recipe",
                          "images_dir", "place", "read_build_info", "summary"]

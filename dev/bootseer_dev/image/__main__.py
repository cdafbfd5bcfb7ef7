"""`python -m bootseer_dev.image build|unpack|run`: real Debian images from a shell.

    python -m bootseer_dev.image build --python            # prints the cached layout's path
    python -m bootseer_dev.image build --python --out img  # and a copy of it in ./img
    python -m bootseer_dev.image build --torch             # + torch and numpy (>= 1 GiB)
    python -m bootseer_dev.image build --torch-cuda        # + torch's CUDA build (~6 GB)
    python -m bootseer_dev.image unpack img rootfs
    python -m bootseer_dev.image run rootfs -- python3 -c 'print(6*7)'
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import click

from bootseer.errors import BootseerError
from bootseer.prefetch.container import overlay_mount, run_rootfs
from bootseer_dev import log_to_stderr

from .build import build_image, summary
from .unpack import unpack_image


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """Real Debian images (OCI layouts) for Bootseer's tests and demos."""
    log_to_stderr(verbose)


@main.command()
@click.option("--python", "with_python", is_flag=True,
              help="Add python3 from the archive as a second layer.")
@click.option("--torch", "with_torch", is_flag=True,
              help="Also pip-install torch (CPU) and numpy as a third layer (implies --python).")
@click.option("--torch-cuda", "with_torch_cuda", is_flag=True,
              help="Also pip-install the CUDA build of torch 2.14.1 and numpy (~6 GB of "
                   "files; implies --python).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Also place a copy of the image here (replaces an OCI layout there).")
@click.option("--suite", default="bookworm", show_default=True)
@click.option("--mirror", default=None,
              help="Debian archive URL. Default: the one the machine's apt uses.")
@click.option("--rebuild", is_flag=True, help="Build again even if the image is cached.")
def build(with_python: bool, with_torch: bool, with_torch_cuda: bool, out: Path | None,
          suite: str, mirror: str | None, rebuild: bool) -> None:
    """Build the image (or find it in the cache) and print where it is."""
    started = time.monotonic()
    try:
        path = build_image(out, with_python=with_python, with_torch=with_torch,
                           with_torch_cuda=with_torch_cuda, suite=suite,
                           mirror=mirror, rebuild=rebuild)
    except BootseerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(summary(path))
    click.echo(f"  took     {time.monotonic() - started:.1f} s")


@main.command()
@click.argument("image", type=click.Path(exists=True, path_type=Path))
@click.argument("dest", type=click.Path(path_type=Path))
def unpack(image: Path, dest: Path) -> None:
    """Apply every layer of IMAGE (an OCI layout or docker-save archive) into DEST."""
    try:
        click.echo(unpack_image(image, dest))
    except BootseerError as exc:
        raise click.ClickException(str(exc)) from exc


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("rootfs", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--timeout", type=float, default=60, show_default=True)
def run(rootfs: Path, argv: tuple[str, ...], timeout: float) -> None:
    """Run ARGV with runc on a throw-away writable overlay over ROOTFS."""
    try:
        with tempfile.TemporaryDirectory(prefix="bootseer-overlay-") as tmp, overlay_mount(
                rootfs, Path(tmp) / "upper", Path(tmp) / "work", Path(tmp) / "root") as root:
            proc = run_rootfs(root, list(argv), timeout=timeout, text=False)
    except BootseerError as exc:
        raise click.ClickException(str(exc)) from exc
    sys.stdout.buffer.write(proc.stdout)
    sys.stderr.buffer.write(proc.stderr)
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()

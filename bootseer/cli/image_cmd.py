"""``bootseer image``: convert images to the lazy format, mount them, list them.

``mount`` serves an image through FUSE in a child process (:mod:`bootseer.mounts`); the
mount's statistics (blocks and bytes fetched, cache hits) are readable as JSON from the
``user.bootseer.stats`` extended attribute of its root.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from bootseer.cli import AppContext, pass_app
from bootseer.mounts import check_mountpoint, spawn_mount, unmount
from bootseer.progress import byte_progress, console
from bootseer.units import format_size
from prefetch.blockcache import BlockCache
from prefetch.blockformat import DEFAULT_BLOCK_SIZE, IMAGE_REF_PREFIX
from prefetch.image_source import open_image
from prefetch.lazyimage import STATS_XATTR


@click.group()
def image() -> None:
    """Convert container images to lazy images; mount and list them."""


@image.command("convert")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("--name", help="Also name the image (ref images/NAME).")
@click.option("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, show_default=True,
              help="Bytes per content block.")
@pass_app
def convert(app: AppContext, source: Path, name: str | None, block_size: int) -> None:
    """Convert SOURCE (an OCI image layout directory or a `docker save` archive)."""
    from prefetch.convert import convert as run_convert

    src = open_image(source)
    with byte_progress(f"converting {source.name}", None) as advance:
        result = run_convert(src, app.blobs, name=name, block_size=block_size,
                             on_progress=advance)
    click.echo(result.image_id)
    console.print(
        f"{result.files} files, {format_size(result.content_bytes)} of content in "
        f"{result.blocks} blocks ({result.new_blocks} new, "
        f"{format_size(result.stored_bytes)} stored); layers were "
        f"{format_size(result.layer_bytes)}; dedup ratio {result.dedup_ratio:.2f}")


@image.command("ls")
@pass_app
def ls(app: AppContext) -> None:
    """List named images."""
    for name in app.blobs.list_refs(IMAGE_REF_PREFIX):
        click.echo(f"{name[len(IMAGE_REF_PREFIX):]}\t{app.blobs.get_ref(name).digest}")


@image.command("mount")
@click.argument("name")
@click.argument("mountpoint", type=click.Path(file_okay=False, path_type=Path))
@click.option("--foreground", is_flag=True, help="Serve in this process until unmounted.")
@click.option("--timeout", type=float, default=60.0, show_default=True)
@pass_app
def mount(app: AppContext, name: str, mountpoint: Path, foreground: bool,
          timeout: float) -> None:
    """Mount image NAME (a name or an image id) read-only at MOUNTPOINT, lazily."""
    check_mountpoint(mountpoint)
    if foreground:
        from prefetch.fuse import mount as serve
        from prefetch.lazyimage import LazyImage

        cfg = app.loaded.config
        cache = BlockCache(cfg.cache_dir / "blocks", cfg.image.cache_size)
        serve(LazyImage(app.blobs, name, cache), mountpoint)
        return
    args = [sys.executable, "-m", "bootseer", "--store", app.loaded.config.store,
            "image", "mount", "--foreground", name, str(mountpoint)]
    pid = spawn_mount(args, mountpoint, f"image {name}", timeout)
    console.print(f"mounted image {name} at {mountpoint} (pid {pid})")


@image.command("umount")
@click.argument("mountpoint", type=click.Path(path_type=Path))
def umount(mountpoint: Path) -> None:
    """Unmount a lazy image."""
    unmount(mountpoint)


@image.command("stats")
@click.argument("mountpoint", type=click.Path(exists=True, path_type=Path))
def stats(mountpoint: Path) -> None:
    """Print a mounted image's fetch statistics as JSON."""
    click.echo(json.dumps(json.loads(os.getxattr(mountpoint, STATS_XATTR)), indent=2))

"""``bootseer image``: convert images to the lazy format, mount them, list them.

``mount`` serves an image through FUSE in a child process (:mod:`bootseer.mounts`); the
mount's statistics (blocks and bytes fetched, cache hits) are readable as JSON from the
``user.bootseer.stats`` extended attribute of its root.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import click

from bootseer.cli import AppContext, pass_app
from bootseer.errors import BootseerError
from bootseer.mounts import check_mountpoint, spawn_mount, unmount
from bootseer.progress import byte_progress, console
from bootseer.units import format_size
from prefetch.blockcache import BlockCache
from prefetch.blockformat import DEFAULT_BLOCK_SIZE, IMAGE_REF_PREFIX, Manifest
from prefetch.image_source import open_image
from prefetch.lazyimage import STATS_XATTR, resolve_image


@click.group()
def image() -> None:
    """Convert container images to lazy images; mount and list them."""


@image.command("convert")
@click.argument("source")
@click.option("--name", help="Also name the image (ref images/NAME).")
@click.option("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, show_default=True,
              help="Bytes per content block.")
@click.option("--insecure", is_flag=True,
              help="docker://: allow a registry over HTTP or with an unverified certificate.")
@pass_app
def convert(app: AppContext, source: str, name: str | None, block_size: int,
            insecure: bool) -> None:
    """Convert SOURCE: an OCI image layout directory, a `docker save` archive,
    docker://REGISTRY/REPO:TAG (via skopeo) or docker-daemon:REPO:TAG (the Docker engine)."""
    from prefetch.convert import convert as run_convert
    from prefetch.sources import materialized

    with materialized(source, insecure=insecure) as local:
        src = open_image(local)
        with byte_progress(f"converting {Path(source).name}", None) as advance:
            result = run_convert(src, app.blobs, name=name, block_size=block_size,
                                 on_progress=advance, origin=source)
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


@image.command("run")
@click.argument("name")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Seconds before the container is killed.")
@click.option("--stats", "stats_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the fetch statistics of the run as JSON to this file.")
@pass_app
def run(app: AppContext, name: str, argv: tuple[str, ...], timeout: float,
        stats_file: Path | None) -> None:
    """Run ARGV (instead of the image's Cmd) in a runc container on image NAME, lazily.

    The root is an overlay: a fresh writable layer over the lazy mount. The command's
    output is printed, then what the start fetched; the exit code is the command's.
    """
    from prefetch.container import overlay_mount, run_rootfs

    manifest = Manifest.decode(app.blobs.get(resolve_image(app.blobs, name)))
    image_config = manifest.config.get("config") or {}
    # Docker's rule: arguments replace the image's Cmd; its Entrypoint stays in front.
    argv = tuple(image_config.get("Entrypoint") or ()) + (argv or tuple(image_config.get("Cmd")
                                                                        or ()))
    if not argv:
        raise BootseerError(f"image {name} has no Cmd: give the command after --")
    env = dict(item.split("=", 1) for item in image_config.get("Env") or () if "=" in item)
    with tempfile.TemporaryDirectory(prefix="bootseer-run-") as tmp:
        work = Path(tmp)
        lower = work / "lower"
        lower.mkdir()
        spawn_mount([sys.executable, "-m", "bootseer", "--store", app.loaded.config.store,
                     "image", "mount", "--foreground", name, str(lower)],
                    lower, f"image {name}", 60.0)
        try:
            with overlay_mount(lower, work / "upper", work / "work", work / "rootfs") as root:
                result = run_rootfs(root, list(argv), env=env, timeout=timeout,
                                    cwd=image_config.get("WorkingDir") or "/")
            stats = json.loads(os.getxattr(lower, STATS_XATTR))
        finally:
            unmount(lower)
    stats["image_content_bytes"] = manifest.content_bytes
    if stats_file:
        stats_file.write_text(json.dumps(stats, indent=2) + "\n")
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    console.print(f"fetched {format_size(stats['bytes_fetched'])} in "
                  f"{stats['blocks_fetched']} blocks ({stats['fetch_requests']} reads) of "
                  f"{format_size(manifest.content_bytes)} of image content")
    sys.exit(result.returncode)

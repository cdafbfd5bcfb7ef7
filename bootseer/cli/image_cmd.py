"""``bootseer image``: convert images to the lazy format, mount them, list them.

``mount`` serves an image through FUSE in a child process (:mod:`bootseer.serve`); the
mount's statistics (blocks and bytes fetched, cache hits) are readable as JSON from the
statistics file the server refreshes twice a second (``bootseer image stats``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from pathlib import Path

import click

from bootseer.cli import AppContext, pass_app
from bootseer.errors import BootseerError
from bootseer.jsonfile import write_json
from bootseer.mounts import check_mountpoint, is_mounted, server_log, unmount
from bootseer.prefetch.blockformat import DEFAULT_BLOCK_SIZE, IMAGE_REF_PREFIX
from bootseer.prefetch.hotlist import DEFAULT_WORKLOAD
from bootseer.prefetch.image_source import open_image
from bootseer.prefetch.recording import ReadyWhen
from bootseer.prefetch.serverspec import ImageServerSpec
from bootseer.prefetch.session import RECORD_UNTIL
from bootseer.progress import byte_progress, console
from bootseer.serve import spawn_server
from bootseer.units import format_size

log = logging.getLogger(__name__)


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
    from bootseer.prefetch.convert import convert as run_convert
    from bootseer.prefetch.sources import materialized

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
@click.argument("mountpoint", type=Path)
@click.option("--workload", default=DEFAULT_WORKLOAD, show_default=True,
              help="Workload key: starts of the same image with another entry point read "
                   "other blocks, so each key has its own hot list.")
@click.option("--prefetch/--no-prefetch", default=None,
              help="Prefetch the hot list in the background (default: config "
                   "image.prefetch, on).")
@click.option("--ready-marker", type=click.Path(path_type=Path),
              help="Recording: the start is over when this file appears.")
@click.option("--record-timeout", type=float,
              help="Recording: the start is over after this many seconds (default: config "
                   "image.record_timeout).")
@click.option("--record", "record", flag_value="always",
              help="Record which blocks this start reads into the image's hot list.")
@click.option("--record-auto", "record", flag_value="auto",
              help=f"Record only while the hot list has fewer than {RECORD_UNTIL} recordings.")
@click.option("--ready-file", type=click.Path(path_type=Path),
              help="Recording: the start is over when the workload creates this file.")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the mount's final statistics as JSON here when it ends.")
@click.option("--foreground", is_flag=True, help="Serve in this process until unmounted.")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds to wait for the mount to appear.")
@pass_app
def mount(app: AppContext, name: str, mountpoint: Path, workload: str, prefetch: bool | None,
          ready_marker: Path | None, record_timeout: float | None, record: str | None,
          ready_file: Path | None, report: Path | None, foreground: bool,
          timeout: float) -> None:
    """Mount image NAME (a name or an image id) read-only at MOUNTPOINT, lazily.

    Its hot list for the workload, if it has one, is prefetched in the background.
    """
    check_mountpoint(mountpoint)
    config = app.loaded.config
    when = ReadyWhen(ready_file, ready_marker, config.image.record_timeout
                     if record_timeout is None else record_timeout)
    options = {} if prefetch is None else {"prefetch": prefetch}
    spec = ImageServerSpec.of(config, name, mountpoint.absolute(), workload=workload,
                              record=None if record is None else when,
                              record_auto=record == "auto", report=report, **options)
    if foreground:
        from bootseer.agents.runserver import run as run_server

        run_server(spec)
        return
    started = spawn_server(spec, server_log(config.cache_dir / "logs", "image-mount"),
                           timeout=timeout)
    console.print(f"mounted image {name} at {mountpoint} (pid {started.pid})")


@image.command("umount")
@click.argument("mountpoint", type=click.Path(path_type=Path))
def umount(mountpoint: Path) -> None:
    """Unmount a lazy image."""
    unmount(mountpoint)


@image.command("stats")
@click.argument("mountpoint", type=click.Path(exists=True, path_type=Path))
@pass_app
def stats(app: AppContext, mountpoint: Path) -> None:
    """Print a mounted image's fetch statistics as JSON."""
    from bootseer.boundedjson import load_file
    from bootseer.prefetch.serverspec import stats_path
    from bootseer.prefetch.session import MAX_STATS_BYTES, STATS_INTERVAL

    path = stats_path(app.loaded.config.cache_dir, mountpoint)
    if not is_mounted(mountpoint) or not path.exists():
        raise BootseerError(f"no lazy image is mounted at {mountpoint} with this cache "
                            f"directory ({app.loaded.config.cache_dir})")
    asked = time.time()  # wait for the server's next refresh: figures from after this call
    deadline = time.monotonic() + 4 * STATS_INTERVAL
    while path.stat().st_mtime < asked and time.monotonic() < deadline:
        time.sleep(STATS_INTERVAL / 10)
    click.echo(json.dumps(load_file(path, limit=MAX_STATS_BYTES, what=str(path)), indent=2))


@image.command("run")
@click.argument("name")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@click.option("--workload", default=DEFAULT_WORKLOAD, show_default=True,
              help="Workload key: which hot list this start prefetches and records.")
@click.option("--record/--no-record", default=None,
              help="Record this start into the hot list (default: while the hot list has "
                   f"fewer than {RECORD_UNTIL} recordings).")
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Seconds before the container is killed.")
@click.option("--stats", "stats_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the statistics of the run as JSON to this file.")
@click.option("--job", help="The job this start belongs to, for `bootseer report`.")
@pass_app
def run(app: AppContext, name: str, argv: tuple[str, ...], workload: str,
        record: bool | None, timeout: float, stats_file: Path | None,
        job: str | None) -> None:
    """Run ARGV (instead of the image's Cmd) in a runc container on image NAME, lazily.

    The container starts as the runtime shim starts one: the node agent (or, with none
    running, this process) mounts the image with a fresh writable layer over it,
    prefetching its hot list (config image.prefetch), and the container's OCI config is
    rewritten to use it. A recorded start ends when the container exits, creates
    $BOOTSEER_READY_FILE (`bootseer ready`), or after config image.record_timeout. The
    command's output is printed, then what the start fetched; the exit code is the
    command's. The start's timeline goes where the agent keeps it, for `bootseer report`.
    """
    from bootseer.agents import oci
    from bootseer.agents.mountapi import MountRequest
    from bootseer.agents.node import node_mounts
    from bootseer.prefetch.container import DEFAULT_ENV, bundle_config, run_config

    request = MountRequest(id=f"run-{uuid.uuid4().hex[:16]}", image=name, workload=workload,
                           record={True: "always", None: "auto", False: "never"}[record],
                           job=job, runtime="bootseer-image-run")
    started = time.monotonic()
    with node_mounts(app.loaded.config) as mounts:
        mount = mounts.mount(request)
        mounted = time.monotonic() - started
        exit_code = None
        try:
            image_config = mount.image_config
            # Docker's rule: arguments replace the image's Cmd; its Entrypoint stays first.
            command = tuple(image_config.get("Entrypoint") or ()) + (
                argv or tuple(image_config.get("Cmd") or ()))
            if not command:
                raise BootseerError(f"image {name} has no Cmd: give the command after --")
            # As an engine does: the image's Env (filled in by the rewrite), and where it
            # sets no PATH or HOME, the defaults.
            spec = oci.rewrite(bundle_config(mount.rootfs, command, {}), mount)
            spec["process"]["env"] = [f"{k}={v}" for k, v in
                                      (DEFAULT_ENV | oci.env_map(spec)).items()]
            result = run_config(spec, timeout=timeout)
            exit_code = result.returncode
            ran = time.monotonic() - started
        finally:
            start = mounts.release(request.key, exit_code)
    assert start is not None  # released waiting for the record
    stats = dict(start.detail.get("image") or {})
    stats["run_seconds"] = round(ran, 3)  # from the command to the container's exit
    stats["mount_seconds"] = round(mounted, 3)  # of which until the lazy mount was there
    if stats_file:
        write_json(stats_file, stats)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    console.print(_summary(stats))
    sys.exit(result.returncode)


def _summary(stats: dict) -> str:
    lines = [f"started in {stats['run_seconds']:.2f} s; reads fetched "
             f"{format_size(stats['bytes_fetched'])} in {stats['blocks_fetched']} blocks "
             f"({stats['fetch_requests']} reads) of {format_size(stats['image_content_bytes'])} "
             f"of image content"]
    pre = stats.get("prefetch")
    if pre:
        lines.append(f"prefetch: {pre['blocks_fetched']} of {pre['hot_blocks']} hot blocks "
                     f"({format_size(pre['bytes_fetched'])}, {pre['fetch_requests']} reads); "
                     f"reads found {stats['prefetch_hits']} prefetched, waited for "
                     f"{stats['prefetch_waits']}")
    rec = stats.get("recording")
    if rec and rec.get("hot_blocks"):
        lines.append(f"recorded this start ({rec['ended']}): the hot list of workload "
                     f"{rec['workload']!r} has {rec['hot_blocks']} blocks "
                     f"({format_size(rec['hot_bytes'] or 0)}) from {rec['recordings']} "
                     f"recording(s)")
    return "\n".join(lines)


@image.command("docker-stub")
@click.argument("name")
@click.option("--tag", help="The engine image's tag (default: bootseer/NAME:latest).")
@click.option("--docker-host", metavar="URL",
              help="The Docker engine (default: $DOCKER_HOST, else the default socket).")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the stub as a `docker save` archive here instead of loading it "
                   "into Docker (for `podman load -i`, `ctr image import`).")
@pass_app
def docker_stub(app: AppContext, name: str, tag: str | None, docker_host: str | None,
                output: Path | None) -> None:
    """Make an empty engine image that runs lazy image NAME under bootseer-runtime.

    It carries NAME's Cmd, Entrypoint, Env and WorkingDir and BOOTSEER_IMAGE=NAME, so
    `docker run --runtime bootseer TAG` runs NAME from the node agent's lazy root without
    pulling it. Prints the engine's image id (or the archive's path).
    """
    from bootseer.nodecache import NodeCaches
    from bootseer.prefetch.dockerstub import lazy_stub, load_into_docker

    stub = lazy_stub(app.blobs, NodeCaches.for_config(app.loaded.config).blocks(), name,
                     tag or f"bootseer/{name}:latest")
    if output is not None:
        output.write_bytes(stub.archive)
        click.echo(str(output))
        return
    click.echo(load_into_docker(stub, docker_host))
    console.print(f"tagged {stub.tag}: docker run --runtime bootseer {stub.tag}")

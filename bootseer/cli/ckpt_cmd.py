"""``bootseer ckpt``: mount checkpoint directories, and stage checkpoints in and out.

``mount`` runs the FUSE server in a child process (:mod:`bootseer.serve`) and returns
once the mount is live; ``--foreground`` serves in this process. ``put`` and ``get`` copy
files or whole directories with several transfers at once and one progress bar; both open
the store with the configured ``hdfs.*`` options, and ``get`` reads through the one
checkpoint read path (:func:`bootseer.stripedfs.files.open_reader`): a file staged on this
node by ``bootseer warm --checkpoint`` comes from its copy while it is current.
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

from bootseer.cli import AppContext, pass_app
from bootseer.config import ByteSize, FileMode, coerce
from bootseer.mounts import check_mountpoint, server_log, unmount
from bootseer.progress import byte_progress, console
from bootseer.store import ObjectInfo, Store, open_configured_store
from bootseer.stripedfs.files import CheckpointSource, Reader, split_url

_COPY_PIECE = 16 << 20


@click.group()
def ckpt() -> None:
    """Mount checkpoint directories; copy checkpoints to and from the store."""


@ckpt.command("mount")
@click.argument("url")
@click.argument("mountpoint", type=Path)
@click.option("--foreground", is_flag=True, help="Serve in this process until unmounted.")
@click.option("--direct-io/--page-cache", default=True, show_default=True,
              help="Bypass the kernel page cache (faster big sequential reads, measured).")
@click.option("--metadata-ttl", type=float, default=30.0, show_default=True,
              help="Seconds a directory listing is cached.")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds to wait for the mount to come up.")
@click.option("--mode", help="The widest permission bits files show, in octal (default: "
                             "config checkpoint.mount_mode).")
@click.option("--memory", help="Memory for stripes across all open files, e.g. 512m "
                               "(default: config checkpoint.mount_memory).")
@pass_app
def mount(app: AppContext, url: str, mountpoint: Path, foreground: bool, direct_io: bool,
          metadata_ttl: float, timeout: float, mode: str | None, memory: str | None) -> None:
    """Mount the store directory URL read-only at MOUNTPOINT, reads striped in parallel."""
    from bootseer.serve import spawn_server
    from bootseer.stripedfs.serverspec import CheckpointServerSpec

    config = app.loaded.config
    check_mountpoint(mountpoint)
    spec = CheckpointServerSpec.of(
        config, url, mountpoint.absolute(),
        mode=None if mode is None else coerce(FileMode, mode, "mode", "flag --mode"),
        memory=None if memory is None else coerce(ByteSize, memory, "memory", "flag --memory"),
        metadata_ttl=metadata_ttl, direct_io=direct_io)
    if foreground:
        from bootseer.agents.runserver import run as run_server

        run_server(spec)
        return
    started = spawn_server(spec, server_log(config.cache_dir / "logs", "ckpt-mount"),
                           timeout=timeout)
    console.print(f"mounted {url} at {mountpoint} (pid {started.pid})")


@ckpt.command("umount")
@click.argument("mountpoint", type=click.Path(path_type=Path))
def umount(mountpoint: Path) -> None:
    """Unmount MOUNTPOINT (also one whose FUSE process died)."""
    unmount(mountpoint)


@ckpt.command("put")
@click.argument("local", type=click.Path(exists=True, path_type=Path))
@click.argument("url")
@click.option("-j", "--jobs", type=int, default=4, show_default=True,
              help="Files transferred at once.")
@pass_app
def put(app: AppContext, local: Path, url: str, jobs: int) -> None:
    """Copy a LOCAL file (or directory, recursively) to URL in the store."""
    config = app.loaded.config
    if local.is_dir():
        store = open_configured_store(config, url)
        files = sorted(p for p in local.rglob("*") if p.is_file())
        pairs = [(p, store, p.relative_to(local).as_posix()) for p in files]
    else:
        directory, name = split_url(url)
        pairs = [(local, open_configured_store(config, directory), name)]
    total = sum(p.stat().st_size for p, _, _ in pairs)

    with byte_progress(f"uploading {len(pairs)} file(s)", total) as advance:
        def upload(item) -> None:
            path, store, key = item
            with open(path, "rb") as f:
                with store.open_writer() as writer:
                    while chunk := f.read(_COPY_PIECE):
                        writer.write(chunk)
                        advance(len(chunk))
                    writer.commit(key)

        with ThreadPoolExecutor(max(1, jobs)) as pool:
            list(pool.map(upload, pairs))
    console.print(f"uploaded {len(pairs)} file(s), {total} bytes, to {url}")


@ckpt.command("get")
@click.argument("url")
@click.argument("local", type=click.Path(path_type=Path))
@pass_app
def get(app: AppContext, url: str, local: Path) -> None:
    """Copy URL (a file, or a directory recursively) to LOCAL: its staged copy on this
    node while it is current, else striped in parallel from the store."""
    source = CheckpointSource(app.loaded.config)
    parent, name = source.locate(url)
    files: list[tuple[Store, ObjectInfo, Path]]
    try:
        files = [(parent, parent.stat(name), local)]
    except FileNotFoundError:
        store = source.store(url)
        files = [(store, info, local / info.key) for info in store.list()]
        if not files:
            raise FileNotFoundError(f"{url}: no such file or directory in the store") from None
    total = sum(info.size for _, info, _ in files)
    with byte_progress(f"downloading {len(files)} file(s)", total) as advance:
        for store, info, dest in files:
            _download(source.open(store, info.key), dest, advance)
    console.print(f"downloaded {len(files)} file(s), {total} bytes, to {local}")


def _download(reader: Reader, dest: Path, advance) -> None:
    """Sequential reads (parallel underneath, for the striped reader), atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with reader, os.fdopen(fd, "wb") as out:
            buffer = bytearray(_COPY_PIECE)
            offset = 0
            while n := reader.readinto(offset, buffer):
                out.write(memoryview(buffer)[:n])
                offset += n
                advance(n)
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise

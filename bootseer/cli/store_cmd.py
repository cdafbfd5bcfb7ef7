"""``bootseer store``: put, read and inspect blobs and references in the configured store.

Results (digests, bytes, JSON) go to stdout; progress and messages to stderr, so
``bootseer store get sha256:... > file`` and ``digest=$(bootseer store put file)`` work.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import click

from bootseer.cli import AppContext, pass_app
from bootseer.progress import byte_progress, console
from bootseer.store.blobs import is_digest
from bootseer.units import format_size, parse_size
from bootseer.zeros import is_zero

_HOLE_UNIT = 1 << 20  # output regions of this size that are all zero become holes


class _Size(click.ParamType):
    name = "SIZE"

    def convert(self, value, param, ctx):  # type: ignore[override]
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@click.group()
def store() -> None:
    """Put, read and inspect objects in the store."""


@store.command("put")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option("--ref", "ref_name", metavar="NAME", help="Also point reference NAME at the blob.")
@pass_app
def put(app: AppContext, file: Path, ref_name: str | None) -> None:
    """Store FILE ('-' for stdin) as a blob and print its digest."""
    source = sys.stdin.buffer if str(file) == "-" else open(file, "rb")  # noqa: SIM115
    total = None if str(file) == "-" else os.fstat(source.fileno()).st_size
    with source, byte_progress(f"storing {file.name}", total) as advance:
        info = app.blobs.put(source, on_progress=advance)
    if ref_name:
        app.blobs.set_ref(ref_name, info.digest, {"source": str(file)})
    click.echo(info.digest)


@store.command("get")
@click.argument("name")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to this file (atomically, sparse where the blob is zero).")
@click.option("--offset", type=_Size(), default=0, help="First byte to read.")
@click.option("--length", type=_Size(), default=None, help="How many bytes (default: to the end).")
@pass_app
def get(app: AppContext, name: str, output: Path | None, offset: int, length: int | None) -> None:
    """Read blob NAME (a digest or a reference), whole or a byte range, verified."""
    digest = app.blobs.resolve(name)
    size = app.blobs.stat(digest).size
    length = size - offset if length is None else length
    if output is None:
        _copy_range(app, digest, offset, length, sys.stdout.buffer)
        return
    fd, tmp = tempfile.mkstemp(dir=output.parent or ".", prefix=f".{output.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            _copy_range(app, digest, offset, length, out)
            out.truncate(length)
        os.replace(tmp, output)
    except BaseException:
        os.unlink(tmp)
        raise


def _copy_range(app: AppContext, digest: str, offset: int, length: int, out) -> None:
    step = 8 << 20
    sparse = out.seekable()
    with byte_progress(f"reading {digest[:19]}", length) as advance:
        for pos in range(offset, offset + length, step):
            data = app.blobs.read_range(digest, pos, min(step, offset + length - pos))
            for i in range(0, len(data), _HOLE_UNIT):
                piece = data[i : i + _HOLE_UNIT]
                if sparse and is_zero(piece):
                    out.seek(len(piece), os.SEEK_CUR)
                else:
                    out.write(piece)
            advance(len(data))


@store.command("stat")
@click.argument("name")
@pass_app
def stat(app: AppContext, name: str) -> None:
    """Show a blob's digest, size and chunk layout, and the reference if NAME is one."""
    digest = app.blobs.resolve(name)
    table = app.blobs.chunk_table(digest)
    body = {"digest": digest, "size": table.size, "chunk_size": table.chunk_size,
            "chunks": len(table.chunk_digests)}
    if name != digest:
        ref = app.blobs.get_ref(name)
        body |= {"ref": name, "meta": ref.meta, "created": ref.created}
    click.echo(json.dumps(body, indent=2))


@store.command("ls")
@click.option("--refs/--blobs", "refs", default=True, help="List references (default) or blobs.")
@click.argument("prefix", default="")
@pass_app
def ls(app: AppContext, refs: bool, prefix: str) -> None:
    """List references (with the blob each points at) or blobs."""
    if refs:
        for name in app.blobs.list_refs(prefix):
            ref = app.blobs.get_ref(name)
            click.echo(f"{name}\t{ref.digest}\t{format_size(ref.size)}")
    else:
        for info in app.blobs.list():
            if info.digest.startswith(prefix):
                click.echo(f"{info.digest}\t{format_size(info.size)}")


@store.command("ref")
@click.argument("name")
@click.argument("digest")
@pass_app
def ref(app: AppContext, name: str, digest: str) -> None:
    """Point reference NAME at blob DIGEST."""
    app.blobs.set_ref(name, digest)


@store.command("rm")
@click.argument("names", nargs=-1, required=True)
@pass_app
def rm(app: AppContext, names: tuple[str, ...]) -> None:
    """Remove references (by name) or blobs (by digest)."""
    for name in names:
        if is_digest(name):
            app.blobs.delete(name)
        else:
            app.blobs.delete_ref(name)


@store.command("sweep")
@click.option("--older-than", type=click.FloatRange(min=0), default=3600.0, show_default=True,
              metavar="SECONDS", help="Only temporaries last written this long ago.")
@pass_app
def sweep(app: AppContext, older_than: float) -> None:
    """Remove the partial objects of writers that died (a crash mid-put, a killed
    convert): they are never listed or read, but hold the store's space."""
    removed = app.blobs.store.sweep_temporaries(older_than=older_than)
    if removed:
        console.print(f"{removed} temporaries of dead writers removed")


@store.command("verify")
@click.argument("names", nargs=-1)
@pass_app
def verify(app: AppContext, names: tuple[str, ...]) -> None:
    """Re-read blobs (all if none named) and check them against their digests."""
    digests = [app.blobs.resolve(n) for n in names] or [b.digest for b in app.blobs.list()]
    total = sum(app.blobs.stat(d).size for d in digests)
    with byte_progress("verifying", total) as advance:
        for digest in digests:
            for chunk in app.blobs.iter_chunks(digest):
                advance(len(chunk))
    console.print(f"{len(digests)} blobs, {format_size(total)}: all intact")

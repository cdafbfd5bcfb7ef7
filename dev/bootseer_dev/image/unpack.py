"""Unpack an image's layers into a directory: the eager baseline that lazy loading beats.

The layer rules (whiteouts, opaque directories, replacements, hard links) and the checks
against hostile entries are :func:`bootseer.prefetch.rootfs.merge_layers`'s, the same the lazy
image is built from; this module only writes the merged result to disk. File contents
are staged while the layers stream by, then each surviving path is created in tree
order with its owner, mode (setuid included), xattrs and mtime; device nodes and FIFOs
are made with ``mknod``/``mkfifo``. It needs root for a real root filesystem.
Directory mtimes are set last, deepest first, after their contents.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from bootseer.errors import BootseerError
from bootseer.prefetch.image_source import ImageSource, open_image
from bootseer.prefetch.rootfs import Entry, Kind, UnsafeLayerError, merge_layers

log = logging.getLogger(__name__)


class UnpackError(BootseerError):
    """A layer entry cannot be applied safely; the message names the layer and the entry."""


def unpack_image(image: str | Path | ImageSource, dest: str | Path) -> Path:
    """Apply every layer of ``image`` (a layout path or an opened image) into ``dest``.

    ``dest`` must be missing or empty; it gets mode 0755, like a container's root.
    """
    source = image if isinstance(image, ImageSource) else open_image(image)
    return unpack_layers(_layer_streams(source), dest)


def unpack_layers(layers: Iterable[tuple[str, BinaryIO]], dest: str | Path) -> Path:
    """Apply ``(name, decompressed tar stream)`` layers, base first, into ``dest``.

    For callers that get layers some other way than from an image on disk (a pull that
    extracts each layer as soon as it has arrived). Each stream is read while it is the
    current item of ``layers``; a generator may check a layer's digest after it.
    """
    dest = Path(dest).absolute()
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise UnpackError(f"{dest} is not empty")
    dest.chmod(0o755)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.staging-") as tmp:
        staged = iter(range(1 << 62))

        def stage(path: str, fileobj: BinaryIO, size: int) -> Path:
            target = Path(tmp) / str(next(staged))
            with open(target, "wb") as out:
                shutil.copyfileobj(fileobj, out, 1 << 20)
            return target

        try:
            index = merge_layers(layers, stage)
        except UnsafeLayerError as exc:
            raise UnpackError(str(exc)) from exc
        finally:
            close = getattr(layers, "close", None)
            if close is not None:
                close()
        placed: dict[Path, Path] = {}  # staged content -> where it went
        for entry in index:
            if entry.path != "/":
                _create(dest, entry, placed)
        for entry in sorted((e for e in index if e.kind is Kind.DIR and e.path != "/"),
                            key=lambda e: -e.path.count("/")):
            os.utime(dest / entry.path[1:], (entry.mtime, entry.mtime), follow_symlinks=False)
    return dest


def _layer_streams(source: ImageSource):
    for number, layer in enumerate(source.layers, 1):
        with layer.open() as stream:
            yield f"{number} ({layer.digest[:19]})", stream


def _create(dest: Path, entry: Entry[Path], placed: dict[Path, Path]) -> None:
    path = dest / entry.path[1:]
    if entry.kind is Kind.HARDLINK:
        os.link(dest / entry.link_target[1:], path)
        return
    if entry.kind is Kind.DIR:
        path.mkdir()
    elif entry.kind is Kind.FILE:
        staged = entry.content
        assert staged is not None
        if staged in placed:  # two inodes with the same bytes: the second is a copy
            shutil.copyfile(placed[staged], path)
        else:
            os.replace(staged, path)
            placed[staged] = path
    elif entry.kind is Kind.SYMLINK:
        os.symlink(entry.link_target, path)
    elif entry.kind is Kind.FIFO:
        os.mkfifo(path)
    else:
        os.mknod(path, entry.st_mode, os.makedev(entry.devmajor, entry.devminor))
    os.chown(path, entry.uid, entry.gid, follow_symlinks=False)
    if entry.kind is not Kind.SYMLINK:
        os.chmod(path, entry.mode)  # after chown, which clears setuid/setgid
    for name, value in entry.xattrs.items():
        os.setxattr(path, name, value, follow_symlinks=False)
    if entry.kind is not Kind.DIR:
        os.utime(path, (entry.mtime, entry.mtime), follow_symlinks=False)

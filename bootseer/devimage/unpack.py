"""Unpack an image's layers into a directory: the eager baseline that lazy loading beats.

:func:`unpack_image` does what a container runtime's snapshotter does for a plain
directory: apply each layer tar in order, with the OCI whiteout rules
(``.wh.NAME`` removes ``NAME`` of lower layers, ``.wh..wh..opq`` empties a directory of
lower-layer contents), a new entry replacing whatever was at its path (so replacing one
name of a hard-link group never writes through to the others). Ownership, modes (setuid
included), mtimes, device nodes and ``SCHILY.xattr.*`` records are restored, so it needs
root for a real root filesystem. Directory mtimes are set last, after their contents.

The layers are read through :func:`prefetch.image_source.open_image`, so every blob is
verified against its digest. Entries are checked before they are written: no ``..``, no
absolute names, and never through a symlink (a hostile layer could otherwise write to the
host through ``etc -> /etc``).
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
import tarfile
from pathlib import Path

from bootseer.errors import BootseerError
from prefetch.image_source import ImageSource, open_image

log = logging.getLogger(__name__)

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
_XATTR_PREFIX = "SCHILY.xattr."


class UnpackError(BootseerError):
    """A layer entry cannot be applied safely; the message names the layer and the entry."""


def unpack_image(image: str | Path | ImageSource, dest: str | Path) -> Path:
    """Apply every layer of ``image`` (a layout path or an opened image) into ``dest``.

    ``dest`` must be missing or empty; it gets mode 0755, like a container's root.
    """
    source = image if isinstance(image, ImageSource) else open_image(image)
    dest = Path(dest).absolute()
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise UnpackError(f"{dest} is not empty")
    dest.chmod(0o755)
    dir_times: dict[str, tuple[int, int]] = {}
    for number, layer in enumerate(source.layers, 1):
        with layer.open() as stream, tarfile.open(fileobj=stream, mode="r|",
                                                  errors="surrogateescape") as tar:
            _Applier(dest, f"{number} ({layer.digest[:19]})", tar, dir_times).run()
    for rel, times in sorted(dir_times.items(), key=lambda i: -i[0].count("/")):
        path = dest / rel
        if path.is_dir() and not path.is_symlink():  # a later layer may have removed it
            os.utime(path, ns=times, follow_symlinks=False)
    return dest


class _Applier:
    """Applies one layer tar; ``written`` remembers its own paths so that whiteouts and
    opaque markers only hide lower-layer entries."""

    def __init__(self, dest: Path, name: str, tar: tarfile.TarFile,
                 dir_times: dict[str, tuple[int, int]]) -> None:
        self.dest, self.name, self.tar, self.dir_times = dest, name, tar, dir_times
        self.written: set[str] = set()

    def run(self) -> None:
        while (member := self.tar.next()) is not None:
            self._apply(member)
            self.tar.members.clear()  # stream mode would keep every header otherwise

    def _apply(self, member: tarfile.TarInfo) -> None:
        rel = self._normalise(member.name)
        if rel == "":
            return  # the root entry: dest already exists, its mode is ours
        parent, _, base = rel.rpartition("/")
        self._check_parent(parent, member.name)
        if base == OPAQUE_MARKER:
            self._opaque(parent)
            return
        if base.startswith(WHITEOUT_PREFIX):
            hidden = posixpath.join(parent, base[len(WHITEOUT_PREFIX):])
            if hidden not in self.written:
                _remove(self.dest / hidden)
            return
        path = self.dest / rel
        if os.path.lexists(path) and not (member.isdir() and path.is_dir()
                                          and not path.is_symlink()):
            _remove(path)
        if member.islnk():
            target = self._normalise(member.linkname)
            self._check_parent(target.rpartition("/")[0], member.name)
            member.linkname = target  # tarfile links relative to the extraction root
        self.tar.extract(member, self.dest, set_attrs=True, numeric_owner=True,
                         filter="fully_trusted")
        for key, value in member.pax_headers.items():
            if key.startswith(_XATTR_PREFIX):
                os.setxattr(path, key[len(_XATTR_PREFIX):],
                            value.encode("utf-8", "surrogateescape"), follow_symlinks=False)
        mtime_ns = int(member.mtime * 1e9)
        if member.isdir():
            self.dir_times[rel] = (mtime_ns, mtime_ns)
        elif member.issym():  # tarfile leaves a symlink's own time alone
            os.utime(path, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
        while rel and rel not in self.written:  # with its parents: they lead to it
            self.written.add(rel)
            rel = rel.rpartition("/")[0]

    def _opaque(self, directory: str) -> None:
        where = self.dest / directory if directory else self.dest
        if not where.is_dir():
            return
        for child in where.iterdir():
            rel = f"{directory}/{child.name}" if directory else child.name
            if rel not in self.written:
                _remove(child)

    def _normalise(self, name: str) -> str:
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts or name.startswith("/"):
            raise UnpackError(f"layer {self.name}: entry {name!r} would leave the root")
        return "/".join(parts)

    def _check_parent(self, parent: str, member: str) -> None:
        """Every existing component of ``parent`` must be a real directory, not a symlink."""
        path = self.dest
        for part in parent.split("/") if parent else ():
            path = path / part
            if path.is_symlink():
                raise UnpackError(f"layer {self.name}: entry {member!r}: its parent "
                                  f"{path.relative_to(self.dest)} is a symlink")
            if not path.exists():
                return


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()

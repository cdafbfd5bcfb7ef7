"""Read a container image — config, manifest digest, ordered layers — from disk.

Two sources, one result (:class:`ImageSource`):

* an **OCI image layout** directory (``oci-layout``, ``index.json``, ``blobs/sha256/...``),
  as written by ``skopeo copy ... oci:DIR``, ``docker buildx --output type=oci`` or
  ``docker save`` since Docker 25. ``index.json`` may point at an image index (a
  "manifest list"), possibly nested; we pick the only manifest, or the first one for the
  requested platform (``linux/amd64`` by default), or the one named by ``ref``;
* a **``docker save`` archive**: ``manifest.json`` names the config and the layer files by
  their paths in the archive, either legacy ``<id>/layer.tar`` files (duplicates are
  symlinks to each other) or OCI blobs ``blobs/sha256/<hex>``.

Nothing here is trusted. Every blob is checked against its sha256 digest (and its size)
*while it is read*: small JSON blobs before they are parsed, layers as they stream. A layer
is also checked after decompression against the config's ``rootfs.diff_ids``. Because a
tar reader stops at the end-of-archive marker, :meth:`LayerRef.open` reads whatever the
consumer left unread when the ``with`` block ends, so the check covers every byte. A
mismatch raises :class:`~bootseer.errors.IntegrityError` naming the blob; a layout that is
missing pieces or is not an image raises :class:`ImageFormatError`.

Layer compression is declared by the media type and decided by the magic bytes (gzip
``1f 8b``, zstd ``28 b5 2f fd``, anything else is a plain tar), as container runtimes do:
registries and tools do mislabel layers, and the digest check already guarantees the bytes
are the ones the manifest names. A disagreement is logged. Legacy ``docker save`` layers
carry no media type; theirs is derived from the magic bytes.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import posixpath
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import zstandard

from bootseer import boundedjson
from bootseer.errors import BootseerError, IntegrityError

log = logging.getLogger(__name__)


class ImageFormatError(BootseerError):
    """The image on disk is malformed or not a container image; the message says what."""


OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
_INDEX_TYPES = {OCI_INDEX, DOCKER_MANIFEST_LIST}
_MANIFEST_TYPES = {OCI_MANIFEST, DOCKER_MANIFEST}
_CONFIG_TYPES = {
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
}

OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = OCI_LAYER_TAR + "+gzip"
OCI_LAYER_ZSTD = OCI_LAYER_TAR + "+zstd"
# Media type → the compression it declares.
_LAYER_TYPES = {
    OCI_LAYER_TAR: "none",
    OCI_LAYER_GZIP: "gzip",
    OCI_LAYER_ZSTD: "zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": "none",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd": "zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": "gzip",
}
_TYPE_FOR_COMPRESSION = {"none": OCI_LAYER_TAR, "gzip": OCI_LAYER_GZIP, "zstd": OCI_LAYER_ZSTD}
_MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd"}

_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_BLOB_PATH = re.compile(r"blobs/sha256/([0-9a-f]{64})")
# Manifests, indexes and configs are small; a huge one is an attack on our memory.
_MAX_JSON_BLOB = 32 << 20
#: An image's config is kept in its manifest's header, and in each mount's info file, one
#: level down: it may nest one level less than they may.
_CONFIG_DEPTH = boundedjson.MAX_DEPTH - 1
_MAX_INDEX_DEPTH = 4
_CHUNK = 1 << 20


@dataclass(frozen=True)
class LayerRef:
    """One layer of an image, in the order the layers are applied (base first)."""

    digest: str  # identifies the stored blob: the manifest's digest, or the diff_id (below)
    media_type: str
    size: int  # of the stored (possibly compressed) blob
    diff_id: str | None  # sha256 of the uncompressed tar, from the image config
    _open_blob: Callable[[ExitStack], BinaryIO] = field(repr=False, compare=False)

    @contextmanager
    def open(self) -> Iterator[BinaryIO]:
        """The layer as a decompressed tar byte stream, verified against its digests.

        The digests are checked as the bytes go by and, at the end of a ``with`` block
        that raised nothing, over the rest of the blob too, so leaving the block is what
        proves the layer intact (:class:`~bootseer.errors.IntegrityError` otherwise).
        """
        with ExitStack() as stack:
            raw = _VerifyingReader(stack.enter_context(self._open_blob(stack)), self.digest,
                                   self.size, f"layer blob {self.digest}")
            blob = io.BufferedReader(raw, _CHUNK)
            compression = self._compression(blob.peek(4)[:4])
            source: Any = blob
            if compression == "gzip":
                source = _Decompressing(stack.enter_context(
                    gzip.GzipFile(fileobj=blob, mode="rb")), blob, compression, self.digest)
            elif compression == "zstd":
                source = _Decompressing(stack.enter_context(
                    zstandard.ZstdDecompressor().stream_reader(
                        blob, read_across_frames=True, closefd=False)),
                    blob, compression, self.digest)
            if self.diff_id is not None and (compression != "none" or self.diff_id != self.digest):
                source = _VerifyingReader(source, self.diff_id, None,
                                          f"layer {self.digest} (uncompressed)")
            tar = blob if source is blob else io.BufferedReader(source, _CHUNK)
            yield tar
            _drain(tar)
            _drain(blob)  # bytes after the end of the compressed stream are part of the blob

    def _compression(self, head: bytes) -> str:
        sniffed = next((kind for magic, kind in _MAGIC.items() if head.startswith(magic)),
                       "none")
        declared = _LAYER_TYPES[self.media_type]
        if sniffed != declared:
            log.warning("layer %s is declared %s (%s) but its bytes are %s; reading it as %s",
                        self.digest, declared, self.media_type, sniffed, sniffed)
        return sniffed


@dataclass(frozen=True)
class ImageSource:
    """An image as read from disk: what the converter needs to build the lazy image."""

    location: str  # where it was read from, for messages
    config: dict[str, Any]  # the parsed image config (entrypoint, env, rootfs.diff_ids, ...)
    config_digest: str
    manifest_digest: str | None  # None for a legacy `docker save` archive (it has none)
    layers: tuple[LayerRef, ...]


def open_image(path: str | Path, *, ref: str | None = None,
               platform: str = "linux/amd64") -> ImageSource:
    """Read an OCI layout directory or a ``docker save`` archive, whichever ``path`` is.

    ``ref`` picks one of several images: an ``org.opencontainers.image.ref.name``
    annotation in an OCI layout, a ``RepoTags`` entry in a docker archive.
    """
    path = Path(path)
    if path.is_dir():
        return read_oci_layout(path, ref=ref, platform=platform)
    if path.is_file():
        return read_docker_archive(path, tag=ref)
    raise ImageFormatError(f"{path}: no such image directory or archive")


# --- OCI image layout --------------------------------------------------------------------


def read_oci_layout(path: str | Path, *, ref: str | None = None,
                    platform: str = "linux/amd64") -> ImageSource:
    """Read the image an OCI image layout directory holds (see the module docstring)."""
    root = Path(path)
    layout = _parse_json(_read_file(root / "oci-layout"), f"{root}/oci-layout")
    if not isinstance(layout, dict) or "imageLayoutVersion" not in layout:
        raise ImageFormatError(f"{root}/oci-layout: not an OCI layout marker (no "
                               "imageLayoutVersion)")
    index = _parse_json(_read_file(root / "index.json"), f"{root}/index.json")
    candidates = _descriptors(index, f"{root}/index.json")
    if ref is not None:
        candidates = [d for d in candidates if d.ref_name == ref]
        if not candidates:
            names = sorted({d.ref_name for d in _descriptors(index, "") if d.ref_name})
            raise ImageFormatError(f"{root}/index.json: no image named {ref!r} "
                                   f"(names: {', '.join(names) or 'none'})")

    def read_blob(desc: _Descriptor) -> bytes:
        return _read_small_blob(lambda: _open_layout_blob(root, desc.digest), desc)

    desc = _choose(candidates, platform, f"{root}/index.json")
    for _ in range(_MAX_INDEX_DEPTH):
        if desc.media_type not in _INDEX_TYPES:
            break
        where = f"{root}: image index {desc.digest}"
        desc = _choose(_descriptors(_parse_json(read_blob(desc), where), where), platform, where)
    if desc.media_type not in _MANIFEST_TYPES:
        raise ImageFormatError(f"{root}: {desc.digest} has media type {desc.media_type!r}, "
                               "not an image manifest or index (or indexes nest too deep)")
    where = f"{root}: manifest {desc.digest}"
    manifest = _parse_json(read_blob(desc), where)
    if not isinstance(manifest, dict):
        raise ImageFormatError(f"{where}: not a JSON object")
    config_desc = _descriptor(manifest.get("config"), f"{where}: config")
    if config_desc.media_type not in _CONFIG_TYPES:
        raise ImageFormatError(f"{where}: config media type {config_desc.media_type!r} is not "
                               "a container image config (an artifact, not an image?)")
    config = _parse_config(read_blob(config_desc), f"{root}: config {config_desc.digest}")
    layer_list = manifest.get("layers")
    if not isinstance(layer_list, list):
        raise ImageFormatError(f"{where}: no 'layers' list")
    diff_ids = _diff_ids(config, len(layer_list), where)
    layers = []
    for i, item in enumerate(layer_list):
        layer = _descriptor(item, f"{where}: layers[{i}]")
        if layer.media_type not in _LAYER_TYPES:
            raise ImageFormatError(f"{where}: layers[{i}] has unknown media type "
                                   f"{layer.media_type!r}")
        layers.append(LayerRef(layer.digest, layer.media_type, layer.size, diff_ids[i],
                               _layout_opener(root, layer.digest)))
    return ImageSource(str(root), config, config_desc.digest, desc.digest, tuple(layers))


@dataclass(frozen=True)
class _Descriptor:
    media_type: str
    digest: str
    size: int
    platform: tuple[str, str] | None  # (os, architecture)
    ref_name: str | None


def _descriptor(obj: object, where: str) -> _Descriptor:
    if not isinstance(obj, dict):
        raise ImageFormatError(f"{where}: descriptor is not a JSON object")
    media_type, digest, size = obj.get("mediaType"), obj.get("digest"), obj.get("size")
    if not isinstance(media_type, str):
        raise ImageFormatError(f"{where}: descriptor has no mediaType")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ImageFormatError(f"{where}: digest {digest!r} is not a sha256 digest")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ImageFormatError(f"{where}: size {size!r} is not a byte count")
    plat = obj.get("platform")
    platform = (str(plat.get("os")), str(plat.get("architecture"))) if isinstance(
        plat, dict) else None
    annotations = obj.get("annotations")
    ref_name = annotations.get("org.opencontainers.image.ref.name") if isinstance(
        annotations, dict) else None
    return _Descriptor(media_type, digest, size, platform, ref_name)


def _descriptors(index: object, where: str) -> list[_Descriptor]:
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list):
        raise ImageFormatError(f"{where}: no 'manifests' list")
    return [_descriptor(m, f"{where}: manifests[{i}]") for i, m in enumerate(manifests)]


def _choose(descs: list[_Descriptor], platform: str, where: str) -> _Descriptor:
    """The only manifest, else the first one for ``platform`` ("os/arch")."""
    if len(descs) == 1:
        return descs[0]
    wanted = tuple(platform.split("/")[:2])
    for desc in descs:
        if desc.platform == wanted:
            return desc
    found = ", ".join(sorted({"/".join(d.platform) for d in descs if d.platform})) or "none"
    raise ImageFormatError(f"{where}: {len(descs)} manifests and none for {platform} "
                           f"(platforms: {found}); name one with a ref")


def _layout_opener(root: Path, digest: str) -> Callable[[ExitStack], BinaryIO]:
    return lambda stack: stack.enter_context(_open_layout_blob(root, digest))


def _open_layout_blob(root: Path, digest: str) -> BinaryIO:
    """``digest`` was checked by :func:`_descriptor`: the path is built from hex digits."""
    path = root / "blobs" / "sha256" / digest.removeprefix("sha256:")
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise ImageFormatError(f"{root}: blob {digest} is missing ({path})") from None


# --- docker save archives ----------------------------------------------------------------


def read_docker_archive(path: str | Path, *, tag: str | None = None) -> ImageSource:
    """Read the image a ``docker save`` archive holds (one of several: name it by ``tag``)."""
    archive = Path(path)
    with open(archive, "rb") as f:
        head = f.read(4)
    if any(head.startswith(magic) for magic in _MAGIC):
        raise ImageFormatError(f"{archive}: a compressed archive; decompress it first (layers "
                               "are read by seeking, which a compressed archive cannot do)")
    try:
        with tarfile.open(archive, "r:") as tar:
            members = _archive_files(tar)
    except tarfile.TarError as e:
        raise ImageFormatError(f"{archive}: not a tar archive: {e}") from None

    def read(name: str) -> bytes:
        with ExitStack() as stack:
            return _open_archive_member(archive, members, name, stack).read(_MAX_JSON_BLOB + 1)

    entries = _parse_json(read("manifest.json"), f"{archive}: manifest.json")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ImageFormatError(f"{archive}: manifest.json is not a list of objects")
    entry = _choose_tag(entries, tag, archive)
    config_name, layer_names = entry.get("Config"), entry.get("Layers")
    if not isinstance(config_name, str) or not isinstance(layer_names, list) or not all(
            isinstance(n, str) for n in layer_names):
        raise ImageFormatError(f"{archive}: manifest.json entry needs 'Config' (a path) and "
                               "'Layers' (a list of paths)")
    config_bytes = read(config_name)
    actual = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    named = _digest_in_name(config_name)
    if named is not None and named != actual:
        raise IntegrityError(f"{archive}: config {config_name} does not match its digest "
                             f"{named} (read {actual})")
    config = _parse_config(config_bytes, f"{archive}: config {config_name}")
    diff_ids = _diff_ids(config, len(layer_names), f"{archive}: manifest.json")
    layers = []
    for i, name in enumerate(layer_names):
        member = _archive_member(members, name, archive)
        digest = _BLOB_PATH.fullmatch(_normalise_member(name))
        if digest is None and diff_ids[i] is None:
            raise ImageFormatError(f"{archive}: layer {name} has no digest: neither a blob "
                                   "path nor a diff_id in the config")
        with ExitStack() as stack:
            head = _open_archive_member(archive, members, name, stack).read(4)
        compression = next((k for m, k in _MAGIC.items() if head.startswith(m)), "none")
        layers.append(LayerRef(
            f"sha256:{digest.group(1)}" if digest else str(diff_ids[i]),
            _TYPE_FOR_COMPRESSION[compression], member.size, diff_ids[i],
            _archive_opener(archive, members, name)))
    return ImageSource(str(archive), config, named or actual, None, tuple(layers))


def _choose_tag(entries: list[dict], tag: str | None, archive: Path) -> dict:
    if tag is not None:
        for entry in entries:
            if tag in (entry.get("RepoTags") or []):
                return entry
    elif len(entries) == 1:
        return entries[0]
    tags = sorted(t for e in entries for t in (e.get("RepoTags") or []))
    what = f"no image tagged {tag!r}" if tag else f"{len(entries)} images; name one by tag"
    raise ImageFormatError(f"{archive}: manifest.json: {what} (tags: {', '.join(tags) or 'none'})")


def _normalise_member(name: str) -> str:
    return posixpath.normpath(name.lstrip("/")).removeprefix("./")


def _archive_files(tar: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    """Regular files by normalised name, with links inside the archive followed.

    Legacy ``docker save`` stores a layer that two images share once and symlinks the
    other copy to it. Names are only looked up here, never extracted, so a link that
    points anywhere else simply finds nothing.
    """
    members = {_normalise_member(m.name): m for m in tar.getmembers()}
    files = {}
    for name in members:
        target = members.get(_follow_links(members, name))
        if target is not None and target.isfile():
            files[name] = target
    return files


def _follow_links(members: dict[str, tarfile.TarInfo], name: str) -> str:
    for _ in range(16):  # a longer chain is a loop
        member = members.get(name)
        if member is None or not (member.issym() or member.islnk()):
            return name
        target = (posixpath.join(posixpath.dirname(name), member.linkname) if member.issym()
                  else member.linkname)
        name = _normalise_member(target)
    return name


def _archive_member(members: dict[str, tarfile.TarInfo], name: str,
                    archive: Path) -> tarfile.TarInfo:
    member = members.get(_normalise_member(name))
    if member is None:
        raise ImageFormatError(f"{archive}: {name} is missing from the archive")
    return member


def _open_archive_member(archive: Path, members: dict[str, tarfile.TarInfo], name: str,
                         stack: ExitStack) -> BinaryIO:
    member = _archive_member(members, name, archive)
    tar = stack.enter_context(tarfile.open(archive, "r:"))
    stream = tar.extractfile(member)
    assert stream is not None  # _archive_files() keeps regular files only
    return stream


def _archive_opener(archive: Path, members: dict[str, tarfile.TarInfo],
                    name: str) -> Callable[[ExitStack], BinaryIO]:
    return lambda stack: _open_archive_member(archive, members, name, stack)


def _digest_in_name(name: str) -> str | None:
    """``blobs/sha256/<hex>`` or legacy ``<hex>.json`` → ``sha256:<hex>``."""
    match = re.fullmatch(r"(?:blobs/sha256/)?([0-9a-f]{64})(?:\.json)?", _normalise_member(name))
    return f"sha256:{match.group(1)}" if match else None


# --- shared helpers ----------------------------------------------------------------------


def _read_file(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_JSON_BLOB + 1)
    except FileNotFoundError:
        raise ImageFormatError(f"{path} is missing: not an OCI image layout") from None


def _read_small_blob(opener: Callable[[], BinaryIO], desc: _Descriptor) -> bytes:
    if desc.size > _MAX_JSON_BLOB:
        raise ImageFormatError(f"blob {desc.digest} ({desc.media_type}) is {desc.size} bytes; "
                               f"more than {_MAX_JSON_BLOB} for a JSON document")
    with opener() as f:
        reader = _VerifyingReader(f, desc.digest, desc.size, f"blob {desc.digest}")
        return io.BufferedReader(reader).read()


def _parse_json(data: bytes, where: str, depth: int = boundedjson.MAX_DEPTH) -> Any:
    try:
        return boundedjson.loads(data, limit=_MAX_JSON_BLOB, what=where, depth=depth)
    except boundedjson.JSONLimitError as e:
        raise ImageFormatError(str(e)) from None
    except ValueError as e:
        raise ImageFormatError(f"{where}: bad JSON: {e}") from None


def _parse_config(data: bytes, where: str) -> dict[str, Any]:
    config = _parse_json(data, where, _CONFIG_DEPTH)
    if not isinstance(config, dict):
        raise ImageFormatError(f"{where}: not a JSON object")
    return config


def _diff_ids(config: dict[str, Any], count: int, where: str) -> list[str | None]:
    """The config's diff_ids, one per layer; ``None``s when the config lists none."""
    rootfs = config.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if diff_ids is None:
        return [None] * count
    if not isinstance(diff_ids, list) or len(diff_ids) != count or not all(
            isinstance(d, str) and _DIGEST.fullmatch(d) for d in diff_ids):
        raise ImageFormatError(f"{where}: the config's rootfs.diff_ids do not list one sha256 "
                               f"digest for each of the {count} layers")
    return list(diff_ids)


def _drain(stream: BinaryIO) -> None:
    while stream.read(_CHUNK):
        pass


class _VerifyingReader(io.RawIOBase):
    """Pass bytes through, hashing them; at the end check the byte count and the digest."""

    def __init__(self, source: BinaryIO, digest: str, size: int | None, what: str) -> None:
        super().__init__()
        self._source = source
        self._digest = digest
        self._size = size
        self._what = what
        self._hash = hashlib.sha256()
        self._count = 0
        self._checked = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._source.read(len(view))
        if not data:
            self._check()
            return 0
        view[:len(data)] = data
        self._hash.update(data)
        self._count += len(data)
        if self._size is not None and self._count > self._size:
            raise IntegrityError(f"{self._what}: longer than its declared {self._size} bytes")
        return len(data)

    def _check(self) -> None:
        if self._checked:
            return
        self._checked = True
        if self._size is not None and self._count != self._size:
            raise IntegrityError(f"{self._what}: {self._count} bytes, expected {self._size}")
        actual = "sha256:" + self._hash.hexdigest()
        if actual != self._digest:
            raise IntegrityError(f"{self._what} does not match its digest (read {actual})")


class _Decompressing(io.RawIOBase):
    """Decompressed bytes; a decompression failure is reported as what it really is.

    Corrupt compressed data usually breaks the decompressor before the digest can be
    checked, so on a failure the rest of the blob is read: a blob that is not what the
    manifest names raises :class:`~bootseer.errors.IntegrityError`; one that is (the image
    was built broken) raises :class:`ImageFormatError`.
    """

    def __init__(self, stream: BinaryIO, blob: BinaryIO, compression: str,
                 digest: str) -> None:
        super().__init__()
        self._stream = stream
        self._blob = blob
        self._what = f"layer {digest}: corrupt {compression} data"

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        try:
            data = self._stream.read(len(view))
        except (OSError, EOFError, zlib.error, zstandard.ZstdError) as e:
            _drain(self._blob)
            raise ImageFormatError(f"{self._what}: {e}") from e
        view[:len(data)] = data
        return len(data)

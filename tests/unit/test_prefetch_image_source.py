"""Tests for bootseer.prefetch.image_source: OCI layouts and ``docker save`` archives written here
from the multi-layer test image, digests verified while reading, malformed inputs."""

from __future__ import annotations

import gzip
import io
import json
import logging
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest
from support.layers import layer, merge, multi_layer_image, reg, sha_store
from support.oci import CONFIG_TYPE, config_for, put_blob, sha, write_image, write_layout

from bootseer.errors import IntegrityError
from bootseer.prefetch.image_source import (
    DOCKER_MANIFEST,
    OCI_INDEX,
    OCI_LAYER_GZIP,
    OCI_LAYER_TAR,
    OCI_LAYER_ZSTD,
    OCI_MANIFEST,
    ImageFormatError,
    ImageSource,
    open_image,
    read_docker_archive,
    read_oci_layout,
)
from bootseer.prefetch.rootfs import merge_layers


def oci_image(root: Path, media_types: list[str] | None = None) -> Path:
    layers = multi_layer_image()
    media_types = media_types or [OCI_LAYER_GZIP, OCI_LAYER_ZSTD, OCI_LAYER_TAR]
    return write_layout(root, [write_image(root, layers, media_types)])


def write_docker_archive(path: Path, images: dict[str, list[bytes]], *,
                         blobs: bool = False) -> Path:
    """A ``docker save`` archive: legacy ``<id>/layer.tar`` files (a layer two images share
    is a symlink the second time, as Docker writes it) or OCI blobs (Docker 25+)."""
    entries, written = [], {}
    with tarfile.open(path, "w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for tag, layers in images.items():
            config = config_for(layers)
            config_name = (f"blobs/sha256/{sha(config)[7:]}" if blobs
                           else f"{sha(config)[7:]}.json")
            add(config_name, config)
            names = []
            for number, data in enumerate(layers):
                stored = gzip.compress(data, mtime=0) if blobs and number == 1 else data
                name = (f"blobs/sha256/{sha(stored)[7:]}" if blobs
                        else f"{sha(data + tag.encode())[7:]}/layer.tar")
                if sha(stored) in written:
                    link = tarfile.TarInfo(name)
                    link.type, link.linkname = tarfile.SYMTYPE, f"../{written[sha(stored)]}"
                    tar.addfile(link)
                else:
                    add(name, stored)
                    written[sha(stored)] = name
                names.append(name)
            entries.append({"Config": config_name, "RepoTags": [tag], "Layers": names})
        add("manifest.json", json.dumps(entries).encode())
    return path


def layer_streams(source: ImageSource) -> Iterator[tuple[str, BinaryIO]]:
    for ref in source.layers:
        with ref.open() as stream:
            yield ref.digest, stream


def test_oci_layout_with_gzip_zstd_and_plain_layers(tmp_path: Path):
    root = oci_image(tmp_path / "oci")
    source = open_image(root)
    layers = multi_layer_image()
    assert source.config["config"]["Entrypoint"] == ["/bin/su"]
    assert source.manifest_digest == json.loads((root / "index.json").read_text())[
        "manifests"][0]["digest"]
    assert [ref.media_type for ref in source.layers] == [OCI_LAYER_GZIP, OCI_LAYER_ZSTD,
                                                         OCI_LAYER_TAR]
    assert [ref.diff_id for ref in source.layers] == [sha(t) for t in layers]
    assert source.layers[2].digest == sha(layers[2])
    assert source.layers[0].size == len(gzip.compress(layers[0], mtime=0))
    with source.layers[1].open() as stream:
        assert stream.read() == layers[1]
    assert merge_layers(layer_streams(source), sha_store) == merge(*layers)


def test_docker_save_legacy_archive_with_a_shared_layer(tmp_path: Path):
    layers = multi_layer_image()
    other = [layers[0], layer(reg("only-in-b", b"b"))]
    archive = write_docker_archive(tmp_path / "save.tar", {"a:1": layers, "b:2": other})
    with pytest.raises(ImageFormatError, match="2 images; name one by tag.*a:1, b:2"):
        open_image(archive)
    source = open_image(archive, ref="a:1")
    assert source.manifest_digest is None
    assert source.config_digest == sha(config_for(layers))
    assert [ref.digest for ref in source.layers] == [sha(t) for t in layers]
    assert merge_layers(layer_streams(source), sha_store) == merge(*layers)
    b = read_docker_archive(archive, tag="b:2")  # its base layer is a symlink in the archive
    assert merge_layers(layer_streams(b), sha_store) == merge(*other)
    with pytest.raises(ImageFormatError, match="no image tagged 'c:3'"):
        read_docker_archive(archive, tag="c:3")


def test_docker_save_archive_with_oci_blobs(tmp_path: Path):
    layers = multi_layer_image()
    source = open_image(write_docker_archive(tmp_path / "save.tar", {"x:y": layers},
                                             blobs=True))
    assert [ref.media_type for ref in source.layers] == [OCI_LAYER_TAR, OCI_LAYER_GZIP,
                                                         OCI_LAYER_TAR]
    assert source.layers[1].digest == sha(gzip.compress(layers[1], mtime=0))
    assert merge_layers(layer_streams(source), sha_store) == merge(*layers)


def test_image_index_picks_linux_amd64_through_nested_indexes(tmp_path: Path):
    root = tmp_path / "oci"
    arm = write_image(root, [layer(reg("arm"))], [OCI_LAYER_GZIP], arch="arm64")
    amd = write_image(root, [layer(reg("amd"))], [OCI_LAYER_GZIP])
    inner = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [arm, amd]})
    write_layout(root, [put_blob(root, inner.encode(), OCI_INDEX)])
    source = read_oci_layout(root)
    assert source.manifest_digest == amd["digest"]
    assert read_oci_layout(root, platform="linux/arm64").manifest_digest == arm["digest"]
    with pytest.raises(ImageFormatError, match="none for linux/s390x.*linux/amd64, linux/arm64"):
        read_oci_layout(root, platform="linux/s390x")


def test_the_only_manifest_is_taken_whatever_its_platform(tmp_path: Path):
    root = tmp_path / "oci"
    arm = write_image(root, [layer(reg("arm"))], [OCI_LAYER_TAR], arch="arm64")
    write_layout(root, [arm])
    assert read_oci_layout(root).manifest_digest == arm["digest"]


def test_image_chosen_by_ref_name(tmp_path: Path):
    root = tmp_path / "oci"
    names = "org.opencontainers.image.ref.name"
    one = write_image(root, [layer(reg("one"))], [OCI_LAYER_TAR], annotations={names: "one"})
    two = write_image(root, [layer(reg("two"))], [OCI_LAYER_TAR], annotations={names: "two"})
    write_layout(root, [one, two])
    assert read_oci_layout(root, ref="two").manifest_digest == two["digest"]
    with pytest.raises(ImageFormatError, match="no image named 'three' .names: one, two"):
        read_oci_layout(root, ref="three")


def test_docker_media_types_are_accepted(tmp_path: Path):
    root = tmp_path / "oci"
    data = layer(reg("f", b"x"))
    blob = gzip.compress(data, mtime=0)
    config = put_blob(root, config_for([data]), "application/vnd.docker.container.image.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "config": config, "layers": [
        put_blob(root, blob, "application/vnd.docker.image.rootfs.diff.tar.gzip")]}
    write_layout(root, [put_blob(root, json.dumps(manifest).encode(), DOCKER_MANIFEST)])
    source = read_oci_layout(root)
    assert merge_layers(layer_streams(source), sha_store) == merge(data)


def test_magic_bytes_decide_when_the_media_type_is_wrong(tmp_path: Path, caplog):
    layers = multi_layer_image()
    root = tmp_path / "oci"
    manifest = write_image(root, layers, [OCI_LAYER_ZSTD, OCI_LAYER_GZIP, OCI_LAYER_TAR])
    write_layout(root, [manifest])
    # Relabel: the zstd layer claims gzip, the gzip one claims plain tar.
    doc_path = root / "blobs" / "sha256" / manifest["digest"][7:]
    doc = json.loads(doc_path.read_text())
    doc["layers"][0]["mediaType"], doc["layers"][1]["mediaType"] = OCI_LAYER_GZIP, OCI_LAYER_TAR
    write_layout(root, [put_blob(root, json.dumps(doc).encode(), OCI_MANIFEST)])
    with caplog.at_level(logging.WARNING, "bootseer.prefetch.image_source"):
        index = merge_layers(layer_streams(read_oci_layout(root)), sha_store)
    assert index == merge(*layers)
    assert sum("is declared" in r.message for r in caplog.records) == 2


# --- integrity ----------------------------------------------------------------------------


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x55
    path.write_bytes(bytes(data))


def _blob(root: Path, digest: str) -> Path:
    return root / "blobs" / "sha256" / digest.removeprefix("sha256:")


@pytest.mark.parametrize("number,offset", [(0, 100), (1, 200), (2, 700), (2, -1)],
                         ids=["gzip", "zstd", "tar-header", "tar-end-padding"])
def test_a_corrupt_layer_blob_is_named(tmp_path: Path, number: int, offset: int):
    root = oci_image(tmp_path / "oci")
    source = read_oci_layout(root)
    bad = source.layers[number]
    _flip(_blob(root, bad.digest), offset)
    with pytest.raises(IntegrityError, match=f"layer blob {bad.digest} does not match"):
        merge_layers(layer_streams(source), sha_store)


def test_corruption_that_breaks_the_tar_is_reported_as_corruption(tmp_path: Path):
    root = oci_image(tmp_path / "oci", [OCI_LAYER_TAR] * 3)
    source = read_oci_layout(root)
    _flip(_blob(root, source.layers[1].digest), 3)  # the first header's checksum fails
    with pytest.raises(IntegrityError, match=source.layers[1].digest) as info:
        merge_layers(layer_streams(source), sha_store)
    assert "not a valid tar stream" in str(info.value.__context__)


def test_the_end_of_a_layer_is_verified_even_if_the_reader_stops_early(tmp_path: Path):
    root = oci_image(tmp_path / "oci", [OCI_LAYER_TAR] * 3)
    source = read_oci_layout(root)
    _flip(_blob(root, source.layers[0].digest), -1)  # in the zero padding after the archive
    with pytest.raises(IntegrityError, match=source.layers[0].digest):
        with source.layers[0].open() as stream:
            assert stream.read(512)


def test_truncated_and_extended_blobs(tmp_path: Path):
    root = oci_image(tmp_path / "oci")
    source = read_oci_layout(root)
    path = _blob(root, source.layers[0].digest)
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(IntegrityError, match=f"layer blob {source.layers[0].digest}"):
        merge_layers(layer_streams(source), sha_store)
    path.write_bytes(data + b"more")
    with pytest.raises(IntegrityError, match="longer than its declared"):
        merge_layers(layer_streams(source), sha_store)


def test_a_corrupt_config_or_manifest_is_named(tmp_path: Path):
    root = oci_image(tmp_path / "oci")
    source = read_oci_layout(root)
    _flip(_blob(root, source.config_digest), 5)
    with pytest.raises(IntegrityError, match=f"blob {source.config_digest} does not match"):
        read_oci_layout(root)
    _flip(_blob(root, source.config_digest), 5)
    _flip(_blob(root, source.manifest_digest), 5)
    with pytest.raises(IntegrityError, match=f"blob {source.manifest_digest} does not match"):
        read_oci_layout(root)


def test_diff_id_is_checked_after_decompression(tmp_path: Path):
    layers = multi_layer_image()
    root = tmp_path / "oci"
    manifest = write_image(root, layers, [OCI_LAYER_GZIP] * 3)
    config_doc = json.loads(config_for(layers))
    config_doc["rootfs"]["diff_ids"][1] = sha(b"something else")
    doc = json.loads(_blob(root, manifest["digest"]).read_bytes())
    doc["config"] = put_blob(root, json.dumps(config_doc).encode(), CONFIG_TYPE)
    write_layout(root, [put_blob(root, json.dumps(doc).encode(), OCI_MANIFEST)])
    source = read_oci_layout(root)
    with pytest.raises(IntegrityError, match=f"layer {source.layers[1].digest} .uncompressed."):
        merge_layers(layer_streams(source), sha_store)


def test_a_corrupt_legacy_docker_layer_fails_its_diff_id(tmp_path: Path):
    layers = multi_layer_image()
    archive = write_docker_archive(tmp_path / "save.tar", {"a:1": layers})
    data = archive.read_bytes()
    marker = b"was a symlink"  # content in layer 1
    archive.write_bytes(data.replace(marker, marker.upper()))
    source = read_docker_archive(archive)
    with pytest.raises(IntegrityError, match=f"layer blob {sha(layers[1])} does not match"):
        merge_layers(layer_streams(source), sha_store)


def test_broken_compression_with_a_matching_digest_is_a_format_error(tmp_path: Path):
    root = tmp_path / "oci"
    broken = gzip.compress(layer(reg("f", b"x" * 1000)), mtime=0)[:-30] + b"\0" * 30
    config = put_blob(root, b'{"rootfs": {"type": "layers"}}', CONFIG_TYPE)
    manifest = {"schemaVersion": 2, "config": config,
                "layers": [put_blob(root, broken, OCI_LAYER_GZIP)]}
    write_layout(root, [put_blob(root, json.dumps(manifest).encode(), OCI_MANIFEST)])
    source = read_oci_layout(root)
    assert source.layers[0].diff_id is None
    with pytest.raises(ImageFormatError, match="corrupt gzip data"):
        merge_layers(layer_streams(source), sha_store)


# --- malformed input ----------------------------------------------------------------------


def _edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _rewrite_manifest(root: Path, change) -> None:
    index = json.loads((root / "index.json").read_text())
    doc = json.loads(_blob(root, index["manifests"][0]["digest"]).read_bytes())
    change(doc)
    write_layout(root, [put_blob(root, json.dumps(doc).encode(), OCI_MANIFEST)])


def _set(key, value):
    def change(doc):
        doc[key] = value
    return change


def _set_layer(key, value):
    def change(doc):
        doc["layers"][0][key] = value
    return change


BROKEN_LAYOUTS = {
    "no-oci-layout": (lambda r: (r / "oci-layout").unlink(), "oci-layout is missing"),
    "bad-oci-layout": (lambda r: (r / "oci-layout").write_text("[]"), "not an OCI layout"),
    "no-index": (lambda r: (r / "index.json").unlink(), "index.json is missing"),
    "bad-json": (lambda r: (r / "index.json").write_text("{nope"), "index.json: bad JSON"),
    "no-manifests": (lambda r: (r / "index.json").write_text("{}"), "no 'manifests' list"),
    "empty-index": (lambda r: _edit_json(r / "index.json", _set("manifests", [])),
                    "0 manifests and none for linux/amd64"),
    "traversal-digest": (lambda r: _edit_json(r / "index.json", lambda d: d["manifests"][0]
                                              .update(digest="sha256:../../etc/passwd")),
                         "is not a sha256 digest"),
    "sha512": (lambda r: _edit_json(r / "index.json", lambda d: d["manifests"][0].update(
        digest="sha512:" + "0" * 128)), "is not a sha256 digest"),
    "bad-size": (lambda r: _edit_json(r / "index.json", lambda d: d["manifests"][0].update(
        size="12")), "is not a byte count"),
    "missing-blob": (lambda r: _blob(r, json.loads((r / "index.json").read_text())[
        "manifests"][0]["digest"]).unlink(), "blob sha256:.* is missing"),
    "unknown-manifest-type": (lambda r: _edit_json(r / "index.json", lambda d: d["manifests"][
        0].update(mediaType="application/x-helm")), "'application/x-helm', not an image"),
    "unknown-layer-type": (lambda r: _rewrite_manifest(r, _set_layer("mediaType", "text/plain")),
                           "layers.0. has unknown media type 'text/plain'"),
    "artifact-config": (lambda r: _rewrite_manifest(r, lambda d: d["config"].update(
        mediaType="application/vnd.cncf.helm.config.v1+json")), "not a container image config"),
    "no-layers": (lambda r: _rewrite_manifest(r, _set("layers", None)), "no 'layers' list"),
    "diff-ids-mismatch": (lambda r: _rewrite_manifest(r, lambda d: d["layers"].pop()),
                          "diff_ids do not list one sha256 digest for each of the 2 layers"),
}


@pytest.mark.parametrize("breakage,message", BROKEN_LAYOUTS.values(), ids=BROKEN_LAYOUTS.keys())
def test_malformed_oci_layouts(tmp_path: Path, breakage, message):
    root = oci_image(tmp_path / "oci")
    breakage(root)
    with pytest.raises(ImageFormatError, match=message):
        open_image(root)


def _archive_with(tmp_path: Path, files: dict[str, bytes]) -> Path:
    path = tmp_path / "bad.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_malformed_docker_archives(tmp_path: Path):
    config = config_for([layer()])
    cases = {
        "is missing from the archive": {"other": b""},
        "manifest.json: bad JSON": {"manifest.json": b"{"},
        "not a list of objects": {"manifest.json": b'{"Config": "x"}'},
        "needs 'Config'": {"manifest.json": b'[{"Layers": []}]'},
        "l/layer.tar is missing": {"manifest.json": b'[{"Config": "c.json", "Layers": '
                                                    b'["l/layer.tar"]}]', "c.json": config},
        "diff_ids do not list": {"manifest.json": b'[{"Config": "c.json", "Layers": []}]',
                                 "c.json": config},
        "does not match its digest": {
            "manifest.json": json.dumps([{"Config": f"{'0' * 64}.json", "Layers": []}]).encode(),
            f"{'0' * 64}.json": config},
    }
    for message, files in cases.items():
        with pytest.raises((ImageFormatError, IntegrityError), match=message):
            read_docker_archive(_archive_with(tmp_path, files))
    compressed = tmp_path / "save.tar.gz"
    compressed.write_bytes(gzip.compress(b"x"))
    with pytest.raises(ImageFormatError, match="decompress it first"):
        open_image(compressed)
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(b"not a tar" * 100)
    with pytest.raises(ImageFormatError, match="not a tar archive"):
        open_image(garbage)
    with pytest.raises(ImageFormatError, match="no such image"):
        open_image(tmp_path / "nothing")

"""The merged view of the multi-layer image equals what a real GNU ``tar -x`` (as root: owners,
devices, xattrs) extracts from the same layers."""

from __future__ import annotations

from pathlib import Path

from support.layers import (
    describe_disk,
    describe_index,
    extract_like_a_runtime,
    merge,
    multi_layer_image,
)


def test_merge_equals_real_tar_extraction(tmp_path: Path, nothing_written: Path) -> None:
    layers = multi_layer_image()
    root = tmp_path / "rootfs"
    root.mkdir()
    extract_like_a_runtime(layers, root, tmp_path)
    on_disk, disk_groups = describe_disk(root)
    in_index, index_groups = describe_index(merge(*layers))
    assert sorted(in_index) == sorted(on_disk)
    for path in on_disk:
        assert in_index[path] == on_disk[path], path
    assert index_groups == disk_groups
    assert any(len(g) == 3 for g in disk_groups)

"""The layout builds exactly kubelet's paths (reference csi-node-service.md §4)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from volfsm.node.layout import (
    RootLayout,
    UnsafePathError,
    escape_plugin_name,
    plugin_name_parts,
    unescape_plugin_name,
)

UID = "6f2c1d7e-0b7a-4a51-9d0e-2f3c4b5a6d7e"


@pytest.fixture
def lay(tmp_path: Path) -> RootLayout:
    return RootLayout(tmp_path)


def rel(lay: RootLayout, path: Path) -> str:
    return os.fspath(path.relative_to(lay.root))


def test_pod_paths_match_kubelet(lay: RootLayout) -> None:
    assert rel(lay, lay.pod_dir(UID)) == f"pods/{UID}"
    assert rel(lay, lay.pod_volumes_dir(UID)) == f"pods/{UID}/volumes"
    assert (
        rel(lay, lay.pod_volume_dir(UID, "kubernetes.io~empty-dir", "cache"))
        == f"pods/{UID}/volumes/kubernetes.io~empty-dir/cache"
    )
    assert (
        rel(lay, lay.pod_volume_devices_dir(UID, "kubernetes.io~csi"))
        == f"pods/{UID}/volumeDevices/kubernetes.io~csi"
    )
    assert (
        rel(lay, lay.pod_volume_device_path(UID, "kubernetes.io~csi", "pv-1"))
        == f"pods/{UID}/volumeDevices/kubernetes.io~csi/pv-1"
    )
    assert (
        rel(lay, lay.pod_plugin_dir(UID, "kubernetes.io~empty-dir", "cache"))
        == f"pods/{UID}/plugins/kubernetes.io~empty-dir/cache"
    )


def test_plugin_dir_is_the_plugin_name_as_a_path(lay: RootLayout) -> None:
    assert rel(lay, lay.plugin_dir("kubernetes.io/csi")) == "plugins/kubernetes.io/csi"
    assert rel(lay, lay.plugin_dir("kubernetes.io/empty-dir")) == "plugins/kubernetes.io/empty-dir"


def test_csi_filesystem_staging_uses_sha256_of_the_handle(lay: RootLayout) -> None:
    handle = "projects/p/zones/z/disks/d-1"
    digest = hashlib.sha256(handle.encode()).hexdigest()
    base = f"plugins/kubernetes.io/csi/hostpath.csi.k8s.io/{digest}"
    assert rel(lay, lay.csi_staging_dir("hostpath.csi.k8s.io", handle)) == base
    assert rel(lay, lay.csi_staging_path("hostpath.csi.k8s.io", handle)) == f"{base}/globalmount"
    assert (
        rel(lay, lay.csi_staging_vol_data_path("hostpath.csi.k8s.io", handle))
        == f"{base}/vol_data.json"
    )


def test_csi_publish_paths(lay: RootLayout) -> None:
    base = f"pods/{UID}/volumes/kubernetes.io~csi/pv-1"
    assert rel(lay, lay.csi_publish_dir(UID, "pv-1")) == base
    assert rel(lay, lay.csi_publish_path(UID, "pv-1")) == f"{base}/mount"
    assert rel(lay, lay.csi_vol_data_path(UID, "pv-1")) == f"{base}/vol_data.json"


def test_csi_block_paths(lay: RootLayout) -> None:
    block = "plugins/kubernetes.io/csi/volumeDevices"
    assert rel(lay, lay.csi_block_root()) == block
    assert rel(lay, lay.csi_block_dir("pv-1")) == f"{block}/pv-1"
    assert rel(lay, lay.csi_block_global_map_path("pv-1")) == f"{block}/pv-1/dev"
    assert rel(lay, lay.csi_block_vol_data_path("pv-1")) == f"{block}/pv-1/data/vol_data.json"
    assert rel(lay, lay.csi_block_staging_path("pv-1")) == f"{block}/staging/pv-1"
    assert rel(lay, lay.csi_block_publish_dir("pv-1")) == f"{block}/publish/pv-1"
    assert rel(lay, lay.csi_block_publish_path("pv-1", UID)) == f"{block}/publish/pv-1/{UID}"
    assert (
        rel(lay, lay.csi_block_pod_device_dir(UID)) == f"pods/{UID}/volumeDevices/kubernetes.io~csi"
    )
    assert (
        rel(lay, lay.csi_block_pod_device_path(UID, "pv-1"))
        == f"pods/{UID}/volumeDevices/kubernetes.io~csi/pv-1"
    )


def test_plugin_name_escaping_round_trips() -> None:
    assert escape_plugin_name("kubernetes.io/csi") == "kubernetes.io~csi"
    assert unescape_plugin_name("kubernetes.io~empty-dir") == "kubernetes.io/empty-dir"
    assert plugin_name_parts("kubernetes.io/csi") == ("kubernetes.io", "csi")


def test_root_with_a_symlink_in_its_own_path_is_resolved_once(tmp_path: Path) -> None:
    real = tmp_path / "real-root"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    lay = RootLayout(tmp_path / "alias")
    assert lay.root == real.resolve()
    assert lay.pod_dir("u").parent == real.resolve() / "pods"


def test_volume_handles_of_any_shape_are_hashed_into_one_component(lay: RootLayout) -> None:
    for handle in ("../../etc", "/abs/olute", "a/b/c", ".", "x" * 2000):
        path = lay.csi_staging_path("drv", handle)
        assert path.parent.parent == lay.plugin_dir("kubernetes.io/csi") / "drv"
        assert len(path.parent.name) == 64


@pytest.mark.parametrize("spec", ["staging", "publish"])
def test_block_spec_names_that_collide_with_kubelet_dirs_are_refused(
    lay: RootLayout, spec: str
) -> None:
    with pytest.raises(UnsafePathError, match="collides"):
        lay.csi_block_global_map_path(spec)
    with pytest.raises(UnsafePathError, match="collides"):
        lay.csi_block_staging_path(spec)


def test_csi_driver_named_like_the_block_dir_is_refused(lay: RootLayout) -> None:
    with pytest.raises(UnsafePathError, match="volumeDevices"):
        lay.csi_staging_path("volumeDevices", "h")


def test_empty_volume_handle_is_refused(lay: RootLayout) -> None:
    with pytest.raises(UnsafePathError, match="CSI volume handle"):
        lay.csi_staging_path("drv", "")

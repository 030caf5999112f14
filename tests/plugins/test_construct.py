"""Reconstruction hooks: each plugin reads back what it wrote, and nothing else does.

CSI's hooks read the `vol_data.json` files the CSI plugin writes (no driver
needed); emptyDir's read the medium from the mount at its path. The catalog
always hands out CSI's hooks, with or without a registered driver.
"""

from __future__ import annotations

from pathlib import Path

from events.types import DesiredVolume, VolumeSource
from volfsm.desired.resolve import csi_volume_id, empty_dir_volume_id, inline_csi_volume_id
from volfsm.node.layout import RootLayout
from volfsm.node.mounts import MountInfo
from volfsm.plugins.base import ConstructedSpec, GlobalDir, PodVolumeDir
from volfsm.plugins.catalog import PluginCatalog
from volfsm.plugins.csi import files
from volfsm.plugins.csi.construct import CsiVolumes
from volfsm.plugins.emptydir import EmptyDirPlugin

CSI = "kubernetes.io~csi"
DRIVER = "csi.example.com"


class Node:
    """A NodeView with the mounts a test says are there."""

    def __init__(self, mounts: dict[str, MountInfo] | None = None) -> None:
        self.mounts = mounts or {}
        self.global_dirs: list[GlobalDir] = []

    def mount_at(self, path: Path | str) -> MountInfo | None:
        return self.mounts.get(str(path))


def tmpfs_at(path: Path) -> MountInfo:
    return MountInfo(1, 0, 0, 42, "/", str(path), ("rw",), (), "tmpfs", "tmpfs", ())


def pod_dir(layout: RootLayout, escaped: str, name: str, *, block: bool = False) -> PodVolumeDir:
    sub = "volumeDevices" if block else "volumes"
    path = layout.pod_dir("u1") / sub / escaped / name
    path.mkdir(parents=True)
    return PodVolumeDir("u1", sub, escaped, name, path, is_dir=True)


def test_csi_pod_volume_comes_back_from_its_vol_data(layout: RootLayout) -> None:
    # Arrange: a PV volume's and an inline volume's publish dirs, as the CSI plugin writes them
    pv = pod_dir(layout, CSI, "pv-a")
    files.write_json(
        layout,
        pv.path / "vol_data.json",
        {"specVolID": "pv-a", "driverName": DRIVER, "volumeHandle": "h1"},
    )
    inline = pod_dir(layout, CSI, "scratch")
    files.write_json(
        layout,
        inline.path / "vol_data.json",
        {"driverName": DRIVER, "volumeHandle": "h2", "volumeLifecycleMode": "Ephemeral"},
    )

    # Act
    got_pv = CsiVolumes().construct_volume_spec(layout, pv, Node())
    got_inline = CsiVolumes().construct_volume_spec(layout, inline, Node())

    # Assert
    source = VolumeSource(plugin="kubernetes.io/csi", driver=DRIVER, volume_handle="h1")
    assert got_pv == ConstructedSpec(
        DesiredVolume(
            name="pv-a", volume_id=csi_volume_id(DRIVER, "h1"), source=source, pv_name="pv-a"
        ),
        layout.csi_staging_path(DRIVER, "h1"),
    )
    assert isinstance(got_inline, ConstructedSpec) and got_inline.device_path is None
    assert got_inline.spec.volume_id == inline_csi_volume_id(DRIVER, "u1", "scratch")


def test_csi_pod_volume_without_usable_vol_data_says_why(layout: RootLayout) -> None:
    missing = pod_dir(layout, CSI, "pv-a")
    renamed = pod_dir(layout, CSI, "pv-b")
    data = {"specVolID": "pv-x", "driverName": DRIVER, "volumeHandle": "h1"}
    files.write_json(layout, renamed.path / "vol_data.json", data)

    assert CsiVolumes().construct_volume_spec(layout, missing, Node()) == (
        f"{missing.path / 'vol_data.json'} is missing"
    )
    assert CsiVolumes().construct_volume_spec(layout, renamed, Node()) == (
        f"{renamed.path / 'vol_data.json'} names volume 'pv-x', but its directory is 'pv-b'"
    )


def test_csi_staging_dir_comes_back_from_its_vol_data_and_must_match_it(
    layout: RootLayout,
) -> None:
    # Arrange: a staging dir as NodeStage's caller writes it, and one whose json lies
    good = layout.csi_staging_path(DRIVER, "h1")
    bad = layout.csi_staging_path(DRIVER, "other")
    for staging in (good, bad):
        staging.mkdir(parents=True)
        data = {"driverName": DRIVER, "volumeHandle": "h1"}
        files.write_json(layout, staging.parent / "vol_data.json", data)

    # Act
    scan = CsiVolumes().scan_global_dirs(layout)
    built = {d.path: CsiVolumes().construct_device_spec(layout, d) for d in scan.dirs}

    # Assert
    assert scan.junk == [] and set(built) == {good.parent, bad.parent}
    ok = built[good.parent]
    assert isinstance(ok, ConstructedSpec) and ok.device_path == good
    assert ok.spec.volume_id == csi_volume_id(DRIVER, "h1")
    why = (
        f"{bad.parent / 'vol_data.json'} does not match its directory (driver {DRIVER}, handle h1)"
    )
    assert built[bad.parent] == why


def test_csi_spec_from_volume_id_alone() -> None:
    csi = CsiVolumes()
    pv = csi.spec_from_volume_id(csi_volume_id(DRIVER, "h1"), "u1", "pv-a")
    assert pv is not None and (pv.source.volume_handle, pv.pv_name) == ("h1", "pv-a")
    assert csi.spec_from_volume_id(empty_dir_volume_id("u1", "a"), "u1", "a") is None


def test_emptydir_medium_comes_from_the_mount_at_its_path(layout: RootLayout) -> None:
    plugin = EmptyDirPlugin(layout)
    disk = pod_dir(layout, "kubernetes.io~empty-dir", "disk")
    mem = pod_dir(layout, "kubernetes.io~empty-dir", "mem")
    node = Node({str(mem.path): tmpfs_at(mem.path)})

    got_disk = plugin.construct_volume_spec(layout, disk, node)
    got_mem = plugin.construct_volume_spec(layout, mem, node)

    assert isinstance(got_disk, ConstructedSpec) and got_disk.spec.source.medium == ""
    assert isinstance(got_mem, ConstructedSpec) and got_mem.spec.source.medium == "Memory"
    assert got_mem.spec.volume_id == empty_dir_volume_id("u1", "mem")
    assert plugin.expected_pod_mount(got_mem.spec) == "emptyDir tmpfs"
    assert plugin.expected_pod_mount(got_disk.spec) == ""


def test_catalog_hands_out_csi_hooks_before_any_driver_registers(layout: RootLayout) -> None:
    catalog = PluginCatalog()
    catalog.register(EmptyDirPlugin(layout))

    names = [(c.name, c.pod_dir_name()) for c in catalog.spec_constructors()]

    assert names == [
        ("kubernetes.io/csi", CSI),
        ("kubernetes.io/empty-dir", "kubernetes.io~empty-dir"),
    ]

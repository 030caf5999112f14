"""CSI volumes read back from the node: the kubelet's ConstructVolumeSpec for CSI.

`CsiVolumes` holds the CSI plugin's reconstruction hooks. They need no
driver: everything comes from the directories and the `vol_data.json` files
the plugin wrote (`volfsm.plugins.csi.files`), so the catalog keeps one
`CsiVolumes` whether or not a driver is registered yet, and every
`CsiPlugin` has the same hooks.

* A pod's filesystem volume ``pods/<uid>/volumes/kubernetes.io~csi/<spec>``
  is rebuilt from its own ``vol_data.json`` (driver, handle, spec name,
  lifecycle). When that is unusable but a mount is published there, the
  staging dir whose globalmount is the same mount (same device and root)
  names driver and handle by its own ``vol_data.json`` (`_from_staging`), so
  the driver still unpublishes it.
* A pod's block volume ``pods/<uid>/volumeDevices/kubernetes.io~csi/<spec>``
  from ``plugins/kubernetes.io/csi/volumeDevices/<spec>/data/vol_data.json``.
* Global dirs: each staging dir ``plugins/kubernetes.io/csi/<driver>/<sha256
  (handle)>`` and block volume dir ``.../volumeDevices/<spec>``, from their
  ``vol_data.json``.
* From a volume id alone (nothing left on the node): driver and handle are
  in the id (`volfsm.desired.resolve`).
"""

from __future__ import annotations

from pathlib import Path

from loguru import logger

from events.types import DesiredVolume, VolumeSource
from volfsm.desired.resolve import csi_volume_id, ephemeral_volume_handle, inline_csi_volume_id
from volfsm.node.layout import (
    BLOCK_DATA,
    BLOCK_GLOBAL_MAP,
    BLOCK_PUBLISH,
    BLOCK_STAGING,
    CSI_PLUGIN,
    CSI_PUBLISH_MOUNT,
    GLOBAL_MOUNT,
    VOL_DATA,
    VOLUME_DEVICES,
    RootLayout,
    UnsafePathError,
    volume_handle_dir_name,
)
from volfsm.plugins.base import (
    BLOCK,
    FILESYSTEM,
    ConstructedSpec,
    GlobalDir,
    GlobalScan,
    NodeView,
    PodVolumeDir,
    SpecConstructor,
    list_dir,
)
from volfsm.plugins.csi.files import read_json
from volfsm.plugins.csi.paths import LIFECYCLE_EPHEMERAL, valid_driver_name

VolData = tuple[dict[str, str], str, str]
"""A vol_data.json's content, driver name and volume handle."""


def read_vol_data(layout: RootLayout, path: Path) -> VolData | str:
    """A CSI vol_data.json with its (data, driver, handle), or why it names no CSI volume."""
    data = read_json(layout, path)
    if isinstance(data, str):
        return data
    driver = data.get("driverName", "")
    handle = data.get("volumeHandle", "")
    if not valid_driver_name(driver):
        return f"{path}: driverName {driver!r} is not a CSI driver name"
    if not handle:
        return f"{path}: volumeHandle is missing"
    return data, driver, handle


def _pv_spec(name: str, driver: str, handle: str, *, block: bool = False) -> DesiredVolume:
    """A CSI PV volume's spec named `name` (the PV name stands in for the spec name too)."""
    return DesiredVolume(
        name=name,
        volume_id=csi_volume_id(driver, handle),
        source=VolumeSource(plugin=CSI_PLUGIN, driver=driver, volume_handle=handle),
        volume_mode=BLOCK if block else FILESYSTEM,
        pv_name=name,
    )


def _id_parts(volume_id: str) -> tuple[str, str] | None:
    """(driver, handle) of a CSI volume id ``kubernetes.io/csi/<driver>^<handle>``, or None."""
    prefix = f"{CSI_PLUGIN}/"
    if not volume_id.startswith(prefix):
        return None
    driver, sep, handle = volume_id[len(prefix) :].partition("^")
    if not sep or not handle or not valid_driver_name(driver):
        return None
    return driver, handle


class CsiVolumes(SpecConstructor):
    """The CSI plugin's reconstruction hooks (see the module doc); no driver needed."""

    name = CSI_PLUGIN

    def is_device_mountable(self, source: VolumeSource) -> bool:
        """Always: a CSI PV volume has a staging dir, whatever its driver can do."""
        return True

    def volume_dir_name(self, spec: DesiredVolume) -> str:
        """The spec name: the PV name, or the pod's volume name for an inline volume."""
        return spec.pv_name or spec.name

    # ---------------------------------------------------------- pod dirs

    def construct_volume_spec(
        self, layout: RootLayout, entry: PodVolumeDir, node: NodeView
    ) -> ConstructedSpec | str:
        """From ``<entry>/vol_data.json``, else from the staging dir its mount comes from."""
        if not entry.is_dir:
            return "a CSI entry under volumes/ that is not a directory"
        found = read_vol_data(layout, entry.path / VOL_DATA)
        if isinstance(found, str):
            return self._from_staging(layout, entry, node) or found
        return self._pod_spec(layout, entry, entry.path / VOL_DATA, found)

    def construct_block_volume_spec(
        self, layout: RootLayout, entry: PodVolumeDir, node: NodeView
    ) -> ConstructedSpec | str:
        """From ``volumeDevices/<spec>/data/vol_data.json``."""
        try:
            data_path = layout.csi_block_vol_data_path(entry.name)
        except UnsafePathError as exc:
            return str(exc)
        found = read_vol_data(layout, data_path)
        if isinstance(found, str):
            return found
        return self._pod_spec(layout, entry, data_path, found)

    def _pod_spec(
        self, layout: RootLayout, entry: PodVolumeDir, data_path: Path, found: VolData
    ) -> ConstructedSpec | str:
        data, driver, handle = found
        spec_name = data.get("specVolID") or entry.name
        if spec_name != entry.name:
            return f"{data_path} names volume {spec_name!r}, but its directory is {entry.name!r}"
        if data.get("volumeLifecycleMode") == LIFECYCLE_EPHEMERAL:
            source = VolumeSource(plugin=CSI_PLUGIN, driver=driver, volume_handle=handle)
            vid = inline_csi_volume_id(driver, entry.pod_uid, entry.name)
            return ConstructedSpec(DesiredVolume(name=entry.name, volume_id=vid, source=source))
        try:
            device = (
                layout.csi_block_global_map_path(spec_name)
                if entry.block
                else layout.csi_staging_path(driver, handle)
            )
        except UnsafePathError as exc:
            return str(exc)
        return ConstructedSpec(_pv_spec(spec_name, driver, handle, block=entry.block), device)

    def _from_staging(
        self, layout: RootLayout, entry: PodVolumeDir, node: NodeView
    ) -> ConstructedSpec | None:
        """A PV volume whose pod vol_data.json is unusable, from the staging dir it is
        published from: the one whose globalmount is the same mount as the entry's publish
        mount (same device and root), by that dir's own vol_data.json. None unless exactly
        one.

        So a mounted CSI volume that lost its pod json is still unpublished by its driver
        (NodeUnpublishVolume), not just unmounted.
        """
        publish = node.mount_at(entry.path / CSI_PUBLISH_MOUNT)
        if publish is None:
            return None
        same = (publish.major, publish.minor, publish.root)
        matches: dict[tuple[str, str], Path] = {}
        for staging in node.global_dirs:
            if staging.plugin != CSI_PLUGIN or staging.block:
                continue
            staged = node.mount_at(staging.device_path)
            if staged is None or (staged.major, staged.minor, staged.root) != same:
                continue
            rec = self.construct_device_spec(layout, staging)
            if isinstance(rec, ConstructedSpec):
                matches[(rec.spec.source.driver, rec.spec.source.volume_handle)] = staging.path
        if len(matches) != 1:
            return None
        [((driver, handle), where)] = matches.items()
        note = f"driver and handle from {where / VOL_DATA}: its mount is the one published here"
        return ConstructedSpec(_pv_spec(entry.name, driver, handle), where / GLOBAL_MOUNT, note)

    # -------------------------------------------------------- global dirs

    def scan_global_dirs(self, layout: RootLayout) -> GlobalScan:
        """Staging dirs ``<driver>/<sha256>`` and block volume dirs ``volumeDevices/<spec>``."""
        scan = GlobalScan()
        root = layout.plugin_dir(CSI_PLUGIN)
        try:
            drivers = list_dir(layout, root) or []
        except (UnsafePathError, OSError) as exc:
            logger.error("cannot read {}: {}", root, exc)
            return scan
        for driver, is_dir in drivers:
            where = root / driver
            if not is_dir:
                scan.junk.append((where, "a file or link where a CSI driver directory belongs"))
                continue
            try:
                names = list_dir(layout, where) or []
            except (UnsafePathError, OSError) as exc:
                scan.junk.append((where, f"cannot be read: {exc}"))
                continue
            for name, entry_is_dir in names:
                _add_global(scan, where / name, entry_is_dir, block=driver == VOLUME_DEVICES)
        return scan

    def construct_device_spec(self, layout: RootLayout, entry: GlobalDir) -> ConstructedSpec | str:
        """The device spec of a staging or block volume dir, from its vol_data.json."""
        data_path = entry.path / BLOCK_DATA / VOL_DATA if entry.block else entry.path / VOL_DATA
        found = read_vol_data(layout, data_path)
        if isinstance(found, str):
            return found
        data, driver, handle = found
        if not entry.block:
            if driver != entry.path.parent.name or volume_handle_dir_name(handle) != entry.name:
                return (
                    f"{data_path} does not match its directory (driver {driver}, handle {handle})"
                )
            # The staging json holds no PV name; the dir name stands in (it only has to be
            # non-empty: a filesystem unstage needs the driver, handle and staging path).
            return ConstructedSpec(_pv_spec(entry.name, driver, handle), entry.device_path)
        spec_name = data.get("specVolID") or entry.name
        if spec_name != entry.name:
            return f"{data_path} names volume {spec_name!r}, but its directory is {entry.name!r}"
        return ConstructedSpec(_pv_spec(entry.name, driver, handle, block=True), entry.device_path)

    # ------------------------------------------------------- from the id

    def spec_from_volume_id(self, volume_id: str, pod_uid: str, name: str) -> DesiredVolume | None:
        """Driver and handle from the id: an inline volume when the id is the pod-scoped
        one, else a PV volume whose spec name is the entry's name."""
        parts = _id_parts(volume_id)
        if parts is None:
            return None
        driver, handle = parts
        if volume_id == inline_csi_volume_id(driver, pod_uid, name):
            handle = ephemeral_volume_handle(pod_uid, name)
            source = VolumeSource(plugin=CSI_PLUGIN, driver=driver, volume_handle=handle)
            return DesiredVolume(name=name, volume_id=volume_id, source=source)
        source = VolumeSource(plugin=CSI_PLUGIN, driver=driver, volume_handle=handle)
        return DesiredVolume(name=name, volume_id=volume_id, source=source, pv_name=name)

    def device_spec_from_volume_id(
        self, layout: RootLayout, volume_id: str, device_mount_path: str
    ) -> DesiredVolume | None:
        """A PV volume's device spec from its id and recorded mount path (block when the
        path is a block volume dir, named by it)."""
        parts = _id_parts(volume_id)
        if parts is None:
            return None
        driver, handle = parts
        source = VolumeSource(plugin=CSI_PLUGIN, driver=driver, volume_handle=handle)
        try:
            rel = layout.relative_parts(device_mount_path) if device_mount_path else ()
        except UnsafePathError:
            rel = ()
        block_root = layout.relative_parts(layout.csi_block_root())
        if rel[: len(block_root)] == block_root and len(rel) > len(block_root):
            spec_name = rel[len(block_root)]
            return DesiredVolume(
                name=spec_name, volume_id=volume_id, source=source, volume_mode=BLOCK,
                pv_name=spec_name,
            )  # fmt: skip
        placeholder = volume_handle_dir_name(handle)  # non-empty: a PV volume (staged)
        return DesiredVolume(
            name=placeholder, volume_id=volume_id, source=source, pv_name=placeholder
        )

    # ------------------------------------------------------- node checks

    def block_publish_path(self, layout: RootLayout, global_map: Path, pod_uid: str) -> Path | None:
        """``volumeDevices/publish/<spec>/<pod>``, where NodePublish put the device."""
        spec_name = global_map.parent.name
        try:
            if layout.csi_block_global_map_path(spec_name) != global_map:
                return None  # not the kubelet's CSI block layout: no publish path to check
            return layout.csi_block_publish_path(spec_name, pod_uid)
        except UnsafePathError:
            return None


def _add_global(scan: GlobalScan, path: Path, is_dir: bool, *, block: bool) -> None:
    """One entry under a driver dir (staging) or volumeDevices/ (block volume dir)."""
    if block:
        if path.name in (BLOCK_STAGING, BLOCK_PUBLISH):
            return  # the driver's staging/publish areas: named by the volume dirs
        if is_dir:
            scan.dirs.append(
                GlobalDir(CSI_PLUGIN, path, path.name, path / BLOCK_GLOBAL_MAP, block=True)
            )
        else:
            scan.junk.append((path, "a file or link where a block volume dir belongs"))
    elif is_dir:
        scan.dirs.append(GlobalDir(CSI_PLUGIN, path, path.name, path / GLOBAL_MOUNT))
    else:
        scan.junk.append((path, "a file or link where a CSI staging dir belongs"))

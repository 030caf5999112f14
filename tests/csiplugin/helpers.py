"""Requests, volumes and "what is left" checks for the CSI plugin tests."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from events.types import VolumeSource
from tests.helpers.csidriver import DriverProcess, create_volume
from volfsm.desired.kinds import CSIDriver, CSIDriverSpec
from volfsm.desired.meta import ObjectMeta
from volfsm.node.layout import CSI_PLUGIN, RootLayout
from volfsm.plugins.base import BLOCK, FILESYSTEM, VolumeRequest
from volfsm.plugins.csi.plugin import CsiPlugin

MIB = 1 << 20


def new_volume(drv: DriverProcess, name: str, size: int = 32 * MIB, *, block: bool = False) -> str:
    """CreateVolume on the driver; the volume handle."""
    clients = drv.clients()
    return str(create_volume(clients, name, size, block=block).volume_id)


def source(handle: str, driver: str = "csi.volfsm.dev", **fields: Any) -> VolumeSource:
    """A CSI VolumeSource as the desired state resolves it from a PV."""
    fields.setdefault("access_modes", ("ReadWriteOnce",))
    fields.setdefault("fs_type", "ext4")
    return VolumeSource(plugin=CSI_PLUGIN, driver=driver, volume_handle=handle, **fields)


def csi_driver_object(plugin: CsiPlugin, **spec: Any) -> None:
    """Give the plugin a CSIDriver object for its driver with `spec` (as `volfsm apply` would)."""
    found = CSIDriver(metadata=ObjectMeta(name=plugin.driver), spec=CSIDriverSpec(**spec))
    plugin.objects.lookup = lambda name: found if name == plugin.driver else None


def request(
    plugin: CsiPlugin,
    handle: str,
    *,
    pod_uid: str = "",
    spec_name: str = "",
    volume_name: str = "data",
    mode: str = FILESYSTEM,
    src: VolumeSource | None = None,
    **fields: Any,
) -> VolumeRequest:
    """A VolumeRequest whose paths come from the plugin, as the engine builds it.

    Device-level requests (no pod) carry no volume name, as the engine's.
    """
    spec = spec_name or f"pv-{handle}"
    req = VolumeRequest(
        volume_id=f"{CSI_PLUGIN}/{plugin.driver}^{handle}",
        source=src if src is not None else source(handle, plugin.driver),
        volume_mode=mode,
        pod_uid=pod_uid,
        volume_name=volume_name if pod_uid else "",
        spec_name=spec,
        **fields,
    )
    root = plugin.layout.root
    return replace(
        req,
        device_mount_path=plugin.device_mount_path(root, req),
        mount_path=plugin.pod_mount_path(root, req) if pod_uid else None,
    )


def block_request(plugin: CsiPlugin, handle: str, **kw: Any) -> VolumeRequest:
    """A block VolumeRequest."""
    return request(plugin, handle, mode=BLOCK, **kw)


def sha(handle: str) -> str:
    """sha256 hex of a volume handle."""
    return hashlib.sha256(handle.encode()).hexdigest()


def read_json(path: Path) -> dict[str, str]:
    """A vol_data.json file."""
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


SHARED_DIRS = (
    "plugins",
    "plugins/kubernetes.io",
    "plugins/kubernetes.io/csi",
    "plugins/kubernetes.io/csi/*",
    "plugins/kubernetes.io/csi/volumeDevices/staging",
    "plugins/kubernetes.io/csi/volumeDevices/publish",
    "pods",
    "pods/*",
    "pods/*/volumes",
    "pods/*/volumes/kubernetes.io~csi",
    "pods/*/volumeDevices",
    "pods/*/volumeDevices/kubernetes.io~csi",
)
"""Directories shared by many volumes: the plugin leaves them (kubelet does too)."""


def leftovers(layout: RootLayout) -> list[str]:
    """Entries under the root other than empty shared directories (files, links, volume dirs)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(layout.root):
        rel_dir = Path(dirpath).relative_to(layout.root)
        for name in filenames:
            found.append(str(rel_dir / name))
        for name in dirnames:
            rel = rel_dir / name
            if os.path.islink(Path(dirpath) / name):
                found.append(str(rel))
            elif not any(
                rel.match(pattern) and len(rel.parts) == pattern.count("/") + 1
                for pattern in SHARED_DIRS
            ):
                found.append(f"{rel}/")
    return sorted(found)


def statvfs_bytes(path: Path) -> int:
    """Size of the filesystem at path."""
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize

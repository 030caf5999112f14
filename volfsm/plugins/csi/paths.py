"""Where the kubelet keeps a CSI volume's directories and `vol_data.json` files.

Filesystem volumes (reference csi-node-service.md §4.2-§4.3)::

    plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount     staging_target_path
    plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/vol_data.json
    pods/<uid>/volumes/kubernetes.io~csi/<specName>/mount                target_path
    pods/<uid>/volumes/kubernetes.io~csi/<specName>/vol_data.json

Block volumes (§4.4)::

    plugins/kubernetes.io/csi/volumeDevices/staging/<specName>           staging_target_path
    plugins/kubernetes.io/csi/volumeDevices/publish/<specName>/<podUID>  target_path (a file)
    plugins/kubernetes.io/csi/volumeDevices/<specName>/dev               global map dir
    plugins/kubernetes.io/csi/volumeDevices/<specName>/data/vol_data.json
    pods/<uid>/volumeDevices/kubernetes.io~csi/<specName>                the pod's device link

`specName` is the PV name, or the pod's volume name for an inline volume
(kubelet's ``spec.Name()``); the pod's publish directory is named by it too.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from volfsm.node.layout import BLOCK_DATA, VOL_DATA, RootLayout
from volfsm.plugins.base import ErrorClass, PluginError, VolumeRequest

LIFECYCLE_PERSISTENT = "Persistent"
LIFECYCLE_EPHEMERAL = "Ephemeral"

_DRIVER_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,61}[A-Za-z0-9])?")


def valid_driver_name(name: str) -> bool:
    """Whether `name` is a CSI driver name: DNS-like, 1-63 chars, alphanumeric at both ends."""
    return _DRIVER_NAME.fullmatch(name) is not None


def attachment_id(volume_handle: str, driver: str, node_name: str) -> str:
    """Kubelet's VolumeAttachment name: ``csi-<sha256(handle + driver + node)>``."""
    digest = hashlib.sha256(f"{volume_handle}{driver}{node_name}".encode()).hexdigest()
    return f"csi-{digest}"


def spec_name(req: VolumeRequest, *, required: bool) -> str:
    """The volume's spec name: `spec_name`, else (pod-level calls) the pod's volume name.

    With `required` the explicit `spec_name` must be set: block paths are
    shared by device-level calls, which carry no pod volume name, so a
    fallback there would name different directories at stage and unstage.
    """
    if req.spec_name:
        return req.spec_name
    if not required and req.volume_name:
        return req.volume_name
    raise PluginError(
        "MissingSpecName",
        f"volume {req.volume_id}: the request has no spec_name (the PV name, or the pod's"
        " volume name for an inline volume); CSI block paths are named by it",
        ErrorClass.TRANSIENT,
    )


@dataclass(frozen=True)
class BlockPaths:
    """The kubelet's per-volume paths of a CSI block volume."""

    staging: Path
    """volumeDevices/staging/<spec>: NodeStage's staging_target_path (kubelet creates it)."""
    publish_dir: Path
    """volumeDevices/publish/<spec>: kubelet creates it; the driver creates one file per pod."""
    volume_dir: Path
    """volumeDevices/<spec>: holds data/vol_data.json and the global map dir dev/."""
    global_map: Path
    """volumeDevices/<spec>/dev: one file per pod with the device bound on it (the engine's)."""
    data_file: Path
    """volumeDevices/<spec>/data/vol_data.json"""

    def publish_path(self, layout: RootLayout, pod_uid: str) -> Path:
        """volumeDevices/publish/<spec>/<podUID>: NodePublish's target_path."""
        return layout.csi_block_publish_path(self.publish_dir.name, pod_uid)


def block_paths(layout: RootLayout, name: str) -> BlockPaths:
    """The block paths of the volume with spec name `name` (checked as a path component)."""
    volume_dir = layout.csi_block_dir(name)
    return BlockPaths(
        staging=layout.csi_block_staging_path(name),
        publish_dir=layout.csi_block_publish_dir(name),
        volume_dir=volume_dir,
        global_map=layout.csi_block_global_map_path(name),
        data_file=volume_dir / BLOCK_DATA / VOL_DATA,
    )


def staging_data_file(staging: Path) -> Path:
    """vol_data.json next to a filesystem volume's globalmount."""
    return staging.parent / VOL_DATA


def publish_data_file(target: Path) -> Path:
    """vol_data.json next to a pod's `mount` directory."""
    return target.parent / VOL_DATA

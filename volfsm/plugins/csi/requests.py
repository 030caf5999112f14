"""Building CSI Node requests as the kubelet does (reference csi-node-service.md §4.5)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from volfsm.csi.v1 import csi_pb2
from volfsm.plugins.base import BLOCK, VolumeRequest
from volfsm.plugins.csi.client import NodeCapabilities

_MODE = csi_pb2.VolumeCapability.AccessMode.Mode

#: Kubernetes access mode -> CSI mode, without / with SINGLE_NODE_MULTI_WRITER (kubelet).
_ACCESS_MODES = {
    "ReadWriteOnce": (_MODE.SINGLE_NODE_WRITER, _MODE.SINGLE_NODE_MULTI_WRITER),
    "ReadOnlyMany": (_MODE.MULTI_NODE_READER_ONLY, _MODE.MULTI_NODE_READER_ONLY),
    "ReadWriteMany": (_MODE.MULTI_NODE_MULTI_WRITER, _MODE.MULTI_NODE_MULTI_WRITER),
    "ReadWriteOncePod": (_MODE.SINGLE_NODE_WRITER, _MODE.SINGLE_NODE_SINGLE_WRITER),
}


def access_mode(access_modes: tuple[str, ...], multi_writer_capable: bool) -> Any:
    """The CSI access mode for a volume's Kubernetes access modes.

    The first known mode decides (kubelet uses the PV's first access mode);
    none known counts as ReadWriteOnce, kubelet's default.
    """
    for mode in access_modes:
        pair = _ACCESS_MODES.get(mode)
        if pair is not None:
            return pair[1] if multi_writer_capable else pair[0]
    pair = _ACCESS_MODES["ReadWriteOnce"]
    return pair[1] if multi_writer_capable else pair[0]


def mount_group(req: VolumeRequest, caps: NodeCapabilities) -> str:
    """volume_mount_group: the fsGroup as a decimal string when the driver takes it, else ""."""
    if caps.volume_mount_group and req.fs_group is not None and req.volume_mode != BLOCK:
        return str(req.fs_group)
    return ""


def volume_capability(req: VolumeRequest, caps: NodeCapabilities) -> Any:
    """Block, or Mount with fs_type, the PV's mount options and (if offered) the mount group."""
    mode = csi_pb2.VolumeCapability.AccessMode(
        mode=access_mode(req.source.access_modes, caps.single_node_multi_writer)
    )
    if req.volume_mode == BLOCK:
        return csi_pb2.VolumeCapability(
            block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=mode
        )
    mount = csi_pb2.VolumeCapability.MountVolume(
        fs_type=req.source.fs_type,
        mount_flags=list(req.source.mount_options),
        volume_mount_group=mount_group(req, caps),
    )
    return csi_pb2.VolumeCapability(mount=mount, access_mode=mode)


def stage_request(
    req: VolumeRequest, caps: NodeCapabilities, staging: str, secrets: Mapping[str, str]
) -> Any:
    """NodeStageVolumeRequest."""
    return csi_pb2.NodeStageVolumeRequest(
        volume_id=req.source.volume_handle,
        staging_target_path=staging,
        volume_capability=volume_capability(req, caps),
        secrets=dict(secrets),
        volume_context=dict(req.source.attributes),
    )


def publish_request(
    req: VolumeRequest,
    caps: NodeCapabilities,
    staging: str,
    target: str,
    secrets: Mapping[str, str],
    context: Mapping[str, str] | None = None,
) -> Any:
    """NodePublishVolumeRequest (staging_target_path only when the volume was staged);
    `context` replaces the source's attributes as volume_context (podInfoOnMount, tokens)."""
    return csi_pb2.NodePublishVolumeRequest(
        volume_id=req.source.volume_handle,
        staging_target_path=staging,
        target_path=target,
        volume_capability=volume_capability(req, caps),
        readonly=req.read_only,
        secrets=dict(secrets),
        volume_context=dict(req.source.attributes if context is None else context),
    )


def expand_request(
    req: VolumeRequest, caps: NodeCapabilities, volume_path: str, staging: str, new_size: int
) -> Any:
    """NodeExpandVolumeRequest; capacity_range.required_bytes is always sent (as kubelet)."""
    return csi_pb2.NodeExpandVolumeRequest(
        volume_id=req.source.volume_handle,
        volume_path=volume_path,
        staging_target_path=staging,
        capacity_range=csi_pb2.CapacityRange(required_bytes=new_size),
        volume_capability=volume_capability(req, caps),
    )

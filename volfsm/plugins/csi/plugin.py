"""The CSI volume plugin: one instance per registered driver (name + unix socket).

It does what the kubelet's `pkg/volume/csi` does around the RPCs (reference
csi-node-service.md §4): discovers capabilities and follows them, creates
the directories and `vol_data.json` files the caller must create, removes
them after success (and after final errors only: after a timeout the driver
may still be using them), builds requests with the kubelet's access-mode
mapping, and checks /proc/self/mountinfo after a stage or publish reports
success, recording what it found instead of trusting the driver.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from loguru import logger

from events.types import VolumeSource
from volfsm.csi.v1 import csi_pb2
from volfsm.layout import CSI_PLUGIN, PathInUseError, RootLayout
from volfsm.mounts import find_mount
from volfsm.plugins.base import (
    BLOCK,
    ErrorClass,
    MountResult,
    PluginError,
    VolumePlugin,
    VolumeRequest,
)
from volfsm.plugins.csi.client import (
    DEFAULT_TIMEOUT_S,
    CsiClient,
    DriverInfo,
    NodeCapabilities,
    wait_for_socket,
)

_MODE = csi_pb2.VolumeCapability.AccessMode.Mode

#: Kubernetes access mode -> CSI mode, without / with SINGLE_NODE_MULTI_WRITER (kubelet).
_ACCESS_MODES = {
    "ReadWriteOnce": (_MODE.SINGLE_NODE_WRITER, _MODE.SINGLE_NODE_MULTI_WRITER),
    "ReadOnlyMany": (_MODE.MULTI_NODE_READER_ONLY, _MODE.MULTI_NODE_READER_ONLY),
    "ReadWriteMany": (_MODE.MULTI_NODE_MULTI_WRITER, _MODE.MULTI_NODE_MULTI_WRITER),
    "ReadWriteOncePod": (_MODE.SINGLE_NODE_WRITER, _MODE.SINGLE_NODE_SINGLE_WRITER),
}


def access_mode(access_modes: tuple[str, ...], multi_writer_capable: bool) -> Any:
    """The CSI access mode for a volume's Kubernetes access modes (first known one wins)."""
    for mode in access_modes:
        pair = _ACCESS_MODES.get(mode)
        if pair is not None:
            return pair[1] if multi_writer_capable else pair[0]
    return _MODE.SINGLE_NODE_MULTI_WRITER if multi_writer_capable else _MODE.SINGLE_NODE_WRITER


class CsiPlugin(VolumePlugin):
    """Drives one CSI driver. Call `start()` before use: it waits for the socket and probes."""

    name = CSI_PLUGIN

    def __init__(
        self,
        driver: str,
        endpoint: str,
        layout: RootLayout,
        *,
        node_name: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        socket_wait_s: float = 30.0,
    ) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.layout = layout
        self.node_name = node_name
        self.client = CsiClient(endpoint, timeout_s=timeout_s)
        self.socket_wait_s = socket_wait_s
        self.caps = NodeCapabilities()
        self.info: DriverInfo | None = None

    async def start(self) -> DriverInfo:
        """Wait for the socket, then GetPluginInfo/Probe/NodeGetInfo and NodeGetCapabilities."""
        await wait_for_socket(self.endpoint, self.socket_wait_s)
        self.info = await self.client.driver_info()
        if self.info.name != self.driver:
            logger.warning(
                "CSI driver at {} calls itself {!r}, registered as {!r}",
                self.endpoint,
                self.info.name,
                self.driver,
            )
        self.caps = await self.client.node_capabilities()
        logger.info("CSI driver {} ready: {}", self.driver, self.caps)
        return self.info

    async def stop(self) -> None:
        """Close the gRPC channel."""
        await self.client.close()

    # -------------------------------------------------------- capabilities

    def supports(self, source: VolumeSource) -> bool:
        return source.plugin == CSI_PLUGIN and source.driver == self.driver

    def is_device_mountable(self, source: VolumeSource) -> bool:
        return self.caps.stage_unstage

    def supports_block(self, source: VolumeSource) -> bool:
        return True

    def supports_expansion(self, source: VolumeSource) -> bool:
        return self.caps.expand

    def _stages(self, req: VolumeRequest) -> bool:
        return self.caps.stage_unstage and not req.ephemeral

    def _spec_name(self, req: VolumeRequest) -> str:
        return req.spec_name or req.volume_name or req.source.volume_handle

    # --------------------------------------------------------------- paths

    def device_mount_path(self, root: Path, req: VolumeRequest) -> Path | None:
        if req.ephemeral:
            return None
        if req.volume_mode == BLOCK:
            return self.layout.csi_block_staging_path(self._spec_name(req))
        return self.layout.csi_staging_path(self.driver, req.source.volume_handle)

    def pod_mount_path(self, root: Path, req: VolumeRequest) -> Path:
        if req.volume_mode == BLOCK:
            return self.layout.csi_block_publish_path(self._spec_name(req), req.pod_uid)
        return self.layout.csi_publish_path(req.pod_uid, req.volume_name)

    # ------------------------------------------------------------ requests

    def _capability(self, req: VolumeRequest) -> Any:
        mode = csi_pb2.VolumeCapability.AccessMode(
            mode=access_mode(req.source.access_modes, self.caps.single_node_multi_writer)
        )
        if req.volume_mode == BLOCK:
            return csi_pb2.VolumeCapability(
                block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=mode
            )
        mount = csi_pb2.VolumeCapability.MountVolume(
            fs_type=req.source.fs_type, mount_flags=list(req.source.mount_options)
        )
        return csi_pb2.VolumeCapability(mount=mount, access_mode=mode)

    def _staging_arg(self, req: VolumeRequest) -> str:
        if not self._stages(req) or req.device_mount_path is None:
            return ""
        return str(req.device_mount_path)

    # ---------------------------------------------------------- vol_data

    def _write_json(self, path: Path, data: dict[str, str]) -> None:
        self.layout.ensure_dir(path.parent)
        tmp = path.with_name(path.name + ".tmp")
        with self.layout.pin(path.parent) as parent:
            fd = os.open(
                os.path.join(parent, tmp.name),
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                0o640,
            )
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, sort_keys=True)
            os.replace(os.path.join(parent, tmp.name), os.path.join(parent, path.name))

    def _remove_file(self, path: Path) -> None:
        try:
            with self.layout.pin(path.parent) as parent:
                os.unlink(os.path.join(parent, path.name))
        except FileNotFoundError:
            pass

    def _cleanup(self, path: Path, *files: Path, stop_at: Path | None = None) -> None:
        """Remove what the caller created; leave anything that is (still) mounted."""
        for f in files:
            self._remove_file(f)
        try:
            self.layout.remove_dir(path, stop_at=stop_at)
        except FileNotFoundError:
            pass
        except PathInUseError as exc:
            logger.warning("leaving {}: {}", path, exc)

    # ------------------------------------------------------------- stage

    async def mount_device(self, req: VolumeRequest) -> MountResult:
        """NodeStageVolume (skipped without STAGE_UNSTAGE_VOLUME, but dirs and json still made)."""
        staging = req.device_mount_path
        if staging is None:
            raise PluginError("InvalidArgument", "no staging path", ErrorClass.TRANSIENT)
        data_file = self._stage_data_file(req, staging)
        try:
            self.layout.ensure_dir(staging)
            self._write_json(
                data_file,
                {"volumeHandle": req.source.volume_handle, "driverName": self.driver},
            )
        except (OSError, PluginError) as exc:
            raise PluginError("StagingDir", str(exc), ErrorClass.TRANSIENT) from exc
        if not self._stages(req):
            return MountResult(path=str(staging), detail="driver has no STAGE_UNSTAGE_VOLUME")
        request = csi_pb2.NodeStageVolumeRequest(
            volume_id=req.source.volume_handle,
            staging_target_path=str(staging),
            volume_capability=self._capability(req),
            volume_context=dict(req.source.attributes),
        )
        try:
            await self.client.stage(request)
        except PluginError as err:
            if err.final:
                self._cleanup(staging, data_file)
            raise
        return await self._verify(staging, req.volume_mode != BLOCK)

    def _stage_data_file(self, req: VolumeRequest, staging: Path) -> Path:
        if req.volume_mode == BLOCK:
            return self.layout.csi_block_vol_data_path(self._spec_name(req))
        return staging.parent / "vol_data.json"

    async def unmount_device(self, req: VolumeRequest) -> None:
        """NodeUnstageVolume; on success remove the staging dir and its vol_data.json."""
        staging = req.device_mount_path
        if staging is None:
            return
        if self._stages(req):
            await self.client.unstage(req.source.volume_handle, str(staging))
        data_file = self._stage_data_file(req, staging)
        self._cleanup(staging, data_file, stop_at=self.layout.plugin_dir(CSI_PLUGIN))
        if req.volume_mode == BLOCK:
            self._cleanup(data_file.parent, stop_at=self.layout.csi_block_root())

    # ----------------------------------------------------------- publish

    async def set_up(self, req: VolumeRequest) -> MountResult:
        """NodePublishVolume to pods/<uid>/volumes/kubernetes.io~csi/<name>/mount (or a file)."""
        target = req.mount_path
        if target is None:
            raise PluginError("InvalidArgument", "no target path", ErrorClass.TRANSIENT)
        data_file = self._publish_data_file(req, target)
        try:
            self.layout.ensure_dir(target.parent)
            self._write_json(
                data_file,
                {
                    "specVolID": req.spec_name or req.volume_name,
                    "volumeHandle": req.source.volume_handle,
                    "driverName": self.driver,
                    "nodeName": self.node_name,
                    "attachmentID": "",
                    "volumeLifecycleMode": "Ephemeral" if req.ephemeral else "Persistent",
                },
            )
        except (OSError, PluginError) as exc:
            raise PluginError("PublishDir", str(exc), ErrorClass.TRANSIENT) from exc
        request = csi_pb2.NodePublishVolumeRequest(
            volume_id=req.source.volume_handle,
            staging_target_path=self._staging_arg(req),
            target_path=str(target),
            volume_capability=self._capability(req),
            readonly=req.read_only,
            volume_context=dict(req.source.attributes),
        )
        try:
            await self.client.publish(request)
        except PluginError as err:
            if err.final:
                self._cleanup(target.parent, data_file, stop_at=self.layout.pod_dir(req.pod_uid))
            raise
        result = await self._verify(target, req.volume_mode != BLOCK)
        if req.volume_mode == BLOCK:
            return MountResult(
                path=result.path,
                device_path=str(target),
                mount_found=result.mount_found,
                detail=result.detail,
            )
        return result

    def _publish_data_file(self, req: VolumeRequest, target: Path) -> Path:
        if req.volume_mode == BLOCK:
            return self.layout.csi_block_vol_data_path(self._spec_name(req))
        return target.parent / "vol_data.json"

    async def tear_down(self, req: VolumeRequest) -> None:
        """NodeUnpublishVolume; then remove what is left (never a mount point)."""
        target = req.mount_path
        if target is None:
            return
        await self.client.unpublish(req.source.volume_handle, str(target))
        if req.volume_mode == BLOCK:
            self._cleanup(target, stop_at=self.layout.csi_block_root())
            return
        data_file = self._publish_data_file(req, target)
        self._cleanup(target, stop_at=target.parent)
        self._cleanup(target.parent, data_file, stop_at=self.layout.pod_dir(req.pod_uid))

    # ------------------------------------------------------------ expand

    async def expand(self, req: VolumeRequest, new_size: int) -> int:
        """NodeExpandVolume with capacity_range.required_bytes (kubelet always sends it)."""
        if not self.caps.expand:
            return new_size
        path = req.mount_path or req.device_mount_path
        request = csi_pb2.NodeExpandVolumeRequest(
            volume_id=req.source.volume_handle,
            volume_path=str(path) if path else "",
            staging_target_path=self._staging_arg(req),
            capacity_range=csi_pb2.CapacityRange(required_bytes=new_size),
            volume_capability=self._capability(req),
        )
        size = await self.client.expand(request)
        return size or new_size

    # ------------------------------------------------------------ verify

    async def _verify(self, path: Path, expect_mount: bool) -> MountResult:
        """What /proc/self/mountinfo shows at `path` after the driver said OK."""
        info = await asyncio.to_thread(find_mount, path)
        if info is None:
            detail = "driver reported success but nothing is mounted there"
            if expect_mount:
                logger.warning("{}: {}", path, detail)
            return MountResult(path=str(path), mount_found=False, detail=detail)
        return MountResult(
            path=str(path),
            mount_found=True,
            detail=f"{info.fstype} {info.source} root={info.root}",
        )

"""The CSI Node service: check each request, then stage, publish, expand or report."""

from __future__ import annotations

from typing import Any

import grpc

from volfsm.csi.v1 import csi_pb2
from volfsm.csidriver import publish, stage
from volfsm.csidriver.capability import (
    Capability,
    optional_field,
    parse_capability,
    require,
    require_path,
    volume_path,
)
from volfsm.csidriver.config import Settings
from volfsm.csidriver.errors import CsiError, invalid_argument, not_found
from volfsm.csidriver.expand import grow
from volfsm.csidriver.rpc import CallRunner
from volfsm.csidriver.stats import volume_condition, volume_stats
from volfsm.csidriver.volumes import Volumes

RPC = csi_pb2.NodeServiceCapability.RPC
EPHEMERAL_KEY = "csi.storage.k8s.io/ephemeral"
"""The kubelet's volume context key (with podInfoOnMount): "true" for an inline volume."""
SIZE_KEY = "size"
"""An inline volume's attribute: its size in bytes, or with a Ki/Mi/Gi suffix."""


def _unimplemented(rpc: str) -> CsiError:
    return CsiError(grpc.StatusCode.UNIMPLEMENTED, f"{rpc} is disabled (no STAGE_UNSTAGE_VOLUME)")


class NodeService:
    """Servicer for /csi.v1.Node."""

    def __init__(self, settings: Settings, runner: CallRunner, volumes: Volumes) -> None:
        self._settings = settings
        self._runner = runner
        self._volumes = volumes

    def _cap(self, request: Any, field: str = "volume_capability") -> Capability:
        return parse_capability(
            optional_field(request, field),
            field,
            mount_group_allowed=self._settings.volume_mount_group,
        )

    def _call(self, rpc: str, request: Any, context: Any, work: Any) -> Any:
        return self._runner.run(rpc, request, context, work, volume_id=request.volume_id, lock=True)

    def NodeStageVolume(self, request: Any, context: Any) -> Any:
        """Attach the loop device; format and mount it for filesystem access."""

        def work() -> Any:
            if not self._settings.stage_unstage:
                raise _unimplemented("NodeStageVolume")
            path = require_path(request.staging_target_path, "staging_target_path")
            stage.stage(self._volumes, request.volume_id, path, self._cap(request))
            return csi_pb2.NodeStageVolumeResponse()

        return self._call("NodeStageVolume", request, context, work)

    def NodeUnstageVolume(self, request: Any, context: Any) -> Any:
        """Unmount the staging path and detach the loop device."""

        def work() -> Any:
            if not self._settings.stage_unstage:
                raise _unimplemented("NodeUnstageVolume")
            path = require_path(request.staging_target_path, "staging_target_path")
            stage.unstage(self._volumes, request.volume_id, path)
            return csi_pb2.NodeUnstageVolumeResponse()

        return self._call("NodeUnstageVolume", request, context, work)

    def NodePublishVolume(self, request: Any, context: Any) -> Any:
        """Bind the staged volume (or its device node) onto target_path."""

        def work() -> Any:
            target = require_path(request.target_path, "target_path")
            staging = request.staging_target_path
            if staging:
                staging = require_path(staging, "staging_target_path")
            cap = self._cap(request)
            if request.volume_context.get(EPHEMERAL_KEY) == "true":
                self._volumes.create_ephemeral(
                    request.volume_id, request.volume_context.get(SIZE_KEY, "")
                )
            publish.publish(
                self._volumes,
                self._settings,
                request.volume_id,
                staging,
                target,
                cap,
                bool(request.readonly),
            )
            return csi_pb2.NodePublishVolumeResponse()

        return self._call("NodePublishVolume", request, context, work)

    def NodeUnpublishVolume(self, request: Any, context: Any) -> Any:
        """Unmount and remove target_path."""

        def work() -> Any:
            target = require_path(request.target_path, "target_path")
            publish.unpublish(self._volumes, self._settings, request.volume_id, target)
            return csi_pb2.NodeUnpublishVolumeResponse()

        return self._call("NodeUnpublishVolume", request, context, work)

    def NodeGetVolumeStats(self, request: Any, context: Any) -> Any:
        """Bytes and inodes of the filesystem at volume_path, and the volume's condition."""

        def work() -> Any:
            require(request.volume_path, "volume_path")
            self._volumes.get(request.volume_id)  # NOT_FOUND before the path is looked at
            path = volume_path(request.volume_id, request.volume_path)
            condition = volume_condition(self._volumes, request.volume_id, path)
            try:
                usage = volume_stats(self._volumes, request.volume_id, path)
            except CsiError:
                if not condition.abnormal:
                    raise
                usage = []  # what is wrong stops the measuring: say what, not NOT_FOUND
            return csi_pb2.NodeGetVolumeStatsResponse(usage=usage, volume_condition=condition)

        return self._call("NodeGetVolumeStats", request, context, work)

    def NodeExpandVolume(self, request: Any, context: Any) -> Any:
        """Grow file, loop device and filesystem of a staged or published volume."""

        def work() -> Any:
            require(request.volume_path, "volume_path")
            record = self._volumes.get(request.volume_id)  # NOT_FOUND before the path is looked at
            path = volume_path(request.volume_id, request.volume_path)
            if record.staged is not None and record.staged.path == path:
                access = record.staged.access
            elif path in record.published:
                access = record.published[path].access
            else:
                raise not_found(f"volume {request.volume_id} is not staged or published at {path}")
            if request.HasField("volume_capability") and self._cap(request).access != access:
                raise invalid_argument(f"volume {request.volume_id} is used for {access} access")
            capacity_range = optional_field(request, "capacity_range")
            capacity = grow(self._volumes, record, capacity_range, access)
            return csi_pb2.NodeExpandVolumeResponse(capacity_bytes=capacity)

        return self._call("NodeExpandVolume", request, context, work)

    def NodeGetCapabilities(self, request: Any, context: Any) -> Any:
        """STAGE_UNSTAGE_VOLUME (unless disabled), GET_VOLUME_STATS, EXPAND_VOLUME,
        VOLUME_CONDITION, ..."""
        types = [RPC.GET_VOLUME_STATS, RPC.EXPAND_VOLUME, RPC.VOLUME_CONDITION]
        if self._settings.stage_unstage:
            types.insert(0, RPC.STAGE_UNSTAGE_VOLUME)
        if self._settings.single_node_multi_writer:
            types.append(RPC.SINGLE_NODE_MULTI_WRITER)
        if self._settings.volume_mount_group:
            types.append(RPC.VOLUME_MOUNT_GROUP)
        caps = [csi_pb2.NodeServiceCapability(rpc=RPC(type=t)) for t in types]
        return self._runner.run(
            "NodeGetCapabilities",
            request,
            context,
            lambda: csi_pb2.NodeGetCapabilitiesResponse(capabilities=caps),
        )

    def NodeGetInfo(self, request: Any, context: Any) -> Any:
        """The node id (and the volume limit, 0 = none)."""
        return self._runner.run(
            "NodeGetInfo",
            request,
            context,
            lambda: csi_pb2.NodeGetInfoResponse(
                node_id=self._settings.node_id,
                max_volumes_per_node=self._settings.max_volumes_per_node,
            ),
        )

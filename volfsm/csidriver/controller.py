"""The CSI Controller calls volfsm's tests need: create, delete, expand and validate volumes."""

from __future__ import annotations

from typing import Any

from volfsm.csi.v1 import csi_pb2
from volfsm.csidriver.capability import BLOCK, optional_field, parse_capability
from volfsm.csidriver.config import Settings
from volfsm.csidriver.errors import CsiError, invalid_argument
from volfsm.csidriver.expand import filesystem_pending, grow
from volfsm.csidriver.rpc import CallRunner
from volfsm.csidriver.volumes import Volumes

RPC = csi_pb2.ControllerServiceCapability.RPC


class ControllerService:
    """Servicer for /csi.v1.Controller."""

    def __init__(self, settings: Settings, runner: CallRunner, volumes: Volumes) -> None:
        self._settings = settings
        self._runner = runner
        self._volumes = volumes

    def CreateVolume(self, request: Any, context: Any) -> Any:
        """Make a sparse backing file; idempotent by name."""
        return self._runner.run(
            "CreateVolume",
            request,
            context,
            lambda: self._create(request),
            volume_id=request.name,
            lock=True,
            key_field="name",
        )

    def _create(self, request: Any) -> Any:
        if not request.volume_capabilities:
            raise invalid_argument("volume_capabilities is required")
        for i, cap in enumerate(request.volume_capabilities):
            parse_capability(cap, f"volume_capabilities[{i}]", mount_group_allowed=True)
        if request.HasField("volume_content_source"):
            raise invalid_argument("volume_content_source is not supported (no clones)")
        capacity_range = optional_field(request, "capacity_range")
        record, _ = self._volumes.create(request.name, capacity_range)
        return csi_pb2.CreateVolumeResponse(
            volume=csi_pb2.Volume(volume_id=record.volume_id, capacity_bytes=record.capacity_bytes)
        )

    def DeleteVolume(self, request: Any, context: Any) -> Any:
        """Remove the backing file; OK if it is already gone."""
        return self._runner.run(
            "DeleteVolume",
            request,
            context,
            lambda: self._delete(request),
            volume_id=request.volume_id,
            lock=True,
        )

    def _delete(self, request: Any) -> Any:
        self._volumes.delete(request.volume_id)
        return csi_pb2.DeleteVolumeResponse()

    def ValidateVolumeCapabilities(self, request: Any, context: Any) -> Any:
        """Confirm the capabilities if the volume can be used with every one of them.

        The CSI spec's error table: no volume_id or no capabilities is
        INVALID_ARGUMENT, an unknown volume NOT_FOUND; a capability the driver
        does not support is an answer without ``confirmed``, with a message.
        """
        return self._runner.run(
            "ValidateVolumeCapabilities",
            request,
            context,
            lambda: self._validate(request),
            volume_id=request.volume_id,
            lock=True,
        )

    def _validate(self, request: Any) -> Any:
        if not request.volume_capabilities:
            raise invalid_argument("volume_capabilities is required")
        self._volumes.get(request.volume_id)  # NOT_FOUND
        for i, cap in enumerate(request.volume_capabilities):
            try:
                parse_capability(cap, f"volume_capabilities[{i}]", mount_group_allowed=True)
            except CsiError as err:
                return csi_pb2.ValidateVolumeCapabilitiesResponse(message=err.message)
        confirmed = csi_pb2.ValidateVolumeCapabilitiesResponse.Confirmed(
            volume_context=dict(request.volume_context),
            volume_capabilities=list(request.volume_capabilities),
            parameters=dict(request.parameters),
            mutable_parameters=dict(request.mutable_parameters),
        )
        return csi_pb2.ValidateVolumeCapabilitiesResponse(confirmed=confirmed)

    def ControllerGetCapabilities(self, request: Any, context: Any) -> Any:
        """CREATE_DELETE_VOLUME and EXPAND_VOLUME."""
        caps = [
            csi_pb2.ControllerServiceCapability(rpc=RPC(type=RPC.CREATE_DELETE_VOLUME)),
            csi_pb2.ControllerServiceCapability(rpc=RPC(type=RPC.EXPAND_VOLUME)),
        ]
        return self._runner.run(
            "ControllerGetCapabilities",
            request,
            context,
            lambda: csi_pb2.ControllerGetCapabilitiesResponse(capabilities=caps),
        )

    def ControllerExpandVolume(self, request: Any, context: Any) -> Any:
        """Grow the backing file (and, when attached, the device and filesystem)."""
        return self._runner.run(
            "ControllerExpandVolume",
            request,
            context,
            lambda: self._expand(request),
            volume_id=request.volume_id,
            lock=True,
        )

    def _expand(self, request: Any) -> Any:
        capacity_range = optional_field(request, "capacity_range")
        if capacity_range is None:
            raise invalid_argument("capacity_range is required")
        cap_msg = optional_field(request, "volume_capability")
        access = ""
        if cap_msg is not None:
            access = parse_capability(cap_msg, "volume_capability", mount_group_allowed=True).access
        record = self._volumes.get(request.volume_id)
        capacity = grow(self._volumes, record, capacity_range, access)
        return csi_pb2.ControllerExpandVolumeResponse(
            capacity_bytes=capacity,
            node_expansion_required=access != BLOCK and filesystem_pending(record),
        )

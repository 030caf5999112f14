"""The csi-sanity (kubernetes-csi/csi-test) cases volfsm's driver failed, mirrored here.

csi-sanity is a Go binary that no package index this project uses offers
(PyPI, npm, Debian), so these tests make its requests with the same fields
and expect the codes it expects (the CSI spec's error tables).
"""

from __future__ import annotations

import grpc
import pytest

from tests.helpers.csidriver import CsiClients, block_capability, create_volume, mount_capability
from volfsm.csi.v1 import csi_pb2

NOT_FOUND = grpc.StatusCode.NOT_FOUND
INVALID = grpc.StatusCode.INVALID_ARGUMENT
Mode = csi_pb2.VolumeCapability.AccessMode.Mode


def code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value.code()


def validate(csi: CsiClients, volume_id: str, *caps: object) -> object:
    request = csi_pb2.ValidateVolumeCapabilitiesRequest(
        volume_id=volume_id, volume_capabilities=list(caps), parameters={"p": "1"}
    )
    return csi.controller.ValidateVolumeCapabilities(request, timeout=10)


def test_validate_volume_capabilities_follows_the_error_table(csi: CsiClients) -> None:
    create_volume(csi, "vvc")
    no_id = csi_pb2.ValidateVolumeCapabilitiesRequest(volume_capabilities=[mount_capability()])
    assert code_of(lambda: csi.controller.ValidateVolumeCapabilities(no_id, timeout=10)) == INVALID
    assert code_of(lambda: validate(csi, "vvc")) == INVALID  # no capabilities
    assert code_of(lambda: validate(csi, "ghost", mount_capability())) == NOT_FOUND


def test_validate_volume_capabilities_confirms_what_is_supported(csi: CsiClients) -> None:
    create_volume(csi, "vvc-ok")
    reply = validate(csi, "vvc-ok", mount_capability(), block_capability())
    assert reply.HasField("confirmed")  # type: ignore[attr-defined]
    assert len(reply.confirmed.volume_capabilities) == 2  # type: ignore[attr-defined]
    assert dict(reply.confirmed.parameters) == {"p": "1"}  # type: ignore[attr-defined]
    unknown = csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=Mode.UNKNOWN),
    )
    refused = validate(csi, "vvc-ok", unknown)
    assert not refused.HasField("confirmed") and refused.message  # type: ignore[attr-defined]


def test_node_expand_of_an_unknown_volume_is_not_found_before_the_path_is_checked(
    csi: CsiClients,
) -> None:
    # csi-sanity: "should fail when volume is not found" sends a relative "some-path"
    request = csi_pb2.NodeExpandVolumeRequest(volume_id="ghost", volume_path="some-path")
    assert code_of(lambda: csi.node.NodeExpandVolume(request, timeout=10)) == NOT_FOUND
    create_volume(csi, "nev")
    no_path = csi_pb2.NodeExpandVolumeRequest(volume_id="nev")
    assert code_of(lambda: csi.node.NodeExpandVolume(no_path, timeout=10)) == INVALID

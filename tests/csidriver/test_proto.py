"""The committed stubs match csi.proto, and a sample of wire facts from the CSI spec."""

from __future__ import annotations

import subprocess
from typing import Any

from tests.helpers.csidriver import REPO_ROOT
from volfsm.csi.v1 import csi_pb2


def _number(message: type, field: str) -> int:
    return int(message.DESCRIPTOR.fields_by_name[field].number)  # type: ignore[attr-defined]


def test_committed_stubs_are_current() -> None:
    done = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "check_csi_stubs.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_wire_facts() -> None:
    assert csi_pb2.DESCRIPTOR.package == "csi.v1"
    assert _number(csi_pb2.NodeStageVolumeRequest, "staging_target_path") == 3
    assert _number(csi_pb2.NodeStageVolumeRequest, "volume_context") == 6
    assert _number(csi_pb2.NodePublishVolumeRequest, "readonly") == 6
    assert _number(csi_pb2.NodePublishVolumeRequest, "volume_context") == 8
    assert _number(csi_pb2.NodeExpandVolumeRequest, "staging_target_path") == 4
    assert _number(csi_pb2.NodeGetInfoResponse, "accessible_topology") == 3
    assert _number(csi_pb2.ProbeResponse, "ready") == 1
    assert csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_MULTI_WRITER == 7
    assert csi_pb2.NodeServiceCapability.RPC.VOLUME_MOUNT_GROUP == 6
    assert csi_pb2.csi_secret.number == 1059
    node = csi_pb2.DESCRIPTOR.services_by_name["Node"]
    assert node.methods_by_name["NodePublishVolume"].full_name == "csi.v1.Node.NodePublishVolume"


def test_secret_fields_are_marked() -> None:
    for message in (
        csi_pb2.NodeStageVolumeRequest,
        csi_pb2.NodePublishVolumeRequest,
        csi_pb2.NodeExpandVolumeRequest,
        csi_pb2.CreateVolumeRequest,
        csi_pb2.DeleteVolumeRequest,
        csi_pb2.ControllerExpandVolumeRequest,
    ):
        for fd in message.DESCRIPTOR.fields:
            options: Any = fd.GetOptions()
            marked = options.Extensions[csi_pb2.csi_secret]
            assert marked == (fd.name == "secrets"), f"{message.__name__}.{fd.name}"

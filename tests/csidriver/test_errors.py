"""Bad requests and wrong states get the spec's error codes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.helpers.csidriver import (
    MIB,
    CsiClients,
    Mode,
    block_capability,
    create_volume,
    mount_capability,
    publish_volume,
    stage_volume,
    unpublish_volume,
    unstage_volume,
)
from volfsm.csi.v1 import csi_pb2

PathFor = Callable[[str], str]
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _code(call: Callable[[], Any]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()
    details = err.value.details()
    assert details, "the status message must be human-readable"
    return err.value.code()


def _cap_without_access_type() -> Any:
    return csi_pb2.VolumeCapability(
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=Mode.SINGLE_NODE_WRITER)
    )


def _cap_without_mode() -> Any:
    return csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume())


BAD_REQUESTS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "stage without volume_id": (
        "NodeStageVolume",
        lambda p: csi_pb2.NodeStageVolumeRequest(
            staging_target_path=p, volume_capability=mount_capability()
        ),
    ),
    "stage without staging path": (
        "NodeStageVolume",
        lambda p: csi_pb2.NodeStageVolumeRequest(
            volume_id="v", volume_capability=mount_capability()
        ),
    ),
    "stage with relative path": (
        "NodeStageVolume",
        lambda p: csi_pb2.NodeStageVolumeRequest(
            volume_id="v", staging_target_path="rel/dir", volume_capability=mount_capability()
        ),
    ),
    "stage without capability": (
        "NodeStageVolume",
        lambda p: csi_pb2.NodeStageVolumeRequest(volume_id="v", staging_target_path=p),
    ),
    "stage without access type": (
        "NodeStageVolume",
        lambda p: csi_pb2.NodeStageVolumeRequest(
            volume_id="v", staging_target_path=p, volume_capability=_cap_without_access_type()
        ),
    ),
    "stage without access mode": (
        "NodeStageVolume",
        lambda p: csi_pb2.NodeStageVolumeRequest(
            volume_id="v", staging_target_path=p, volume_capability=_cap_without_mode()
        ),
    ),
    "stage with xfs": (
        "NodeStageVolume",
        lambda p: csi_pb2.NodeStageVolumeRequest(
            volume_id="v", staging_target_path=p, volume_capability=mount_capability(fs_type="xfs")
        ),
    ),
    "stage with a hostile mount flag": (
        "NodeStageVolume",
        lambda p: csi_pb2.NodeStageVolumeRequest(
            volume_id="v",
            staging_target_path=p,
            volume_capability=mount_capability(mount_flags=["ro,remount"]),
        ),
    ),
    "stage with mount group not offered": (
        "NodeStageVolume",
        lambda p: csi_pb2.NodeStageVolumeRequest(
            volume_id="v",
            staging_target_path=p,
            volume_capability=mount_capability(volume_mount_group="1000"),
        ),
    ),
    "unstage without volume_id": (
        "NodeUnstageVolume",
        lambda p: csi_pb2.NodeUnstageVolumeRequest(staging_target_path=p),
    ),
    "unstage without path": (
        "NodeUnstageVolume",
        lambda p: csi_pb2.NodeUnstageVolumeRequest(volume_id="v"),
    ),
    "publish without target": (
        "NodePublishVolume",
        lambda p: csi_pb2.NodePublishVolumeRequest(
            volume_id="v", staging_target_path=p, volume_capability=mount_capability()
        ),
    ),
    "publish without capability": (
        "NodePublishVolume",
        lambda p: csi_pb2.NodePublishVolumeRequest(
            volume_id="v", staging_target_path=p, target_path=p + "/t"
        ),
    ),
    "unpublish without target": (
        "NodeUnpublishVolume",
        lambda p: csi_pb2.NodeUnpublishVolumeRequest(volume_id="v"),
    ),
    "unpublish without volume_id": (
        "NodeUnpublishVolume",
        lambda p: csi_pb2.NodeUnpublishVolumeRequest(target_path=p),
    ),
    "stats without path": (
        "NodeGetVolumeStats",
        lambda p: csi_pb2.NodeGetVolumeStatsRequest(volume_id="v"),
    ),
    "expand without path": (
        "NodeExpandVolume",
        lambda p: csi_pb2.NodeExpandVolumeRequest(volume_id="v"),
    ),
    "create without name": (
        "CreateVolume",
        lambda p: csi_pb2.CreateVolumeRequest(volume_capabilities=[mount_capability()]),
    ),
    "create without capabilities": (
        "CreateVolume",
        lambda p: csi_pb2.CreateVolumeRequest(name="v"),
    ),
    "create with a path as name": (
        "CreateVolume",
        lambda p: csi_pb2.CreateVolumeRequest(
            name="../escape", volume_capabilities=[mount_capability()]
        ),
    ),
    "delete without volume_id": (
        "DeleteVolume",
        lambda p: csi_pb2.DeleteVolumeRequest(),
    ),
    "controller expand without range": (
        "ControllerExpandVolume",
        lambda p: csi_pb2.ControllerExpandVolumeRequest(volume_id="v"),
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_requests_are_invalid_argument(csi: CsiClients, tmp_path: Path, case: str) -> None:
    create_volume(csi, "v")
    method, build = BAD_REQUESTS[case]
    stub = (
        csi.controller
        if method in ("CreateVolume", "DeleteVolume", "ControllerExpandVolume")
        else csi.node
    )
    request = build(str(tmp_path))
    assert _code(lambda: getattr(stub, method)(request, timeout=10)) == INVALID


def test_unknown_volume_is_not_found(csi: CsiClients, staging: PathFor, target: PathFor) -> None:
    path = staging("ghost")
    assert _code(lambda: stage_volume(csi, "ghost", path)) == grpc.StatusCode.NOT_FOUND
    assert _code(lambda: unstage_volume(csi, "ghost", path)) == grpc.StatusCode.NOT_FOUND
    assert (
        _code(lambda: publish_volume(csi, "ghost", path, target("g"))) == grpc.StatusCode.NOT_FOUND
    )
    assert _code(lambda: unpublish_volume(csi, "ghost", target("g"))) == grpc.StatusCode.NOT_FOUND
    stats = csi_pb2.NodeGetVolumeStatsRequest(volume_id="ghost", volume_path=path)
    assert (
        _code(lambda: csi.node.NodeGetVolumeStats(stats, timeout=10)) == grpc.StatusCode.NOT_FOUND
    )
    expand = csi_pb2.NodeExpandVolumeRequest(volume_id="ghost", volume_path=path)
    assert _code(lambda: csi.node.NodeExpandVolume(expand, timeout=10)) == grpc.StatusCode.NOT_FOUND
    ctrl_expand = csi_pb2.ControllerExpandVolumeRequest(
        volume_id="ghost", capacity_range=csi_pb2.CapacityRange(required_bytes=64 * MIB)
    )
    assert (
        _code(lambda: csi.controller.ControllerExpandVolume(ctrl_expand, timeout=10))
        == grpc.StatusCode.NOT_FOUND
    )


def test_create_is_idempotent_by_name(csi: CsiClients) -> None:
    first = create_volume(csi, "same", 16 * MIB)
    again = create_volume(csi, "same", 16 * MIB)
    assert (first.volume_id, first.capacity_bytes) == (again.volume_id, again.capacity_bytes)
    assert _code(lambda: create_volume(csi, "same", 48 * MIB)) == grpc.StatusCode.ALREADY_EXISTS
    too_small = csi_pb2.CreateVolumeRequest(
        name="tiny",
        capacity_range=csi_pb2.CapacityRange(required_bytes=1, limit_bytes=1024),
        volume_capabilities=[mount_capability()],
    )
    assert (
        _code(lambda: csi.controller.CreateVolume(too_small, timeout=10))
        == grpc.StatusCode.OUT_OF_RANGE
    )


def test_wrong_states_are_refused(
    csi: CsiClients, staging: PathFor, target: PathFor, tmp_path: Path
) -> None:
    create_volume(csi, "st")
    path = staging("st")
    missing_dir = str(tmp_path / "not-created-by-the-co")
    precondition = grpc.StatusCode.FAILED_PRECONDITION

    assert _code(lambda: stage_volume(csi, "st", missing_dir)) == precondition
    # Publish before stage, and publish without a staging path.
    assert _code(lambda: publish_volume(csi, "st", path, target("early"))) == precondition
    assert _code(lambda: publish_volume(csi, "st", "", target("early"))) == precondition
    assert not Path(target("early")).exists()

    stage_volume(csi, "st", path)
    # Same path, other capability: ALREADY_EXISTS; another staging path: refused.
    assert (
        _code(lambda: stage_volume(csi, "st", path, block_capability()))
        == grpc.StatusCode.ALREADY_EXISTS
    )
    assert _code(lambda: stage_volume(csi, "st", staging("st-other"))) == precondition
    # Block publish of a volume staged for filesystem access.
    assert (
        _code(lambda: publish_volume(csi, "st", path, target("blk"), block_capability()))
        == precondition
    )
    # The parent of target_path is the CO's to create.
    orphan = str(tmp_path / "no-parent" / "mount")
    assert _code(lambda: publish_volume(csi, "st", path, orphan)) == precondition
    # Deleting a staged volume.
    delete = csi_pb2.DeleteVolumeRequest(volume_id="st")
    assert _code(lambda: csi.controller.DeleteVolume(delete, timeout=10)) == precondition
    # Unstage at a path where it is not staged: OK, and the real stage stays.
    unstage_volume(csi, "st", staging("st-other"))
    unstage_volume(csi, "st", path)
    csi.controller.DeleteVolume(delete, timeout=10)

"""Expansion (file, loop device, ext4; visible in df) and volume stats."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.helpers.csidriver import (
    MIB,
    CsiClients,
    DriverProcess,
    block_capability,
    create_volume,
    mounts_at,
    publish_volume,
    stage_volume,
    unpublish_volume,
    unstage_volume,
)
from volfsm.csi.v1 import csi_pb2

PathFor = Callable[[str], str]
Unit = csi_pb2.VolumeUsage.Unit


def df_size(path: str) -> int:
    """Filesystem size in bytes, as df reports it."""
    out = subprocess.run(
        ["df", "-B1", "--output=size", path], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[-1])


def node_expand(csi: CsiClients, volume_id: str, path: str, size: int, **kw: Any) -> int:
    resp = csi.node.NodeExpandVolume(
        csi_pb2.NodeExpandVolumeRequest(
            volume_id=volume_id,
            volume_path=path,
            capacity_range=csi_pb2.CapacityRange(required_bytes=size, **kw),
        ),
        timeout=30,
    )
    return int(resp.capacity_bytes)


def controller_expand(csi: CsiClients, volume_id: str, size: int) -> Any:
    return csi.controller.ControllerExpandVolume(
        csi_pb2.ControllerExpandVolumeRequest(
            volume_id=volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=size)
        ),
        timeout=30,
    )


def stats(csi: CsiClients, volume_id: str, path: str) -> dict[int, Any]:
    resp = csi.node.NodeGetVolumeStats(
        csi_pb2.NodeGetVolumeStatsRequest(volume_id=volume_id, volume_path=path), timeout=10
    )
    return {u.unit: u for u in resp.usage}


def test_node_expand_of_mounted_volume_shows_in_df(
    driver: DriverProcess, csi: CsiClients, staging: PathFor, target: PathFor
) -> None:
    create_volume(csi, "x1", 32 * MIB)
    stage_path, rw, ro = staging("x1"), target("rw"), target("ro")
    stage_volume(csi, "x1", stage_path)
    publish_volume(csi, "x1", stage_path, rw)
    publish_volume(csi, "x1", stage_path, ro, readonly=True)
    Path(rw, "data").write_bytes(b"x" * MIB)
    before = df_size(stage_path)
    assert before < 32 * MIB

    assert node_expand(csi, "x1", stage_path, 96 * MIB) == 96 * MIB
    assert driver.image("x1").stat().st_size == 96 * MIB
    after = df_size(stage_path)
    assert after > 80 * MIB and after > before
    assert df_size(rw) == after
    # Everything is still where it was, as it was.
    assert Path(rw, "data").read_bytes() == b"x" * MIB
    assert len(mounts_at(stage_path)) == len(mounts_at(rw)) == len(mounts_at(ro)) == 1
    assert "ro" in mounts_at(ro)[0].options and "rw" in mounts_at(rw)[0].options

    # Already big enough: OK, nothing changes. Shrinking is out of range.
    assert node_expand(csi, "x1", rw, 64 * MIB) == 96 * MIB
    with pytest.raises(grpc.RpcError) as err:
        node_expand(csi, "x1", stage_path, 16 * MIB, limit_bytes=48 * MIB)
    assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
    # A path where the volume is not: NOT_FOUND.
    with pytest.raises(grpc.RpcError) as err:
        node_expand(csi, "x1", str(Path(stage_path).parent), 128 * MIB)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    unpublish_volume(csi, "x1", ro)
    unpublish_volume(csi, "x1", rw)
    unstage_volume(csi, "x1", stage_path)


def test_expand_of_busy_volume_grows_or_refuses_cleanly(
    csi: CsiClients, staging: PathFor, target: PathFor
) -> None:
    """Online growth needs CAP_SYS_RESOURCE; without it the driver grows offline,
    which a busy volume does not allow: FAILED_PRECONDITION with every mount kept."""
    create_volume(csi, "x2", 32 * MIB)
    stage_path, pod = staging("x2"), target("busy")
    stage_volume(csi, "x2", stage_path)
    publish_volume(csi, "x2", stage_path, pod)
    before = df_size(stage_path)
    with open(Path(pod, "open-file"), "w") as busy:
        busy.write("held open")
        busy.flush()
        try:
            grown = node_expand(csi, "x2", stage_path, 64 * MIB)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err
            assert "in use" in err.details()
            assert df_size(stage_path) == before
        else:
            assert grown == 64 * MIB and df_size(stage_path) > before
        assert len(mounts_at(stage_path)) == 1 and len(mounts_at(pod)) == 1
    assert Path(pod, "open-file").read_text() == "held open"
    unpublish_volume(csi, "x2", pod)
    unstage_volume(csi, "x2", stage_path)


def test_controller_expand(csi: CsiClients, staging: PathFor) -> None:
    create_volume(csi, "x3", 32 * MIB)
    stage_path = staging("x3")
    stage_volume(csi, "x3", stage_path)  # formats
    unstage_volume(csi, "x3", stage_path)

    # Not staged: the file grows now, the filesystem when the node stages it.
    resp = controller_expand(csi, "x3", 64 * MIB)
    assert resp.capacity_bytes == 64 * MIB and resp.node_expansion_required
    stage_volume(csi, "x3", stage_path)
    assert df_size(stage_path) > 48 * MIB
    assert node_expand(csi, "x3", stage_path, 64 * MIB) == 64 * MIB

    # Staged: everything grows at once.
    resp = controller_expand(csi, "x3", 80 * MIB)
    assert resp.capacity_bytes == 80 * MIB and not resp.node_expansion_required
    assert df_size(stage_path) > 64 * MIB
    unstage_volume(csi, "x3", stage_path)


def test_block_expand_and_stats(
    driver: DriverProcess, csi: CsiClients, staging: PathFor, target: PathFor
) -> None:
    create_volume(csi, "b1", 16 * MIB, block=True)
    cap = block_capability()
    stage_path, dev_path = staging("b1"), target("blk")
    stage_volume(csi, "b1", stage_path, cap)
    publish_volume(csi, "b1", stage_path, dev_path, cap)
    assert stats(csi, "b1", dev_path)[Unit.BYTES].total == 16 * MIB
    assert stats(csi, "b1", stage_path)[Unit.BYTES].total == 16 * MIB

    assert node_expand(csi, "b1", dev_path, 40 * MIB) == 40 * MIB
    with open(dev_path, "rb") as dev:
        assert dev.seek(0, os.SEEK_END) == 40 * MIB
    assert stats(csi, "b1", dev_path)[Unit.BYTES].total == 40 * MIB
    unpublish_volume(csi, "b1", dev_path)
    unstage_volume(csi, "b1", stage_path)


def test_filesystem_stats(
    csi: CsiClients, staging: PathFor, target: PathFor, tmp_path: Path
) -> None:
    create_volume(csi, "st1", 32 * MIB)
    create_volume(csi, "st2", 32 * MIB)
    stage_path, pod = staging("st1"), target("stats")
    stage_volume(csi, "st1", stage_path)
    publish_volume(csi, "st1", stage_path, pod)

    empty = stats(csi, "st1", pod)
    assert set(empty) == {Unit.BYTES, Unit.INODES}
    st = os.statvfs(pod)
    assert empty[Unit.BYTES].total == st.f_blocks * st.f_frsize < 32 * MIB
    assert empty[Unit.INODES].total == st.f_files

    for i in range(10):
        Path(pod, f"f{i}").write_bytes(b"y" * (512 * 1024))
    os.sync()
    full = stats(csi, "st1", stage_path)
    assert full[Unit.BYTES].used >= empty[Unit.BYTES].used + 5 * MIB
    assert full[Unit.BYTES].available <= empty[Unit.BYTES].available - 5 * MIB
    assert full[Unit.INODES].used == empty[Unit.INODES].used + 10
    for usage in full.values():
        assert min(usage.total, usage.used, usage.available) >= 0

    # Paths where this volume is not mounted: NOT_FOUND, never the parent's usage.
    for volume_id, path in (("st1", str(tmp_path)), ("st2", pod), ("st1", "/nonexistent/x")):
        with pytest.raises(grpc.RpcError) as err:
            stats(csi, volume_id, path)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND

    unpublish_volume(csi, "st1", pod)
    unstage_volume(csi, "st1", stage_path)


def test_volume_condition_normal_abnormal_by_fault_and_image_gone(
    driver: DriverProcess, csi: CsiClients, staging: PathFor, target: PathFor
) -> None:
    create_volume(csi, "vc1", 32 * MIB)
    stage_path, pod = staging("vc1"), target("cond")
    stage_volume(csi, "vc1", stage_path)
    publish_volume(csi, "vc1", stage_path, pod)
    request = csi_pb2.NodeGetVolumeStatsRequest(volume_id="vc1", volume_path=pod)

    def condition(usages: int = 2) -> tuple[bool, str]:
        resp = csi.node.NodeGetVolumeStats(request, timeout=10)
        assert resp.HasField("volume_condition") and len(resp.usage) == usages
        return resp.volume_condition.abnormal, resp.volume_condition.message

    assert condition() == (False, "")
    driver.set_faults(
        [
            {"rpc": "NodePublishVolume", "action": "abnormal"},  # refused: not a stats call
            {"rpc": "NodeGetVolumeStats", "action": "abnormal", "message": "bad disk", "times": 1},
        ]
    )
    assert condition() == (True, "bad disk")
    assert condition() == (False, "")  # times: 1
    driver.clear_faults()
    image = driver.image("vc1")
    hidden = image.with_suffix(".hidden")
    image.rename(hidden)
    try:
        abnormal, message = condition(usages=0)  # not measurable, but why is said
        assert abnormal and "is missing" in message
    finally:
        hidden.rename(image)
    unpublish_volume(csi, "vc1", pod)
    unstage_volume(csi, "vc1", stage_path)

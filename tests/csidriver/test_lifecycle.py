"""Create, stage, publish, unpublish, unstage and delete, checked in mountinfo and losetup."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from tests.csidriver.conftest import StartDriver
from tests.helpers.csidriver import (
    MIB,
    CsiClients,
    DriverProcess,
    Mode,
    block_capability,
    create_volume,
    loops_of,
    mount_capability,
    mounts_at,
    publish_volume,
    stage_volume,
    unpublish_volume,
    unstage_volume,
)
from volfsm.csi.v1 import csi_pb2

PathFor = Callable[[str], str]


def _delete(csi: CsiClients, volume_id: str) -> None:
    csi.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id), timeout=10)


def test_filesystem_volume_lifecycle(
    driver: DriverProcess, csi: CsiClients, staging: PathFor, target: PathFor
) -> None:
    vol = create_volume(csi, "fs-1", 24 * MIB)
    assert vol.volume_id == "fs-1" and vol.capacity_bytes == 24 * MIB
    image = driver.image("fs-1")
    assert image.stat().st_size == 24 * MIB
    assert image.stat().st_blocks * 512 < MIB, "backing file must be sparse"
    assert loops_of(image) == []

    stage_path, target_path = staging("fs-1"), target("pod-a")
    stage_volume(csi, "fs-1", stage_path)
    (loop,) = loops_of(image)
    (staged,) = mounts_at(stage_path)
    assert (staged.fstype, staged.source, staged.root) == ("ext4", loop, "/")

    publish_volume(csi, "fs-1", stage_path, target_path)
    (bound,) = mounts_at(target_path)
    assert (bound.fstype, bound.source) == ("ext4", loop)
    Path(target_path, "hello").write_text("through the bind")
    assert Path(stage_path, "hello").read_text() == "through the bind"

    # Repeats with the same arguments are OK and change nothing.
    stage_volume(csi, "fs-1", stage_path)
    publish_volume(csi, "fs-1", stage_path, target_path)
    assert len(mounts_at(stage_path)) == 1 and len(mounts_at(target_path)) == 1
    assert loops_of(image) == [loop]

    unpublish_volume(csi, "fs-1", target_path)
    assert mounts_at(target_path) == []
    assert not os.path.exists(target_path), "the driver removes the target it created"
    unpublish_volume(csi, "fs-1", target_path)  # idempotent

    unstage_volume(csi, "fs-1", stage_path)
    assert mounts_at(stage_path) == []
    assert os.path.isdir(stage_path), "the staging dir belongs to the CO"
    assert loops_of(image) == []
    unstage_volume(csi, "fs-1", stage_path)  # idempotent

    # Data survives a second stage (no reformat on later use).
    stage_volume(csi, "fs-1", stage_path)
    assert Path(stage_path, "hello").read_text() == "through the bind"
    unstage_volume(csi, "fs-1", stage_path)

    _delete(csi, "fs-1")
    assert not image.exists()
    _delete(csi, "fs-1")  # idempotent


def test_block_volume_lifecycle(
    driver: DriverProcess, csi: CsiClients, staging: PathFor, target: PathFor
) -> None:
    create_volume(csi, "blk-1", 16 * MIB, block=True)
    image = driver.image("blk-1")
    stage_path, target_path = staging("blk-1"), target("pod-b")
    cap = block_capability()

    stage_volume(csi, "blk-1", stage_path, cap)
    (loop,) = loops_of(image)
    assert mounts_at(stage_path) == [], "block staging attaches, it does not mount"

    publish_volume(csi, "blk-1", stage_path, target_path, cap)
    publish_volume(csi, "blk-1", stage_path, target_path, cap)
    (bound,) = mounts_at(target_path)
    assert bound.fstype == "devtmpfs" and bound.root == "/" + os.path.basename(loop)
    assert stat.S_ISBLK(os.stat(target_path).st_mode)
    with open(target_path, "r+b") as dev:
        dev.write(b"raw bytes")
    assert image.read_bytes()[:9] == b"raw bytes"

    unpublish_volume(csi, "blk-1", target_path)
    assert mounts_at(target_path) == [] and not os.path.exists(target_path)
    unstage_volume(csi, "blk-1", stage_path)
    unstage_volume(csi, "blk-1", stage_path)
    assert loops_of(image) == []
    _delete(csi, "blk-1")
    assert not image.exists()


def test_readonly_publish_and_two_targets(
    csi: CsiClients, staging: PathFor, target: PathFor
) -> None:
    create_volume(csi, "ro-1")
    stage_path, rw_path, ro_path = staging("ro-1"), target("writer"), target("reader")
    stage_volume(csi, "ro-1", stage_path)
    publish_volume(csi, "ro-1", stage_path, rw_path)
    publish_volume(csi, "ro-1", stage_path, ro_path, readonly=True)
    assert "ro" in mounts_at(ro_path)[0].options
    assert "rw" in mounts_at(rw_path)[0].options
    with pytest.raises(OSError) as err:
        Path(ro_path, "x").write_text("no")
    assert err.value.errno == errno.EROFS

    # Same target, other arguments: ALREADY_EXISTS.
    with pytest.raises(grpc.RpcError) as rpc_err:
        publish_volume(csi, "ro-1", stage_path, ro_path, readonly=False)
    assert rpc_err.value.code() == grpc.StatusCode.ALREADY_EXISTS

    # Unstage while published is refused; the mounts stay.
    with pytest.raises(grpc.RpcError) as rpc_err:
        unstage_volume(csi, "ro-1", stage_path)
    assert rpc_err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert mounts_at(stage_path)

    unpublish_volume(csi, "ro-1", ro_path)
    unpublish_volume(csi, "ro-1", rw_path)
    unstage_volume(csi, "ro-1", stage_path)


def test_single_writer_mode_allows_one_target(
    csi: CsiClients, staging: PathFor, target: PathFor
) -> None:
    create_volume(csi, "sw-1")
    cap = mount_capability(mode=Mode.SINGLE_NODE_SINGLE_WRITER)
    stage_path = staging("sw-1")
    stage_volume(csi, "sw-1", stage_path, cap)
    publish_volume(csi, "sw-1", stage_path, target("one"), cap)
    with pytest.raises(grpc.RpcError) as err:
        publish_volume(csi, "sw-1", stage_path, target("two"), cap)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert not os.path.exists(target("two"))
    unpublish_volume(csi, "sw-1", target("one"))
    unstage_volume(csi, "sw-1", stage_path)


def test_without_stage_capability(start_driver: StartDriver, tmp_path: Path) -> None:
    drv = start_driver("--no-stage")
    csi = drv.clients()
    create_volume(csi, "ns-1")
    image = drv.image("ns-1")
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()

    with pytest.raises(grpc.RpcError) as err:
        stage_volume(csi, "ns-1", str(one))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED

    publish_volume(csi, "ns-1", "", str(one / "mount"))
    publish_volume(csi, "ns-1", "", str(two / "mount"), readonly=True)
    (loop,) = loops_of(image)
    assert mounts_at(one / "mount")[0].source == loop
    assert "ro" in mounts_at(two / "mount")[0].options
    unpublish_volume(csi, "ns-1", str(one / "mount"))
    assert loops_of(image) == [loop], "still published at the second target"
    unpublish_volume(csi, "ns-1", str(two / "mount"))
    assert loops_of(image) == []
    assert not (one / "mount").exists() and not (two / "mount").exists()


def test_state_survives_restart(
    driver: DriverProcess, csi: CsiClients, staging: PathFor, target: PathFor
) -> None:
    create_volume(csi, "rs-1")
    stage_path, target_path = staging("rs-1"), target("pod-r")
    stage_volume(csi, "rs-1", stage_path)
    publish_volume(csi, "rs-1", stage_path, target_path)
    (loop,) = loops_of(driver.image("rs-1"))

    # Kill it hard and make its record lie about the loop device: the restarted
    # driver must find the real one with losetup -j.
    assert driver.proc is not None
    driver.proc.kill()
    driver.wait_exit()
    record_path = driver.state_dir / "volumes" / "rs-1.json"
    record = json.loads(record_path.read_text())
    assert record["loop_device"] == loop
    record["loop_device"] = "/dev/loop-bogus"
    record_path.write_text(json.dumps(record))

    driver.restart()
    csi = driver.clients()
    assert json.loads(record_path.read_text())["loop_device"] == loop
    # Same arguments still OK, other arguments still refused: the records came back.
    publish_volume(csi, "rs-1", stage_path, target_path)
    with pytest.raises(grpc.RpcError) as err:
        publish_volume(csi, "rs-1", stage_path, target_path, readonly=True)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    unpublish_volume(csi, "rs-1", target_path)
    unstage_volume(csi, "rs-1", stage_path)
    assert loops_of(driver.image("rs-1")) == []


def test_volume_mount_group(start_driver: StartDriver, tmp_path: Path) -> None:
    drv = start_driver("--volume-mount-group")
    csi = drv.clients()
    create_volume(csi, "grp-1")
    stage_path = tmp_path / "stage"
    stage_path.mkdir()
    stage_volume(csi, "grp-1", str(stage_path), mount_capability(volume_mount_group="4321"))
    st = os.stat(stage_path)
    assert st.st_gid == 4321 and st.st_mode & 0o2070 == 0o2070
    unstage_volume(csi, "grp-1", str(stage_path))

"""Pods through the volume engine onto volfsm's CSI driver: mounts as the kubelet makes them.

Each test applies PV / PVC / Pod objects to a `VolumeEngine` whose CSI
plugin talks to the driver process over its unix socket, checks the mounts
in /proc/self/mountinfo and the driver's own record of its calls, deletes
the pods and checks that nothing is left: no mount, no loop device, no
directory or vol_data.json, nothing staged or published in the driver.
"""

from __future__ import annotations

import os
import stat

from events.types import DeviceMounted, VolumeMounted
from tests.enginecsi.conftest import Stack
from tests.enginecsi.helpers import (
    DRIVER,
    assert_nothing_left,
    bodies,
    claimed_volume,
    delete_and_wait,
    device_events,
    device_state,
    only_loop,
    pod,
    podvol_events,
    rdev,
    started,
)
from tests.helpers.csidriver import create_volume, loops_of, mounts_at

MIB = 1 << 20


def _new_volume(stack: Stack, handle: str, *, block: bool = False) -> None:
    assert stack.driver is not None
    create_volume(stack.driver.clients(), handle, 32 * MIB, block=block)


async def test_filesystem_volume_lifecycle(stack: Stack) -> None:
    drv, layout, engine = stack.driver, stack.layout, stack.engine
    assert drv is not None
    _new_volume(stack, "fs1")
    await engine.apply([*claimed_volume("pv-fs1", "fs1"), pod("pod-a", "pv-fs1")])
    status = await engine.wait_pod("pod-a", "mounted", timeout=120)
    assert status is not None and status.phase == "Mounted"

    staging = layout.csi_staging_path(DRIVER, "fs1")
    target = layout.csi_publish_path("pod-a", "pv-fs1")
    loop = only_loop(drv, "fs1")
    [staged] = mounts_at(staging)
    [published] = mounts_at(target)
    assert (staged.fstype, staged.source) == ("ext4", loop)
    assert (published.fstype, published.source) == ("ext4", loop)  # the bind of the staging
    assert os.stat(staging).st_dev == os.stat(target).st_dev == rdev(loop)
    assert (staging.parent / "vol_data.json").is_file()
    assert (target.parent / "vol_data.json").is_file()
    assert status.volumes[0].mount_path == str(target)
    assert [b.mount_found for b in bodies(stack.log, DeviceMounted)] == [True]
    assert [b.mount_found for b in bodies(stack.log, VolumeMounted)] == [True]
    assert device_events(stack.log, "fs1") == ["DeviceAttached", "VolumeResized", "DeviceMounted"]
    assert podvol_events(stack.log, "pod-a") == ["VolumeMounted"]
    (target / "hello.txt").write_text("written by pod-a")

    await delete_and_wait(engine, ["pod-a"], ["fs1"])
    assert_nothing_left(drv, layout, ["fs1"])
    assert device_events(stack.log, "fs1") == [
        "DeviceAttached",
        "VolumeResized",  # the PV's size, recorded at attach (kubelet InitializeClaimSize)
        "DeviceMounted",
        "DeviceUnmounted",
        "DeviceDetached",
    ]
    assert podvol_events(stack.log, "pod-a") == ["VolumeMounted", "VolumeUnmounted"]
    for rpc in ("NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume"):
        assert drv.codes(rpc, "fs1") == ["OK"], rpc
    assert drv.codes("NodeUnstageVolume", "fs1") == ["OK"]

    # The data is on the volume, not on the node: a new pod sees it.
    await engine.apply([pod("pod-b", "pv-fs1")])
    await engine.wait_pod("pod-b", "mounted", timeout=120)
    again = layout.csi_publish_path("pod-b", "pv-fs1")
    assert (again / "hello.txt").read_text() == "written by pod-a"
    await delete_and_wait(engine, ["pod-b"], ["fs1"])
    assert_nothing_left(drv, layout, ["fs1"])


async def test_block_volume_lifecycle(stack: Stack) -> None:
    drv, layout, engine = stack.driver, stack.layout, stack.engine
    assert drv is not None
    _new_volume(stack, "blk1", block=True)
    objects = [*claimed_volume("pv-blk1", "blk1", mode="Block"), pod("pod-a", "pv-blk1")]
    await engine.apply(objects)
    await engine.wait_pod("pod-a", "mounted", timeout=120)

    loop = only_loop(drv, "blk1")
    device = rdev(loop)
    staging = layout.csi_block_staging_path("pv-blk1")
    publish = layout.csi_block_publish_path("pv-blk1", "pod-a")
    global_map = layout.csi_block_global_map_path("pv-blk1") / "pod-a"
    link = layout.csi_block_pod_device_path("pod-a", "pv-blk1")
    assert staging.is_dir() and mounts_at(staging) == []  # block stage attaches, mounts nothing
    for path in (publish, global_map):  # the device node bound onto a file, twice
        [bound] = mounts_at(path)
        assert bound.root == "/" + os.path.basename(loop), bound
        assert rdev(path) == device
    assert stat.S_ISLNK(os.lstat(link).st_mode) and rdev(link) == device
    lock = loops_of(global_map)
    assert len(lock) == 1, f"the global map file should hold one lock loop device: {lock}"
    assert (layout.csi_block_dir("pv-blk1") / "data" / "vol_data.json").is_file()
    with open(link, "rb") as dev:  # the pod's device is the volume's
        assert len(dev.read(4096)) == 4096
    assert podvol_events(stack.log, "pod-a") == ["VolumeMounted"]
    assert [op.operation for op in started(stack.log, "map_volume")] == ["map_volume"]

    await delete_and_wait(engine, ["pod-a"], ["blk1"])
    assert_nothing_left(drv, layout, ["blk1"])
    assert [op.operation for op in started(stack.log, "unmap_device")] == ["unmap_device"]
    for rpc in ("NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume"):
        assert drv.codes(rpc, "blk1") == ["OK"], rpc
    assert drv.codes("NodeUnstageVolume", "blk1") == ["OK"]


async def test_two_pods_on_one_volume_share_one_stage(stack: Stack) -> None:
    drv, layout, engine = stack.driver, stack.layout, stack.engine
    assert drv is not None
    _new_volume(stack, "shared")
    await engine.apply([*claimed_volume("pv-shared", "shared"), pod("pod-a", "pv-shared")])
    await engine.apply([pod("pod-b", "pv-shared")])
    await engine.wait_pod("pod-a", "mounted", timeout=120)
    await engine.wait_pod("pod-b", "mounted", timeout=120)

    staging = layout.csi_staging_path(DRIVER, "shared")
    target_a = layout.csi_publish_path("pod-a", "pv-shared")
    target_b = layout.csi_publish_path("pod-b", "pv-shared")
    assert drv.codes("NodeStageVolume", "shared") == ["OK"]
    assert drv.codes("NodePublishVolume", "shared") == ["OK", "OK"]
    assert [op.operation for op in started(stack.log, "volume_mount")] == ["volume_mount"] * 2
    assert device_events(stack.log, "shared").count("DeviceMounted") == 1
    assert len(mounts_at(staging)) == len(mounts_at(target_a)) == len(mounts_at(target_b)) == 1
    (target_a / "from-a").write_text("a")
    assert (target_b / "from-a").read_text() == "a"  # one filesystem

    await delete_and_wait(engine, ["pod-a"], [])
    assert drv.codes("NodeUnpublishVolume", "shared") == ["OK"]
    assert drv.calls("NodeUnstageVolume", "shared", event="start") == []
    assert device_state(engine, "shared") == "DeviceGloballyMounted"
    assert len(mounts_at(staging)) == 1 and len(mounts_at(target_b)) == 1
    assert mounts_at(target_a) == [] and not target_a.parent.exists()
    assert (target_b / "from-a").read_text() == "a"

    await delete_and_wait(engine, ["pod-b"], ["shared"])
    assert drv.codes("NodeUnpublishVolume", "shared") == ["OK", "OK"]
    assert drv.codes("NodeUnstageVolume", "shared") == ["OK"]
    assert_nothing_left(drv, layout, ["shared"])

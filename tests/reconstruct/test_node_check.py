"""The log's beliefs against the node: what the node confirms stays, what it lacks is Uncertain."""

from __future__ import annotations

import shutil
from pathlib import Path

from events.types import DeviceMounted, VolumeMounted
from tests.engine.objects import claim_volume, empty_dir_volume, pod, pv_set, volume_id_of
from tests.enginecsi.helpers import pv as csi_block_pv
from tests.enginecsi.helpers import pvc as csi_block_pvc
from tests.helpers.csidriver import DriverProcess, create_volume, mounts_at
from volfsm.desired.resolve import csi_volume_id
from volfsm.node import blockmap, mounts
from volfsm.plugins.scripted import ScriptedPlugin

from .conftest import CSI_DRIVER, GATED, Node
from .test_log_lost import csi_pod, csi_pv

EMPTY = "kubernetes.io~empty-dir"
MIB = 1 << 20


async def test_mounts_the_node_confirms_stay_mounted_and_nothing_is_recorded(node: Node) -> None:
    first = await node.start()
    await first.apply([pod("u1", empty_dir_volume("mem", medium="Memory"), empty_dir_volume("d"))])
    await first.wait_pod("u1", "mounted", timeout=30)
    await first.settle()
    last_seq = first.asw.last_seq
    await node.stop()

    second = await node.start()
    await second.settle()

    assert second.reconstruction is not None
    assert second.reconstruction.uncertain == [] and second.reconstruction.orphans == []
    assert {pv.state for pv in second.asw.podvols.values()} == {"Mounted"}
    assert second.pod_is("u1", "mounted")
    assert second.asw.last_seq == last_seq  # nothing recorded: no mark, no remount
    assert second.reconciler.passes > 0 and second.executor.started == 0


async def test_emptydir_mounts_and_dirs_the_node_lost_are_uncertain_then_mounted_again(
    node: Node,
) -> None:
    # Arrange: a tmpfs and a plain emptyDir; while the service is down the tmpfs goes
    # (a reboot) and the plain dir is removed
    first = await node.start()
    await first.apply([pod("u1", empty_dir_volume("mem", medium="Memory"), empty_dir_volume("d"))])
    await first.wait_pod("u1", "mounted", timeout=30)
    await node.stop()
    mem = node.layout.pod_volume_dir("u1", EMPTY, "mem")
    disk = node.layout.pod_volume_dir("u1", EMPTY, "d")
    mounts.umount(mem)
    shutil.rmtree(disk)

    # Act: start again, desired state not complete (mounts still run)
    second = await node.start(GATED)

    # Assert: both Uncertain, each with what the node lacks
    reasons = {name: second.asw.podvols[("u1", name)].reason for name in ("mem", "d")}
    assert reasons["mem"] == (
        f"the log says Mounted (emptyDir tmpfs) at {mem}, but /proc/self/mountinfo has no"
        " mount there"
    )
    assert reasons["d"] == f"the log says Mounted at {disk}, but it does not exist on the node"
    assert all(pv.reconstructed for pv in second.asw.podvols.values())

    # Assert: the pod is still desired: both are mounted again
    await second.wait_pod("u1", "mounted", timeout=30)
    assert mounts.find_mount(mem) is not None and disk.is_dir()


async def test_a_csi_volume_whose_mounts_vanished_is_staged_and_published_again(
    node: Node, driver: DriverProcess
) -> None:
    # Arrange: mounted through the driver; while down, both mounts are unmounted
    create_volume(driver.clients(), "vol-a", 32 * MIB)
    first = await node.start(driver=driver)
    await first.apply([*csi_pv("pv-a", "vol-a"), csi_pod("pa", "pv-a", "data")])
    await first.wait_pod("pa", "mounted", timeout=120)
    await node.stop()
    staging = node.layout.csi_staging_path(CSI_DRIVER, "vol-a")
    target = node.layout.csi_publish_path("pa", "pv-a")
    mounts.umount(target)
    mounts.umount(staging)

    # Act
    second = await node.start(GATED, driver=driver)

    # Assert: the device and the pod-volume are Uncertain, naming where the mount was seen
    assert node.log is not None
    vid = csi_volume_id(CSI_DRIVER, "vol-a")
    staged_at = [e.seq for e in node.log.read_after(0) if isinstance(e.body, DeviceMounted)]
    published_at = [e.seq for e in node.log.read_after(0) if isinstance(e.body, VolumeMounted)]
    assert second.asw.devices[vid].reason == (
        f"the log says staged at {staging} (mounted there at seq {staged_at[0]}), but"
        " /proc/self/mountinfo has no mount there"
    )
    assert second.asw.podvols[("pa", "data")].reason == (
        f"the log says Mounted at {target} (mounted there at seq {published_at[0]}), but"
        " /proc/self/mountinfo has no mount there"
    )

    # Assert: staged and published again
    await second.wait_pod("pa", "mounted", timeout=120)
    assert len(mounts_at(staging)) == 1 and len(mounts_at(target)) == 1
    assert driver.codes("NodeStageVolume", "vol-a") == ["OK", "OK"]
    assert second.asw.devices[vid].state == "DeviceGloballyMounted"


async def test_a_block_volume_whose_device_bind_vanished_is_mapped_again(
    node: Node, scripted: ScriptedPlugin
) -> None:
    # Arrange: a block volume mapped for a pod (a real loop device bound on the global map
    # file); while down, the bind mount goes
    block = ScriptedPlugin(driver=scripted.driver, block=True)
    first = await node.start(scripted=block)
    await first.apply([*pv_set("v1", mode="Block"), pod("u1", claim_volume("data", "v1"))])
    await first.wait_pod("u1", "mounted", timeout=30)
    dev = first.asw.devices[volume_id_of("v1")]
    bind = Path(dev.device_mount_path) / "u1"
    assert mounts.find_mount(bind) is not None
    await node.stop()
    blockmap.detach_lock(bind)  # the fd-lock loop device, then the bind itself
    mounts.umount(bind)

    # Act
    second = await node.start(GATED, scripted=block)

    # Assert: Uncertain with what is missing, then mapped again
    assert second.asw.podvols[("u1", "data")].reason == (
        f"the log says the block device is mapped for the pod, but {bind} has no device"
        " bind-mounted on it"
    )
    await second.wait_pod("u1", "mounted", timeout=30)
    assert mounts.find_mount(bind) is not None


async def test_a_csi_block_volume_whose_publish_bind_vanished_is_published_again(
    node: Node, driver: DriverProcess
) -> None:
    # Arrange: a block volume published by the driver (device bound on the publish file)
    # and mapped for a pod; while down, the driver's publish bind goes, the map stays
    create_volume(driver.clients(), "blk-a", 32 * MIB, block=True)
    first = await node.start(driver=driver)
    objects = [
        csi_block_pv("pv-b", "blk-a", mode="Block"),
        csi_block_pvc("pv-b", "pv-b", mode="Block"),
    ]
    await first.apply([*objects, csi_pod("pb", "pv-b", "data")])
    await first.wait_pod("pb", "mounted", timeout=120)
    await node.stop()
    publish = node.layout.csi_block_publish_path("pv-b", "pb")
    global_map = node.layout.csi_block_global_map_path("pv-b") / "pb"
    mounts.umount(publish)

    # Act
    second = await node.start(GATED, driver=driver)

    # Assert: the map alone does not vouch for the publish: Uncertain, naming the path and
    # the event that saw the bind
    assert node.log is not None
    published_at = [e.seq for e in node.log.read_after(0) if isinstance(e.body, VolumeMounted)]
    pv = second.asw.podvols[("pb", "data")]
    assert pv.reason == (
        f"the log says the block device is published for the pod at {publish} (bound there"
        f" at seq {published_at[0]}), but /proc/self/mountinfo has no mount there"
    )
    assert pv.reconstructed

    # Assert: published again (one more NodePublish), the map kept, nothing staged twice
    await second.wait_pod("pb", "mounted", timeout=120)
    assert len(mounts_at(publish)) == 1 and len(mounts_at(global_map)) == 1
    assert driver.codes("NodePublishVolume", "blk-a") == ["OK", "OK"]
    assert driver.codes("NodeStageVolume", "blk-a") == ["OK"]

"""Expansion during mount: a volume grown while no pod on the node used it.

The PV says the new size, the claim's status.capacity still the old one: the
first mount calls NodeExpandVolume once (right after NodeStage for a
filesystem, after the publish for a block volume) before the pod counts as
Mounted. One driver serves the module (each test uses its own volume).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from events.log import EventLog
from events.streams import device_stream, podvol_stream
from events.types import OperationStarted, OperationSucceeded, VolumeMounted, VolumeResized
from tests.enginecsi.conftest import MakeStack
from tests.enginecsi.helpers import (
    MIB,
    assert_nothing_left,
    bodies,
    delete_and_wait,
    pod,
    pv,
    pvc,
    volume_id,
)
from tests.helpers.csidriver import DriverProcess, cleanup_under, create_volume, expand_volume

NODE_RPCS = ("NodeStageVolume", "NodePublishVolume", "NodeExpandVolume")


@pytest.fixture(scope="module")
def shared_driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DriverProcess]:
    """One driver for the module; stopped, and everything under it cleaned, at its end."""
    drv = DriverProcess(tmp_path_factory.mktemp("expand-driver"))
    try:
        yield drv.start()
    finally:
        drv.close()
        cleanup_under(drv.workdir)


def claimed(handle: str, *, pv_size: str, claim_size: str, mode: str = "Filesystem") -> list[Any]:
    """PV pv-`handle` of `pv_size` and its claim, whose status.capacity is `claim_size`."""
    claim = pvc(f"pv-{handle}", f"pv-{handle}", mode=mode)
    claim["status"]["capacity"] = {"storage": claim_size}
    return [pv(f"pv-{handle}", handle, size=pv_size, mode=mode), claim]


def node_rpcs(drv: DriverProcess, handle: str) -> list[str]:
    """The driver's stage / publish / expand calls for a volume, in order."""
    return [c["rpc"] for c in drv.calls(volume_id=handle) if c["rpc"] in NODE_RPCS]


def fs_bytes(path: Path) -> int:
    """Size of the filesystem mounted at path, as the pod sees it."""
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def device_bytes(path: Path) -> int:
    """Size of the block device the pod's device file opens."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def expanded_before_mounted(log: EventLog, handle: str, uid: str) -> bool:
    """The expansion's OperationSucceeded comes before the pod's VolumeMounted."""
    envs = list(log.read_after(0))
    [start] = [
        e.body
        for e in envs
        if isinstance(e.body, OperationStarted) and e.body.operation == "volume_fs_resize"
    ]
    done = next(
        e.seq
        for e in envs
        if isinstance(e.body, OperationSucceeded)
        and e.body.op_id == start.op_id
        and e.stream == device_stream(volume_id(handle))
    )
    mounted = next(
        e.seq
        for e in envs
        if isinstance(e.body, VolumeMounted) and e.stream == podvol_stream(uid, "data")
    )
    return done < mounted


def expansion_reasons(log: EventLog) -> list[str]:
    """Why each volume_fs_resize started."""
    return [b.reason for b in bodies(log, OperationStarted) if b.operation == "volume_fs_resize"]


async def test_offline_growth_of_a_filesystem_is_expanded_right_after_stage(
    shared_driver: DriverProcess, make_stack: MakeStack
) -> None:
    drv = shared_driver
    create_volume(drv.clients(), "off-fs", 64 * MIB)
    stack = await make_stack(drv)
    engine, log, layout = stack.engine, stack.log, stack.layout
    # Arrange: the filesystem made at 64Mi by a first pod, then nobody uses the volume
    await engine.apply(
        [*claimed("off-fs", pv_size="64Mi", claim_size="64Mi"), pod("a", "pv-off-fs")]
    )
    await engine.wait_pod("a", "mounted", timeout=120)
    before = fs_bytes(layout.csi_publish_path("a", "pv-off-fs"))
    (layout.csi_publish_path("a", "pv-off-fs") / "kept.txt").write_text("written at 64Mi")
    await delete_and_wait(engine, ["a"], ["off-fs"])
    assert expand_volume(drv.clients(), "off-fs", 128 * MIB) == 128 * MIB  # the resizer's part

    # Act: the PV says 128Mi, the claim's status still 64Mi
    grown = claimed("off-fs", pv_size="128Mi", claim_size="64Mi")
    await engine.apply([*grown, pod("b", "pv-off-fs")])
    await engine.wait_pod("b", "mounted", timeout=120)
    await engine.settle(timeout=60)

    # Assert: one NodeExpandVolume, between stage and publish, before b counts as Mounted
    assert node_rpcs(drv, "off-fs") == [
        "NodeStageVolume",  # a (claim status = PV: nothing to expand)
        "NodePublishVolume",
        "NodeStageVolume",  # b
        "NodeExpandVolume",
        "NodePublishVolume",
    ]
    assert drv.codes("NodeExpandVolume", "off-fs") == ["OK"]
    assert expanded_before_mounted(log, "off-fs", "b")
    assert expansion_reasons(log) == [
        "expand during mount (after stage): claim status 64Mi < PV 128Mi"
    ]
    vid = volume_id("off-fs")
    sizes = [b.size_bytes for b in bodies(log, VolumeResized, device_stream(vid))]
    assert sizes == [64 * MIB, 64 * MIB, 128 * MIB]  # a's attach, b's attach, b's expansion
    target = layout.csi_publish_path("b", "pv-off-fs")
    after = fs_bytes(target)
    assert after > before + 48 * MIB and after <= 128 * MIB, (before, after)
    assert (target / "kept.txt").read_text() == "written at 64Mi"

    await delete_and_wait(engine, ["b"], ["off-fs"])
    assert_nothing_left(drv, layout, ["off-fs"])


async def test_offline_growth_of_a_block_volume_is_expanded_after_publish(
    shared_driver: DriverProcess, make_stack: MakeStack
) -> None:
    drv = shared_driver
    create_volume(drv.clients(), "off-blk", 64 * MIB, block=True)
    assert expand_volume(drv.clients(), "off-blk", 128 * MIB) == 128 * MIB
    stack = await make_stack(drv)
    engine, log, layout = stack.engine, stack.log, stack.layout

    objects = claimed("off-blk", pv_size="128Mi", claim_size="64Mi", mode="Block")
    await engine.apply([*objects, pod("c", "pv-off-blk")])
    await engine.wait_pod("c", "mounted", timeout=120)
    await engine.settle(timeout=60)

    assert node_rpcs(drv, "off-blk") == ["NodeStageVolume", "NodePublishVolume", "NodeExpandVolume"]
    assert drv.codes("NodeExpandVolume", "off-blk") == ["OK"]
    assert expanded_before_mounted(log, "off-blk", "c")
    assert expansion_reasons(log) == [
        "expand during mount (after publish): claim status 64Mi < PV 128Mi"
    ]
    assert device_bytes(layout.csi_block_pod_device_path("c", "pv-off-blk")) == 128 * MIB
    assert stack.engine.asw.devices[volume_id("off-blk")].size_bytes == 128 * MIB

    await delete_and_wait(engine, ["c"], ["off-blk"])
    assert_nothing_left(drv, layout, ["off-blk"])


async def test_claim_status_equal_to_the_pv_is_not_expanded(
    shared_driver: DriverProcess, make_stack: MakeStack
) -> None:
    drv = shared_driver
    create_volume(drv.clients(), "same-blk", 64 * MIB, block=True)
    stack = await make_stack(drv)
    engine, log, layout = stack.engine, stack.log, stack.layout

    objects = claimed("same-blk", pv_size="64Mi", claim_size="64Mi", mode="Block")
    await engine.apply([*objects, pod("d", "pv-same-blk")])
    await engine.wait_pod("d", "mounted", timeout=120)
    await engine.settle(timeout=60)

    assert node_rpcs(drv, "same-blk") == ["NodeStageVolume", "NodePublishVolume"]
    assert expansion_reasons(log) == []
    assert stack.engine.asw.devices[volume_id("same-blk")].size_bytes == 64 * MIB

    await delete_and_wait(engine, ["d"], ["same-blk"])
    assert_nothing_left(drv, layout, ["same-blk"])

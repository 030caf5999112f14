"""Teardown and unstage failures, shared devices, ordering, and operations that block unstage."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from volfsm.engine import VolumeEngine
from volfsm.node import mounts
from volfsm.plugins.scripted import Outcome, ScriptedPlugin, final, nonfinal, ok, timeout, transient

from .conftest import FAST, EngineFactory
from .helpers import (
    device_state,
    device_transitions,
    eventually,
    failures,
    operations,
    podvol_state,
    podvol_transitions,
)
from .objects import claim_volume, pod, pv_set, volume_id_of

V1 = volume_id_of("v1")


async def _mounted(
    make_engine: EngineFactory, plugin: ScriptedPlugin, *uids: str, **kw: object
) -> VolumeEngine:
    engine = await make_engine(plugin, **kw)
    await engine.apply([*pv_set("v1"), *(pod(u, claim_volume("data", "v1")) for u in uids)])
    for uid in uids:
        await engine.wait_pod(uid, "mounted", timeout=5)
    return engine


# ------------------------------------------------------------------ teardown


async def test_teardown_failure_marks_uncertain_and_is_retried_until_unmounted(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    plugin.script("tear_down", final("Internal"), timeout())
    engine = await _mounted(make_engine, plugin, "u1")
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=5)
    await eventually(lambda: V1 not in engine.asw.devices, "device detached")
    assert podvol_transitions(engine.log, "u1", "data") == [
        "VolumeMounted",
        "VolumeMountUncertain",
        "VolumeUnmounted",
    ]
    assert plugin.calls("tear_down") == 3
    # the device was unstaged only after the last teardown succeeded
    calls = plugin.methods_called()
    assert calls.index("unmount_device") > len(calls) - 3


async def test_teardown_error_before_the_driver_leaves_the_pod_volume_mounted(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    gate = asyncio.Event()
    plugin.script("tear_down", transient("Unavailable"), ok(gate=gate))
    engine = await _mounted(make_engine, plugin, "u1")
    await engine.delete_pod(uid="u1")
    await eventually(lambda: plugin.calls("tear_down") == 2, "second teardown")
    assert podvol_state(engine, "u1", "data") == "Mounted"
    gate.set()
    await engine.wait_pod("u1", "unmounted", timeout=5)
    assert podvol_transitions(engine.log, "u1", "data") == ["VolumeMounted", "VolumeUnmounted"]


SLOW_RETRY = dataclasses.replace(FAST, backoff_initial=60.0, backoff_max=60.0)


@pytest.mark.parametrize("failure", [final("Internal"), timeout()], ids=["final", "timeout"])
async def test_unstage_failure_marks_the_device_uncertain_and_a_new_pod_stages_it_again(
    make_engine: EngineFactory, failure: Outcome
) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    plugin.script("unmount_device", failure)
    engine = await _mounted(make_engine, plugin, "u1", config=SLOW_RETRY)
    await engine.delete_pod(uid="u1")
    await eventually(lambda: bool(failures(engine.log, "unmount_device")), "unstage failed")
    assert device_state(engine, V1) == "Uncertain"
    assert failures(engine.log, "unmount_device")[0].backoff_s == 60.0
    await engine.apply([pod("u2", claim_volume("data", "v1"))])
    await engine.wait_pod("u2", "mounted", timeout=5)
    assert plugin.calls("mount_device") == 2  # Uncertain is not GloballyMounted: stage again
    assert device_transitions(engine.log, V1) == [
        "DeviceAttached",
        "DeviceMounted",
        "DeviceMountUncertain",
        "DeviceMounted",
    ]


async def test_device_still_open_after_unstage_marks_it_uncertain_and_unstage_is_retried(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    plugin.script("device_still_open", ok(True))
    engine = await _mounted(make_engine, plugin, "u1")
    await engine.delete_pod(uid="u1")
    await eventually(lambda: V1 not in engine.asw.devices, "device detached")
    assert device_transitions(engine.log, V1) == [
        "DeviceAttached",
        "DeviceMounted",
        "DeviceMountUncertain",
        "DeviceUnmounted",
        "DeviceDetached",
    ]
    assert [f.code for f in failures(engine.log)] == ["DeviceStillOpen"]
    assert plugin.calls("unmount_device") == 2


async def test_unstage_is_refused_while_other_mount_references_exist(
    make_engine: EngineFactory, root: Path
) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    engine = await _mounted(make_engine, plugin, "u1")
    staging = Path(engine.asw.devices[V1].device_mount_path)
    leaked = root / "leaked-reference"
    leaked.mkdir()
    mounts.mount_tmpfs(staging, 1 << 20)
    mounts.bind_mount(str(staging), str(leaked))  # e.g. a mount leaked into another place
    try:
        await engine.delete_pod(uid="u1")
        await engine.wait_pod("u1", "unmounted", timeout=5)
        await eventually(lambda: len(failures(engine.log, "unmount_device")) >= 2, "refusals")
        refused = failures(engine.log, "unmount_device")
        assert refused[0].code == "MountRefsExist" and str(leaked) in refused[0].message
        assert device_state(engine, V1) == "DeviceGloballyMounted"  # no state change
        assert plugin.calls("unmount_device") == 0
    finally:
        mounts.umount(leaked)
        mounts.umount(staging)
    await eventually(lambda: V1 not in engine.asw.devices, "device detached")
    assert plugin.calls("unmount_device") == 1


# ------------------------------------------------------------------- sharing


async def test_two_pods_share_one_staged_device_and_it_is_unstaged_after_the_last(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(attachable=True, device_mountable=True)
    engine = await _mounted(make_engine, plugin, "u1", "u2")
    assert plugin.calls("mount_device") == 1 and plugin.calls("set_up") == 2
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=5)
    await engine.settle()
    assert plugin.calls("unmount_device") == 0
    assert device_state(engine, V1) == "DeviceGloballyMounted"
    assert podvol_state(engine, "u2", "data") == "Mounted"
    await engine.delete_pod(uid="u2")
    await eventually(lambda: V1 not in engine.asw.devices, "device detached")
    assert plugin.calls("unmount_device") == 1
    assert plugin.methods_called()[-3:] == ["tear_down", "unmount_device", "device_still_open"]


async def test_mounts_of_an_attachable_volume_are_serialised_across_pods(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(attachable=True, device_mountable=True)
    gate = asyncio.Event()
    plugin.script("set_up", ok(gate=gate))
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await eventually(lambda: plugin.calls("set_up") == 1, "u1 publishing")
    await engine.apply([pod("u2", claim_volume("data", "v1"))])
    await eventually(lambda: engine.executor.refused > 0, "u2's mount refused")
    assert plugin.calls("set_up") == 1  # u2 waits: the volume's key is held by u1's mount
    gate.set()
    await engine.wait_pod("u2", "mounted", timeout=5)
    assert plugin.calls("mount_device") == 1


async def test_mounts_of_a_plain_plugin_volume_run_in_parallel_across_pods(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    gate = asyncio.Event()
    plugin.script("set_up", ok(gate=gate))
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await eventually(lambda: plugin.calls("set_up") == 1, "u1 publishing")
    await engine.apply([pod("u2", claim_volume("data", "v1"))])
    await engine.wait_pod("u2", "mounted", timeout=5)  # keyed per pod: not blocked by u1
    assert podvol_state(engine, "u1", "data") == "Unmounted"
    gate.set()
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert device_transitions(engine.log, V1) == ["DeviceAttached"]


async def test_unmount_of_the_old_pod_starts_before_the_mount_of_its_replacement(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(attachable=True, device_mountable=True)
    engine = await _mounted(make_engine, plugin, "u1")
    await engine.apply([pod("u2", claim_volume("data", "v1"), name="pod-u1")])  # same name
    await engine.wait_pod("u2", "mounted", timeout=5)
    await engine.wait_pod("u1", "unmounted", timeout=5)
    assert operations(engine.log) == [
        ("volume_mount", "podvol/u1/data"),
        ("volume_unmount", "podvol/u1/data"),  # same pass: unmounts are started first
        ("volume_mount", "podvol/u2/data"),  # refused until the unmount released the volume
    ]
    assert plugin.calls("unmount_device") == 0  # still desired by u2: never unstaged
    assert plugin.calls("mount_device") == 1


async def test_a_running_operation_on_the_volume_blocks_its_unstage(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    gate = asyncio.Event()
    plugin.script("set_up", ok(gate=gate))
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await eventually(lambda: plugin.calls("set_up") == 1, "publishing")
    await engine.delete_pod(uid="u1")  # nobody holds or wants v1 now, but its mount runs
    passes = engine.reconciler.passes
    await eventually(lambda: engine.reconciler.passes > passes + 3, "a few passes")
    engine.reconciler.full_pass()
    assert engine.pending.is_operation_pending(V1)
    assert plugin.calls("unmount_device") == 0
    assert device_state(engine, V1) == "DeviceGloballyMounted"
    gate.set()  # the mount finishes (Mounted), then the pod's volume is torn down, then unstaged
    await eventually(lambda: V1 not in engine.asw.devices, "device detached")
    assert plugin.methods_called() == [
        "mount_device",
        "set_up",
        "tear_down",
        "unmount_device",
        "device_still_open",
    ]
    assert podvol_transitions(engine.log, "u1", "data") == ["VolumeMounted", "VolumeUnmounted"]
    # the deleted pod's spec was kept until it was torn down, and is dropped after
    await eventually(lambda: not engine.index.removed_pods, "pod spec dropped")


async def test_unmap_failure_marks_the_block_pod_volume_uncertain(
    make_engine: EngineFactory, root: Path
) -> None:
    plugin = ScriptedPlugin(device_mountable=True, block=True)
    plugin.script("tear_down", nonfinal("Unavailable"))
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("b1", mode="Block"), pod("u1", claim_volume("disk", "b1"))])
    await engine.wait_pod("u1", "mounted", timeout=10)
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=10)
    vid = volume_id_of("b1")
    await eventually(lambda: vid not in engine.asw.devices, "block device detached")
    assert podvol_transitions(engine.log, "u1", "disk") == [
        "VolumeMounted",
        "VolumeMountUncertain",
        "VolumeUnmounted",
    ]
    assert not mounts.mounts_under(root)

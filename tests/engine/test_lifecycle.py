"""Full lifecycles per plugin kind (attachable, device-mountable, plain; filesystem and block),
and the idle case."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from events.streams import device_stream, podvol_stream
from tests.helpers.logcheck import assert_log_matches
from volfsm.node import mounts
from volfsm.plugins.scripted import ScriptedPlugin

from .conftest import EngineFactory
from .helpers import (
    device_state,
    device_transitions,
    eventually,
    operations,
    podvol_state,
    podvol_transitions,
    types_of,
)
from .objects import claim_volume, inline_csi_volume, pod, pv_set, volume_id_of

V1 = volume_id_of("v1")


async def test_idle_engine_starts_nothing_and_records_nothing(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.settle()
    seq, started, calls = engine.log.last_seq(), engine.executor.started, len(plugin.call_log)
    passes = engine.reconciler.passes
    await eventually(lambda: engine.reconciler.passes > passes + 5, "more reconcile passes")
    engine.reconciler.full_pass()  # a full pass over everything finds nothing to do either
    await engine.settle()
    assert engine.log.last_seq() == seq
    assert engine.executor.started == started
    assert len(plugin.call_log) == calls
    assert engine.reconciler.last_stats.started == 0


async def test_attachable_device_mountable_volume_lives_and_dies_in_kubelet_order(
    make_engine: EngineFactory, root: Path
) -> None:
    plugin = ScriptedPlugin(attachable=True, device_mountable=True)
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    status = await engine.wait_pod("u1", "mounted", timeout=5)
    assert status is not None and status.phase == "Mounted"
    dev = engine.asw.devices[V1]
    assert dev.state == "DeviceGloballyMounted" and dev.attachable
    staging = Path(dev.device_mount_path)
    assert staging.is_dir() and staging.is_relative_to(root)
    publish = root / "pods/u1/volumes/kubernetes.io~csi/data/mount"
    assert publish.is_dir()

    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=5)
    await eventually(lambda: V1 not in engine.asw.devices, "device detached")
    await engine.settle()
    await engine.reconciler.wait_cleanup()
    assert plugin.methods_called() == [
        "wait_for_attach",
        "mount_device",
        "set_up",
        "tear_down",
        "unmount_device",
        "device_still_open",
    ]
    assert device_transitions(engine.log, V1) == [
        "DeviceAttached",
        "DeviceMounted",
        "DeviceUnmounted",
        "DeviceDetached",
    ]
    assert podvol_transitions(engine.log, "u1", "data") == ["VolumeMounted", "VolumeUnmounted"]
    assert not staging.exists() and not publish.exists()
    assert not (root / "pods/u1").exists()


async def test_device_mountable_volume_is_staged_without_waiting_for_attach(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert not engine.asw.devices[V1].attachable
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=5)
    await eventually(lambda: V1 not in engine.asw.devices, "device detached")
    assert plugin.calls("wait_for_attach") == 0
    assert plugin.calls("mount_device") == 1 and plugin.calls("unmount_device") == 1


async def test_plain_plugin_publishes_per_pod_without_stage(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert device_state(engine, V1) == "Attached"  # never staged
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=5)
    await eventually(lambda: V1 not in engine.asw.devices, "device detached")
    assert plugin.methods_called() == ["set_up", "tear_down"]
    assert device_transitions(engine.log, V1) == ["DeviceAttached", "DeviceDetached"]
    # a plain plugin's mount is keyed per pod: its operation records sit on the podvol stream
    assert operations(engine.log) == [
        ("volume_mount", podvol_stream("u1", "data")),
        ("volume_unmount", podvol_stream("u1", "data")),
    ]


async def test_inline_csi_volumes_are_pod_scoped_devices(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    engine = await make_engine(plugin)
    await engine.apply(
        [pod("u1", inline_csi_volume("scratch")), pod("u2", inline_csi_volume("scratch"))]
    )
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.wait_pod("u2", "mounted", timeout=5)
    vids = {engine.asw.podvols[(u, "scratch")].volume_id for u in ("u1", "u2")}
    assert len(vids) == 2 and all(engine.asw.devices[v].state == "Attached" for v in vids)
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=5)
    assert podvol_state(engine, "u2", "scratch") == "Mounted"


async def test_block_volume_is_staged_mapped_and_unmapped_with_a_loop_lock(
    make_engine: EngineFactory, root: Path
) -> None:
    plugin = ScriptedPlugin(device_mountable=True, block=True)
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("b1", mode="Block"), pod("u1", claim_volume("disk", "b1"))])
    await engine.wait_pod("u1", "mounted", timeout=10)
    vid = volume_id_of("b1")
    dev = engine.asw.devices[vid]
    assert dev.state == "DeviceGloballyMounted"
    global_map = Path(dev.device_mount_path)
    link = root / "pods/u1/volumeDevices/kubernetes.io~csi/disk"
    assert link.is_symlink() and stat.S_ISBLK(os.stat(link).st_mode)
    bind_file = global_map / "u1"
    assert mounts.is_mount_point(bind_file)  # the device is bind-mounted on the global map file
    assert stat.S_ISBLK(os.stat(bind_file).st_mode)

    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=10)
    await eventually(lambda: vid not in engine.asw.devices, "block device detached")
    assert not link.exists() and not link.is_symlink()
    assert not mounts.mounts_under(root)
    assert not global_map.exists()
    assert [op for op, _ in operations(engine.log)] == [
        "map_volume",
        "unmap_volume",
        "unmap_device",
    ]
    assert plugin.methods_called() == [
        "mount_device",
        "set_up",
        "tear_down",
        "unmount_device",
        "device_still_open",
    ]


async def test_block_volume_of_a_plain_plugin_is_marked_globally_mapped_without_setup_device(
    make_engine: EngineFactory, root: Path
) -> None:
    plugin = ScriptedPlugin(block=True)
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("b1", mode="Block"), pod("u1", claim_volume("disk", "b1"))])
    await engine.wait_pod("u1", "mounted", timeout=10)
    vid = volume_id_of("b1")
    assert device_state(engine, vid) == "DeviceGloballyMounted"  # kubelet: no custom mapper
    await engine.delete_pod(uid="u1")
    await eventually(lambda: vid not in engine.asw.devices, "block device detached")
    assert plugin.calls("mount_device") == 0 and plugin.calls("unmount_device") == 0
    assert device_transitions(engine.log, vid) == [
        "DeviceAttached",
        "DeviceMounted",
        "DeviceUnmounted",
        "DeviceDetached",
    ]
    assert not mounts.mounts_under(root)


async def test_every_plugin_call_is_bracketed_by_operation_records(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(attachable=True, device_mountable=True)
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.delete_pod(uid="u1")
    await eventually(lambda: V1 not in engine.asw.devices, "device detached")
    podvol = types_of(engine.log, podvol_stream("u1", "data"))
    assert podvol == [
        "OperationStarted",
        "VolumeMounted",
        "OperationSucceeded",
        "OperationStarted",
        "VolumeUnmounted",
        "OperationSucceeded",
    ]
    device = types_of(engine.log, device_stream(V1))
    assert device == [
        "DeviceAttached",  # inside the pod's mount operation (recorded on the podvol stream)
        "DeviceMounted",
        "OperationStarted",
        "DeviceUnmounted",
        "OperationSucceeded",
        "DeviceDetached",  # mark-detached calls no plugin: no operation records
    ]


async def test_a_restarted_engine_trusts_the_log_and_has_nothing_to_do(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(attachable=True, device_mountable=True)
    first = await make_engine(plugin)
    await first.apply([*pv_set("v1"), pod("u1", claim_volume("data", "v1"))])
    await first.wait_pod("u1", "mounted", timeout=5)
    await first.settle()
    await first.stop()
    seq, calls = first.log.last_seq(), len(plugin.call_log)
    assert_log_matches(first)
    second = await make_engine(plugin)
    assert second.pod_is("u1", "mounted")  # kubelet would rebuild it Uncertain and remount
    await second.settle()
    assert second.log.last_seq() == seq and len(plugin.call_log) == calls
    await second.delete_pod(uid="u1")
    await eventually(lambda: V1 not in second.asw.devices, "device detached after restart")
    assert plugin.calls("tear_down") == 1 and plugin.calls("unmount_device") == 1

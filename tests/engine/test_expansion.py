"""Node expansion: during mount (after stage or publish) and online (ExpandInUseVolume)."""

from __future__ import annotations

import asyncio

import pytest

from events.log import EventLog
from events.streams import device_stream, podvol_stream
from events.types import OperationStarted, VolumeResized
from volfsm.plugins.scripted import ScriptedPlugin, final, nonfinal, ok

from .conftest import EngineFactory
from .helpers import device_transitions, eventually, failures, operations, podvol_transitions
from .objects import claim_volume, pod, pv, pv_set, volume_id_of

V1 = volume_id_of("v1")
GI = 1 << 30


def sizes_recorded(log: EventLog, volume_id: str = V1) -> list[int]:
    """Every size the device stream recorded, in order."""
    return [
        env.body.size_bytes
        for env in log.read_stream(device_stream(volume_id))
        if isinstance(env.body, VolumeResized)
    ]


def expandable() -> ScriptedPlugin:
    return ScriptedPlugin(device_mountable=True, expandable=True)


async def test_volume_that_grew_before_publish_is_expanded_during_mount(
    make_engine: EngineFactory,
) -> None:
    plugin = expandable()
    gate = asyncio.Event()
    plugin.script("mount_device", ok(gate=gate))
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1", size="1Gi"), pod("u1", claim_volume("data", "v1"))])
    await eventually(lambda: plugin.calls("mount_device") == 1, "staging")
    result = await engine.apply([pv("v1", size="2Gi")])  # the PV grows while the mount runs
    assert [env.type for env in result.events] == ["DesiredSizeChanged", "ObjectApplied"]
    gate.set()
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.settle()
    assert sizes_recorded(engine.log) == [1 * GI, 2 * GI]  # first size at attach, then grown
    assert plugin.methods_called() == ["mount_device", "expand", "set_up"]  # right after stage
    assert operations(engine.log) == [
        ("volume_mount", podvol_stream("u1", "data")),
        ("volume_fs_resize", device_stream(V1)),  # a step of the mount, recorded on its own
    ]


def expansion_reasons(log: EventLog) -> list[str]:
    """The reasons of every volume_fs_resize started, in order."""
    return [
        env.body.reason
        for env in log.read_after(0)
        if isinstance(env.body, OperationStarted) and env.body.operation == "volume_fs_resize"
    ]


async def test_claim_status_below_the_pv_expands_once_before_the_pod_is_mounted(
    make_engine: EngineFactory,
) -> None:
    plugin = expandable()
    engine = await make_engine(plugin)
    objects = [
        *pv_set("v1", size="2Gi", claim_capacity="1Gi"),
        pod("u1", claim_volume("data", "v1")),
    ]
    await engine.apply(objects)
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.apply([pod("u2", claim_volume("data", "v1"))])  # the same claim, still at 1Gi
    await engine.wait_pod("u2", "mounted", timeout=5)
    await engine.settle()

    assert plugin.methods_called() == ["mount_device", "expand", "set_up", "set_up"]
    assert [c.pod_uid for c in plugin.call_log if c.method == "expand"] == [""]  # the staged device
    assert sizes_recorded(engine.log) == [1 * GI, 2 * GI]  # the claim's size, then the PV's
    assert expansion_reasons(engine.log) == [
        "expand during mount (after stage): claim status 1Gi < PV 2Gi"
    ]
    order = [
        env.type
        for env in engine.log.read_after(0)
        if env.type in ("OperationSucceeded", "VolumeMounted")
        and (env.type == "VolumeMounted" or env.stream == device_stream(V1))
    ]
    assert order == ["OperationSucceeded", "VolumeMounted", "VolumeMounted"]


@pytest.mark.parametrize("claim_capacity", ["2Gi", "3Gi", None], ids=["equal", "above", "none"])
async def test_no_expansion_when_the_claim_status_is_not_below_the_pv(
    make_engine: EngineFactory, claim_capacity: str | None
) -> None:
    plugin = expandable()
    engine = await make_engine(plugin)
    claim = pv_set("v1", size="2Gi", claim_capacity=claim_capacity)
    await engine.apply([*claim, pod("u1", claim_volume("data", "v1"))])
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.settle()
    assert plugin.calls("expand") == 0
    assert operations(engine.log) == [("volume_mount", podvol_stream("u1", "data"))]
    # no status.capacity: taken as the binder writes it, the PV's capacity (kubelet: zero)
    assert sizes_recorded(engine.log) == [3 * GI if claim_capacity == "3Gi" else 2 * GI]


async def test_failed_precondition_during_mount_does_not_block_it_and_is_not_retried(
    make_engine: EngineFactory,
) -> None:
    plugin = expandable()
    plugin.script("expand", final("FailedPrecondition", "volume in use"))
    engine = await make_engine(plugin)
    objects = [
        *pv_set("v1", size="2Gi", claim_capacity="1Gi"),
        pod("u1", claim_volume("data", "v1")),
    ]
    await engine.apply(objects)
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.apply([pod("u2", claim_volume("data", "v1"))])
    await engine.wait_pod("u2", "mounted", timeout=5)
    engine.reconciler.full_pass()  # online expansion would be due: 1Gi recorded, 2Gi wanted
    await engine.settle()

    assert plugin.calls("expand") == 1  # not again on this node: not for u2, not online
    assert engine.asw.devices[V1].size_bytes == 1 * GI
    assert [(f.operation, f.code, f.final) for f in failures(engine.log)] == [
        ("volume_fs_resize", "FailedPrecondition", True)
    ]
    assert podvol_transitions(engine.log, "u1", "data") == ["VolumeMounted"]
    assert engine.generator.expand_in_use == {V1: 2 * GI}


async def test_other_expansion_error_after_publish_leaves_the_pod_volume_uncertain(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(expandable=True)  # nothing to stage: expanded after the publish
    plugin.script("expand", final("Internal", "resize2fs failed"))
    engine = await make_engine(plugin)
    objects = [
        *pv_set("v1", size="2Gi", claim_capacity="1Gi"),
        pod("u1", claim_volume("data", "v1")),
    ]
    await engine.apply(objects)
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.settle()

    assert podvol_transitions(engine.log, "u1", "data") == [
        "VolumeMountUncertain",  # published, but not at its size: the pod does not start
        "VolumeMounted",
    ]
    assert plugin.methods_called() == ["set_up", "expand", "set_up", "expand"]
    [mount_failed] = failures(engine.log, "volume_mount")
    assert mount_failed.code == "Internal" and mount_failed.backoff_s > 0  # retried after it
    assert "NodeExpandVolume during mount failed" in mount_failed.message
    assert sizes_recorded(engine.log) == [1 * GI, 2 * GI]


async def test_expansion_error_after_stage_leaves_the_device_uncertain(
    make_engine: EngineFactory,
) -> None:
    plugin = expandable()
    plugin.script("expand", nonfinal("Unavailable"))
    engine = await make_engine(plugin)
    objects = [
        *pv_set("v1", size="2Gi", claim_capacity="1Gi"),
        pod("u1", claim_volume("data", "v1")),
    ]
    await engine.apply(objects)
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.settle()

    # Kubelet: the device is marked Uncertain so that the retry stages and expands again
    # before the publish; the pod was never published in between.
    assert plugin.methods_called() == ["mount_device", "expand", "mount_device", "expand", "set_up"]
    assert "DeviceMountUncertain" in device_transitions(engine.log, V1)
    assert podvol_transitions(engine.log, "u1", "data") == ["VolumeMounted"]
    assert sizes_recorded(engine.log) == [1 * GI, 2 * GI]


async def test_read_only_volume_is_not_expanded_during_mount(make_engine: EngineFactory) -> None:
    plugin = expandable()
    engine = await make_engine(plugin)
    volume = {"name": "data", "persistentVolumeClaim": {"claimName": "v1", "readOnly": True}}
    await engine.apply([*pv_set("v1", size="2Gi", claim_capacity="1Gi"), pod("u1", volume)])
    await engine.wait_pod("u1", "mounted", timeout=5)
    engine.reconciler.full_pass()
    await engine.settle()

    assert plugin.calls("expand") == 0  # not during mount, and not online either
    [warning] = failures(engine.log, "volume_fs_resize")
    assert (warning.code, warning.final) == ("FileSystemResizeFailed", True)
    assert "read-only" in warning.message
    assert podvol_transitions(engine.log, "u1", "data") == ["VolumeMounted"]


async def test_mounted_volume_is_expanded_online_when_its_pv_grows(
    make_engine: EngineFactory,
) -> None:
    plugin = expandable()
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1", size="1Gi"), pod("u1", claim_volume("data", "v1"))])
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.apply([pv("v1", size="3Gi")])
    await eventually(lambda: engine.asw.devices[V1].size_bytes == 3 * GI, "volume resized")
    assert [op for op, _ in operations(engine.log)] == ["volume_mount", "volume_fs_resize"]
    assert operations(engine.log)[1][1] == device_stream(V1)
    assert podvol_transitions(engine.log, "u1", "data") == ["VolumeMounted"]  # stays Mounted
    assert plugin.calls("set_up") == 1


async def test_online_expansion_final_error_is_not_retried_until_the_size_changes(
    make_engine: EngineFactory,
) -> None:
    plugin = expandable()
    plugin.script("expand", final("FailedPrecondition", "volume in use"))
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1", size="1Gi"), pod("u1", claim_volume("data", "v1"))])
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.apply([pv("v1", size="2Gi")])
    await eventually(lambda: bool(failures(engine.log, "volume_fs_resize")), "expansion failed")
    passes = engine.reconciler.passes
    await eventually(lambda: engine.reconciler.passes > passes + 10, "more passes")
    engine.reconciler.full_pass()
    await engine.settle()
    assert plugin.calls("expand") == 1
    assert engine.asw.devices[V1].size_bytes == 1 * GI
    await engine.apply([pv("v1", size="3Gi")])
    await eventually(lambda: engine.asw.devices[V1].size_bytes == 3 * GI, "grown to 3Gi")
    assert plugin.calls("expand") == 2


async def test_online_expansion_non_final_error_is_retried_with_backoff(
    make_engine: EngineFactory,
) -> None:
    plugin = expandable()
    plugin.script("expand", nonfinal("Unavailable"), nonfinal("Unavailable"))
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1", size="1Gi"), pod("u1", claim_volume("data", "v1"))])
    await engine.wait_pod("u1", "mounted", timeout=5)
    await engine.apply([pv("v1", size="2Gi")])
    await eventually(lambda: engine.asw.devices[V1].size_bytes == 2 * GI, "resized")
    backoffs = [f.backoff_s for f in failures(engine.log, "volume_fs_resize")]
    assert backoffs == [0.01, 0.02]
    assert podvol_transitions(engine.log, "u1", "data") == ["VolumeMounted"]

"""Node expansion: during mount (after publish) and online (ExpandInUseVolume)."""

from __future__ import annotations

import asyncio

from events.log import EventLog
from events.streams import device_stream
from events.types import VolumeResized
from volfsm.plugins.scripted import ScriptedPlugin, final, nonfinal, ok

from .conftest import EngineFactory
from .helpers import eventually, failures, operations, podvol_transitions
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
    assert [env.type for env in result.events] == ["DesiredSizeChanged"]
    gate.set()
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert sizes_recorded(engine.log) == [1 * GI, 2 * GI]  # first size at attach, then grown
    assert plugin.methods_called() == ["mount_device", "set_up", "expand"]
    assert [op for op, _ in operations(engine.log)] == ["volume_mount"]  # all in the mount


async def test_expansion_failure_during_mount_marks_the_pod_volume_uncertain(
    make_engine: EngineFactory,
) -> None:
    plugin = expandable()
    gate = asyncio.Event()
    plugin.script("mount_device", ok(gate=gate))
    plugin.script("expand", final("OutOfRange"))
    engine = await make_engine(plugin)
    await engine.apply([*pv_set("v1", size="1Gi"), pod("u1", claim_volume("data", "v1"))])
    await eventually(lambda: plugin.calls("mount_device") == 1, "staging")
    await engine.apply([pv("v1", size="2Gi")])
    gate.set()
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert podvol_transitions(engine.log, "u1", "data") == [
        "VolumeMountUncertain",  # published, but not at the size wanted: the pod does not start
        "VolumeMounted",
    ]
    assert plugin.calls("set_up") == 2 and plugin.calls("expand") == 2
    assert sizes_recorded(engine.log) == [1 * GI, 2 * GI]


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

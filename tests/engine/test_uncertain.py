"""Every uncertain case of stage and publish (reference §1.3), including reconstructed entries."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from events.log import EventLog
from events.streams import device_stream, podvol_stream
from events.types import DeviceMountUncertain, VolumeMountUncertain
from volfsm.engine import PodWaitTimeoutError
from volfsm.engine.handler import CommandHandler
from volfsm.plugins.scripted import (
    Outcome,
    ScriptedPlugin,
    final,
    nonfinal,
    ok,
    timeout,
    transient,
)

from .conftest import FAST, EngineFactory
from .helpers import (
    device_state,
    device_transitions,
    eventually,
    failures,
    podvol_state,
    podvol_transitions,
)
from .objects import claim_volume, pod, pv_set, volume_id_of

V1 = volume_id_of("v1")
OBJECTS = [*pv_set("v1"), pod("u1", claim_volume("data", "v1"))]

GATED = dataclasses.replace(FAST, desired_complete=False)
"""As `volfsm serve` starts: nothing is unmounted until the desired state is complete, so a
reconstructed entry waits for the pod applied after start instead of being torn down."""


def staged_plugin() -> ScriptedPlugin:
    return ScriptedPlugin(device_mountable=True)


# -------------------------------------------------------------------- stage


@pytest.mark.parametrize(
    ("outcome", "code"),
    [(timeout(), "DeadlineExceeded"), (nonfinal("Unavailable"), "Unavailable")],
    ids=["timeout", "non-final"],
)
async def test_stage_timeout_or_non_final_error_marks_the_device_uncertain(
    make_engine: EngineFactory, outcome: Outcome, code: str
) -> None:
    plugin = staged_plugin()
    gate = asyncio.Event()
    plugin.script("mount_device", outcome, ok(gate=gate))
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await eventually(lambda: plugin.calls("mount_device") == 2, "the retried stage")
    assert device_state(engine, V1) == "Uncertain"
    assert podvol_state(engine, "u1", "data") == "Unmounted"  # publish never reached
    failed = failures(engine.log, "volume_mount")
    assert [f.code for f in failed] == [code] and not failed[0].final
    gate.set()
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert device_transitions(engine.log, V1) == [
        "DeviceAttached",
        "DeviceMountUncertain",
        "DeviceMounted",
    ]


async def test_stage_final_error_on_a_fresh_device_leaves_it_attached(
    make_engine: EngineFactory,
) -> None:
    plugin = staged_plugin()
    plugin.script("mount_device", final("InvalidArgument"), final("InvalidArgument"))
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert device_transitions(engine.log, V1) == ["DeviceAttached", "DeviceMounted"]
    assert [f.final for f in failures(engine.log)] == [True, True]


async def test_stage_timeout_then_final_error_returns_the_device_to_not_mounted(
    make_engine: EngineFactory,
) -> None:
    plugin = staged_plugin()
    plugin.script("mount_device", timeout(), final("NotFound"))
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert device_transitions(engine.log, V1) == [
        "DeviceAttached",
        "DeviceMountUncertain",
        "DeviceUnmounted",  # Uncertain -> NotMounted on the final error
        "DeviceMounted",
    ]


async def test_stage_error_before_the_driver_changes_nothing(make_engine: EngineFactory) -> None:
    plugin = staged_plugin()
    plugin.script("mount_device", transient("Unavailable"), transient())
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert device_transitions(engine.log, V1) == ["DeviceAttached", "DeviceMounted"]
    assert len(failures(engine.log)) == 2


async def test_wait_for_attach_timeout_changes_no_state(make_engine: EngineFactory) -> None:
    plugin = ScriptedPlugin(attachable=True, device_mountable=True)
    gate = asyncio.Event()
    plugin.script("wait_for_attach", timeout(), ok("/dev/fake", gate=gate))
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await eventually(lambda: plugin.calls("wait_for_attach") == 2, "the second wait for attach")
    assert device_state(engine, V1) == "Detached"  # no DeviceAttached: nothing was reached
    assert failures(engine.log)[0].code == "DeadlineExceeded"
    gate.set()
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert engine.asw.devices[V1].device_path == "/dev/fake"


async def test_reconstructed_device_stays_uncertain_on_final_stage_errors(
    make_engine: EngineFactory, event_log: EventLog
) -> None:
    _reconstructed(event_log, device=True)
    plugin = staged_plugin()
    gate = asyncio.Event()
    plugin.script("mount_device", final("NotFound"), final("NotFound"), ok(gate=gate))
    engine = await make_engine(plugin, config=GATED)
    await engine.apply(OBJECTS)
    await eventually(lambda: plugin.calls("mount_device") == 3, "three stage attempts")
    assert device_state(engine, V1) == "Uncertain"  # not forgotten (kubelet #96635)
    assert engine.asw.devices[V1].reconstructed
    gate.set()
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert device_transitions(engine.log, V1) == ["DeviceMountUncertain", "DeviceMounted"]


# ------------------------------------------------------------------ publish


async def test_publish_timeout_marks_the_pod_volume_uncertain_which_does_not_count_as_mounted(
    make_engine: EngineFactory,
) -> None:
    plugin = staged_plugin()
    gate = asyncio.Event()
    plugin.script("set_up", timeout(), ok(gate=gate))
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await eventually(lambda: plugin.calls("set_up") == 2, "the retried publish")
    assert podvol_state(engine, "u1", "data") == "Uncertain"
    with pytest.raises(PodWaitTimeoutError) as waited:
        await engine.wait_pod("u1", "mounted", timeout=0.05)
    assert "data is Uncertain" in str(waited.value)
    assert "DeadlineExceeded" in str(waited.value)
    gate.set()
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert podvol_transitions(engine.log, "u1", "data") == [
        "VolumeMountUncertain",
        "VolumeMounted",
    ]


async def test_publish_final_error_on_a_fresh_pod_volume_leaves_it_unmounted(
    make_engine: EngineFactory,
) -> None:
    plugin = staged_plugin()
    plugin.script("set_up", final("InvalidArgument"))
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert podvol_transitions(engine.log, "u1", "data") == ["VolumeMounted"]
    assert device_state(engine, V1) == "DeviceGloballyMounted"  # the stage is not undone


async def test_publish_timeout_then_final_error_returns_the_pod_volume_to_unmounted(
    make_engine: EngineFactory,
) -> None:
    plugin = staged_plugin()
    plugin.script("set_up", nonfinal("Aborted"), final("NotFound"))
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert podvol_transitions(engine.log, "u1", "data") == [
        "VolumeMountUncertain",
        "VolumeUnmounted",
        "VolumeMounted",
    ]
    assert plugin.calls("mount_device") == 1  # the device stays staged throughout


async def test_remount_that_fails_never_downgrades_a_mounted_volume(
    make_engine: EngineFactory,
) -> None:
    plugin = staged_plugin()
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await engine.wait_pod("u1", "mounted", timeout=5)
    plugin.script("set_up", final("Internal"), timeout(), nonfinal("Aborted"))
    assert engine.remount("u1") == 1
    await eventually(lambda: plugin.calls("set_up") == 5, "three failed remounts and a good one")
    await engine.settle()
    assert podvol_transitions(engine.log, "u1", "data") == ["VolumeMounted", "VolumeMounted"]
    assert [f.code for f in failures(engine.log)] == ["Internal", "DeadlineExceeded", "Aborted"]
    assert not engine.reconciler.remount_required
    assert plugin.calls("mount_device") == 1


async def test_reconstructed_pod_volume_stays_uncertain_on_final_publish_errors(
    make_engine: EngineFactory, event_log: EventLog
) -> None:
    _reconstructed(event_log, device=False)
    plugin = ScriptedPlugin()
    gate = asyncio.Event()
    plugin.script("set_up", final("NotFound"), final("NotFound"), ok(gate=gate))
    engine = await make_engine(plugin, config=GATED)
    await engine.apply(OBJECTS)
    await eventually(lambda: plugin.calls("set_up") == 3, "three publish attempts")
    assert podvol_state(engine, "u1", "data") == "Uncertain"
    gate.set()
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert podvol_transitions(engine.log, "u1", "data") == [
        "VolumeMountUncertain",
        "VolumeMounted",
    ]


async def test_an_uncertain_pod_volume_is_torn_down_when_its_pod_goes(
    make_engine: EngineFactory,
) -> None:
    plugin = staged_plugin()
    plugin.script("set_up", *[nonfinal("Unavailable")] * 50)
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await eventually(lambda: podvol_state(engine, "u1", "data") == "Uncertain", "publish Uncertain")
    await engine.delete_pod(uid="u1")
    await engine.wait_pod("u1", "unmounted", timeout=5)
    await eventually(lambda: V1 not in engine.asw.devices, "device detached")
    assert plugin.calls("tear_down") == 1  # Uncertain may be mounted: teardown is due
    assert podvol_transitions(engine.log, "u1", "data") == [
        "VolumeMountUncertain",
        "VolumeUnmounted",
    ]


def _reconstructed(log: EventLog, *, device: bool) -> None:
    """Record what reconstruction (issue 6) would: entries Uncertain, flagged reconstructed."""
    handler = CommandHandler(log)
    if device:
        handler.fire(
            device_stream(V1),
            "mark_device_uncertain",
            DeviceMountUncertain(volume_id=V1, reason="reconstructed", reconstructed=True),
        )
    handler.fire(
        podvol_stream("u1", "data"),
        "mark_uncertain",
        VolumeMountUncertain(
            volume_id=V1,
            pod_uid="u1",
            volume_name="data",
            reason="reconstructed",
            reconstructed=True,
        ),
    )


async def test_a_remount_asked_for_while_one_runs_is_not_answered_by_the_running_one(
    make_engine: EngineFactory,
) -> None:
    """An object changed again while a SetUp writes the old content: the running remount's
    VolumeMounted must not clear the newer request, or the files keep the old version."""
    plugin = staged_plugin()
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await engine.wait_pod("u1", "mounted", timeout=5)
    gate = asyncio.Event()
    plugin.script("set_up", ok(gate=gate))
    assert engine.remount("u1") == 1
    await eventually(lambda: plugin.calls("set_up") == 2, "the first remount running")
    assert engine.remount("u1") == 1  # asked for again while it runs
    gate.set()
    await eventually(lambda: plugin.calls("set_up") == 3, "a second remount for the new request")
    await engine.settle()
    assert podvol_transitions(engine.log, "u1", "data") == ["VolumeMounted"] * 3
    assert not engine.reconciler.remount_required and not engine.reconciler.remount_started

"""The engine's API: apply / delete / status / waits / start-stop, and what it records."""

from __future__ import annotations

import dataclasses

import pytest

from events.types import OperationFailed
from volfsm.desired.errors import InvalidObjectError
from volfsm.engine import EngineNotRunningError, PodWaitTimeoutError
from volfsm.plugins.scripted import ScriptedPlugin, final, hang

from .conftest import FAST, EngineFactory, catalog_of
from .helpers import envelopes, eventually, failures, podvol_state, podvol_transitions
from .objects import claim_volume, pod, pv_set, volume_id_of

V1 = volume_id_of("v1")
OBJECTS = [*pv_set("v1"), pod("u1", claim_volume("data", "v1"))]


async def test_apply_records_desired_events_once_and_rejects_invalid_objects_whole(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    engine = await make_engine(plugin)
    first = await engine.apply(OBJECTS)
    assert [env.type for env in first.events] == ["PodAdded"] + ["ObjectApplied"] * 3
    kinds = [getattr(env.body, "kind", "") for env in first.events[1:]]
    assert kinds == ["PersistentVolume", "PersistentVolumeClaim", "Pod"]
    assert [str(r) for r in first.objects][-1] == "pod/default/pod-u1 created"
    await engine.wait_pod("u1", "mounted", timeout=5)
    again = await engine.apply(OBJECTS)
    assert not again.changed
    await engine.settle()  # the mount's OperationSucceeded may follow VolumeMounted
    seq = engine.log.last_seq()
    bad = pod("u2", {"name": "data", "emptyDir": {"sizeLimit": "lots"}})
    with pytest.raises(InvalidObjectError) as rejected:
        await engine.apply([pod("u3", claim_volume("data", "v1")), bad])
    assert "spec.volumes[0].emptyDir.sizeLimit" in str(rejected.value)
    assert engine.log.last_seq() == seq  # nothing of the batch was recorded
    assert "u3" not in engine.dsw.pods


async def test_unmounts_wait_until_the_desired_state_is_declared_complete(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    config = dataclasses.replace(FAST, desired_complete=False)
    first = await make_engine(plugin, config=config)
    assert first.desired_complete  # a fresh node (empty log, empty root) has nothing to guard
    await first.apply(OBJECTS)
    await first.wait_pod("u1", "mounted", timeout=5)
    await first.stop()
    engine = await make_engine(plugin, config=config)  # a restart with history: gated
    assert not engine.desired_complete
    assert podvol_state(engine, "u1", "data") == "Mounted"
    await engine.delete_pod(uid="u1")
    passes = engine.reconciler.passes
    await eventually(lambda: engine.reconciler.passes > passes + 5, "more passes")
    assert plugin.calls("tear_down") == 0
    assert podvol_state(engine, "u1", "data") == "Mounted"
    engine.set_desired_complete()
    await engine.wait_pod("u1", "unmounted", timeout=5)
    await eventually(lambda: V1 not in engine.asw.devices, "device detached")


async def test_failed_mounts_back_off_doubling_and_the_log_says_when_the_next_try_is(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    plugin.script("set_up", *[final("Internal")] * 5)
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await engine.wait_pod("u1", "mounted", timeout=5)
    failed = failures(engine.log, "volume_mount")
    assert [f.backoff_s for f in failed] == [0.01, 0.02, 0.04, 0.08, 0.08]
    assert all(f.final and f.code == "Internal" for f in failed)
    assert all(f.duration_s >= 0 for f in failed)


async def test_status_shows_state_last_error_and_next_retry(make_engine: EngineFactory) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    plugin.script("set_up", *[final("PermissionDenied", "no access")] * 1000)
    config = dataclasses.replace(FAST, backoff_initial=30.0, backoff_max=30.0)
    engine = await make_engine(plugin, config=config)
    await engine.apply(OBJECTS)
    await eventually(lambda: bool(failures(engine.log)), "a failed mount")
    status = engine.pod("u1")
    assert status is not None and status.phase == "Pending" and status.desired
    (vol,) = status.volumes
    assert vol.state == "Unmounted" and vol.volume_id == V1
    assert vol.last_error is not None and vol.last_error.code == "PermissionDenied"
    assert vol.last_error.final and vol.last_error.backoff_s == 30.0
    assert vol.next_retry_us is not None
    assert vol.next_retry_us == vol.last_error.ended_us + 30_000_000  # type: ignore[operator]
    (volume,) = engine.volumes()
    assert volume.state == "DeviceGloballyMounted" and volume.wanted_by == ("u1",)
    assert volume.held_by == () and volume.plugin == "kubernetes.io/csi:scripted.volfsm.io"
    assert [p.uid for p in engine.pods()] == ["u1"]


async def test_wait_pod_times_out_naming_the_volume_its_state_and_last_error(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    plugin.script("mount_device", *[final("NotFound", "no such volume")] * 1000)
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await eventually(lambda: bool(failures(engine.log)), "a failed mount")
    with pytest.raises(PodWaitTimeoutError) as waited:
        await engine.wait_pod("u1", "mounted", timeout=0.05)
    message = str(waited.value)
    assert "data is Unmounted" in message and "NotFound: no such volume" in message
    assert waited.value.status is not None and waited.value.status.phase == "Pending"
    assert isinstance(waited.value, TimeoutError)


async def test_wait_for_unmounted_of_an_unknown_pod_returns_at_once(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    engine = await make_engine(plugin)
    assert await engine.wait_pod("nobody", "unmounted", timeout=1) is None
    assert not await engine.delete_pod(uid="nobody")
    assert not await engine.delete_pod(namespace="default", name="nobody")


async def test_delete_by_namespace_and_name(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    engine = await make_engine(plugin)
    await engine.apply(OBJECTS)
    await engine.wait_pod("u1", "mounted", timeout=5)
    assert await engine.delete_pod(namespace="default", name="pod-u1")
    status = await engine.wait_pod("u1", "unmounted", timeout=5)
    assert status is None or status.phase == "Gone"


async def test_a_driver_that_went_away_fails_teardown_without_changing_state_until_it_is_back(
    make_engine: EngineFactory, plugin: ScriptedPlugin
) -> None:
    catalog = catalog_of(plugin)
    engine = await make_engine(plugin, catalog=catalog)
    await engine.apply(OBJECTS)
    await engine.wait_pod("u1", "mounted", timeout=5)
    catalog.unregister_csi_driver(plugin.driver)
    await engine.delete_pod(uid="u1")
    await eventually(lambda: len(failures(engine.log, "volume_unmount")) >= 2, "retries")
    assert {f.code for f in failures(engine.log)} == {"PluginNotFound"}
    assert podvol_state(engine, "u1", "data") == "Mounted"  # nothing was attempted
    catalog.register_csi_driver(plugin.driver, plugin)
    await engine.wait_pod("u1", "unmounted", timeout=5)
    assert podvol_transitions(engine.log, "u1", "data") == ["VolumeMounted", "VolumeUnmounted"]


async def test_stop_cancels_a_hung_call_and_records_it_as_possibly_in_progress(
    make_engine: EngineFactory,
) -> None:
    plugin = ScriptedPlugin(device_mountable=True)
    plugin.script("set_up", hang())
    config = dataclasses.replace(FAST, operation_timeout=None)  # no timeout: only stop ends it
    engine = await make_engine(plugin, config=config)
    await engine.apply(OBJECTS)
    await eventually(lambda: plugin.calls("set_up") == 1, "publish hanging")
    await engine.stop(grace_s=0.05)
    last = envelopes(engine.log)[-1].body
    assert isinstance(last, OperationFailed)
    assert last.code == "Canceled" and not last.final
    assert podvol_state(engine, "u1", "data") == "Uncertain"
    with pytest.raises(EngineNotRunningError):
        await engine.apply(OBJECTS)
    with pytest.raises(EngineNotRunningError):
        await engine.start()

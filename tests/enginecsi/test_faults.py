"""Each fault class through the real driver (its fault-injection file), seen by the engine.

The driver answers with what its control file says, per RPC and per volume
(volfsm/csidriver/faults.py); the engine must classify the outcome as the
kubelet does (reference §1.3) and the node must end up clean. Calls are
counted from the driver's own call log and from the engine's
OperationStarted events; no test asserts how long anything took.
"""

from __future__ import annotations

import asyncio

import pytest

from events.streams import podvol_stream
from tests.enginecsi.conftest import FAST, MakeStack
from tests.enginecsi.helpers import (
    DRIVER,
    assert_nothing_left,
    attempts,
    claimed_volume,
    delete_and_wait,
    device_events,
    device_state,
    eventually,
    failed,
    only_loop,
    pod,
    podvol_events,
    podvol_state,
    started,
)
from tests.helpers.csidriver import DriverProcess, create_volume, mounts_at

MIB = 1 << 20
CRASH_EXIT_CODE = 137


@pytest.mark.parametrize("when", ["before", "after"])
async def test_stage_timeout_leaves_the_device_uncertain_and_unstage_runs_once(
    driver: DriverProcess, make_stack: MakeStack, when: str
) -> None:
    """ "after": the driver staged, then never answered (the reply was lost)."""
    create_volume(driver.clients(), "slow", 32 * MIB)
    driver.set_faults(
        [{"rpc": "NodeStageVolume", "volume_id": "slow", "action": "hang", "when": when}]
    )
    stack = await make_stack(driver, csi_timeout=1.0)
    engine, log = stack.engine, stack.log
    await engine.apply([*claimed_volume("pv-slow", "slow"), pod("pod-a", "pv-slow")])
    await eventually(lambda: device_state(engine, "slow") == "Uncertain", "device Uncertain")
    await eventually(lambda: bool(failed(log, "volume_mount")), "the failure recorded")

    first = failed(log, "volume_mount")[0].body
    assert (first.code, first.final) == ("DeadlineExceeded", False)
    assert podvol_state(engine, "pod-a") == "Unmounted"  # the publish was never reached
    assert driver.calls("NodePublishVolume", event="start") == []
    staging = stack.layout.csi_staging_path(DRIVER, "slow")
    if when == "after":
        assert len(mounts_at(staging)) == 1  # what the engine is uncertain about is real
    status = engine.pod("pod-a")
    assert status is not None and status.phase == "Pending"

    await delete_and_wait(engine, ["pod-a"], ["slow"])
    # One NodeUnstageVolume did the work. The driver may still have been busy with the
    # timed-out stage when the first one came: it refused that one (ABORTED, nothing
    # done, per-volume lock) and the engine asked again after its backoff.
    unstages = driver.codes("NodeUnstageVolume", "slow")
    assert unstages.count("OK") == 1 and unstages[-1] == "OK"
    assert set(unstages[:-1]) <= {"ABORTED"}
    assert len(driver.calls("NodeUnstageVolume", "slow", event="start")) == len(unstages)
    assert len(started(log, "unmount_device")) == len(unstages)
    assert len(mounts_at(staging)) == 0
    events = device_events(log, "slow")
    assert events[-3:] == ["DeviceMountUncertain", "DeviceUnmounted", "DeviceDetached"]
    assert podvol_events(log, "pod-a") == []
    assert_nothing_left(driver, stack.layout, ["slow"])


@pytest.mark.parametrize(
    ("code", "name"),
    [("INVALID_ARGUMENT", "InvalidArgument"), ("PERMISSION_DENIED", "PermissionDenied")],
)
async def test_publish_final_error_mounts_nothing_and_never_unpublishes(
    driver: DriverProcess, make_stack: MakeStack, code: str, name: str
) -> None:
    create_volume(driver.clients(), "denied", 32 * MIB)
    driver.set_faults(
        [{"rpc": "NodePublishVolume", "volume_id": "denied", "action": "error", "code": code}]
    )
    stack = await make_stack(driver)
    engine, log, layout = stack.engine, stack.log, stack.layout
    await engine.apply([*claimed_volume("pv-denied", "denied"), pod("pod-a", "pv-denied")])
    await eventually(lambda: len(failed(log, "volume_mount")) >= 2, "the publish retried")

    for env in failed(log, "volume_mount"):
        assert (env.body.code, env.body.final) == (name, True)
        assert f"injected {code} fault in NodePublishVolume" in env.body.message
    assert podvol_events(log, "pod-a") == []  # never Mounted, never Uncertain
    status = engine.pod("pod-a")
    assert status is not None and status.volumes[0].state == "Unmounted"
    assert status.volumes[0].last_error is not None
    assert status.volumes[0].last_error.code == name
    assert device_state(engine, "denied") == "DeviceGloballyMounted"  # the stage worked
    publish_dir = layout.csi_publish_dir("pod-a", "pv-denied")
    assert not publish_dir.exists()  # the caller's dir and vol_data.json go after a final error

    await delete_and_wait(engine, ["pod-a"], ["denied"])
    assert driver.calls("NodeUnpublishVolume", event="start") == []
    assert started(log, "volume_unmount") == []
    assert driver.codes("NodeUnstageVolume", "denied") == ["OK"]
    assert_nothing_left(driver, layout, ["denied"])


async def test_aborted_is_retried_with_growing_backoff(
    driver: DriverProcess, make_stack: MakeStack
) -> None:
    create_volume(driver.clients(), "busy", 32 * MIB)
    driver.set_faults(
        [
            {
                "rpc": "NodeStageVolume",
                "volume_id": "busy",
                "action": "error",
                "code": "ABORTED",
                "times": 3,
            }
        ]
    )
    stack = await make_stack(driver)
    engine, log = stack.engine, stack.log
    await engine.apply([*claimed_volume("pv-busy", "busy"), pod("pod-a", "pv-busy")])
    await engine.wait_pod("pod-a", "mounted", timeout=120)
    await engine.settle(timeout=60)  # the operation's OperationSucceeded follows VolumeMounted

    assert driver.codes("NodeStageVolume", "busy") == ["ABORTED"] * 3 + ["OK"]
    stream = podvol_stream("pod-a", "data")
    failures = failed(log, "volume_mount", stream)
    tries = attempts(log, "volume_mount", stream)
    assert len(failures) == 3 and len(tries) == 4
    assert all((f.body.code, f.body.final) == ("Aborted", False) for f in failures)
    backoffs = [f.body.backoff_s for f in failures]
    assert backoffs[0] == FAST.backoff_initial
    assert backoffs == sorted(set(backoffs))  # strictly growing
    assert backoffs[1:] == [min(b * FAST.backoff_factor, FAST.backoff_max) for b in backoffs[:-1]]
    retry_at = [f.ts + round(f.body.backoff_s * 1_000_000) for f in failures]
    assert retry_at == sorted(set(retry_at))
    for attempt, not_before in zip(tries[1:], retry_at, strict=True):
        assert attempt.ts >= not_before  # each retry waited for its backoff (log clock)
    # ABORTED is not final: the stage may have been under way, so the device was Uncertain.
    assert device_events(log, "busy") == [
        "DeviceAttached",
        "VolumeResized",
        "DeviceMountUncertain",
        "DeviceMounted",
    ]
    status = engine.pod("pod-a")
    assert status is not None
    [vol] = status.volumes
    assert vol.last_error is not None and vol.last_error.code == "Aborted"
    assert vol.last_operation is not None and vol.last_operation.status == "succeeded"
    assert vol.next_retry_us is None

    await delete_and_wait(engine, ["pod-a"], ["busy"])
    assert_nothing_left(driver, stack.layout, ["busy"])


async def test_driver_crash_mid_stage_then_restart_converges(
    driver: DriverProcess, make_stack: MakeStack
) -> None:
    """The driver dies after staging, before answering; the retry after its restart is
    idempotent: one staging mount, one loop device."""
    create_volume(driver.clients(), "crashy", 32 * MIB)
    driver.set_faults(
        [
            {
                "rpc": "NodeStageVolume",
                "volume_id": "crashy",
                "action": "crash",
                "when": "after",
                "times": 1,
            }
        ]
    )
    stack = await make_stack(driver)
    engine, log, layout = stack.engine, stack.log, stack.layout
    await engine.apply([*claimed_volume("pv-crashy", "crashy"), pod("pod-a", "pv-crashy")])
    assert await asyncio.to_thread(driver.wait_exit, 60) == CRASH_EXIT_CODE
    await eventually(lambda: device_state(engine, "crashy") == "Uncertain", "device Uncertain")
    staging = layout.csi_staging_path(DRIVER, "crashy")
    assert len(mounts_at(staging)) == 1  # staged before it died
    only_loop(driver, "crashy")
    # While the driver is down the engine keeps trying, with backoff, and changes nothing.
    await eventually(lambda: len(failed(log, "volume_mount")) >= 2, "a retry while down")
    assert {(f.body.code, f.body.final) for f in failed(log, "volume_mount")} == {
        ("Unavailable", False)
    }
    assert podvol_state(engine, "pod-a") == "Unmounted"

    await asyncio.to_thread(driver.start)
    await engine.wait_pod("pod-a", "mounted", timeout=120)
    assert len(mounts_at(staging)) == 1
    loop = only_loop(driver, "crashy")
    [published] = mounts_at(layout.csi_publish_path("pod-a", "pv-crashy"))
    assert published.source == loop
    arrived = driver.calls("NodeStageVolume", "crashy", event="start")
    assert len(arrived) == 2 and arrived[0]["pid"] != arrived[1]["pid"]
    assert driver.codes("NodeStageVolume", "crashy") == ["OK"]  # the first never answered
    assert device_events(log, "crashy")[-2:] == ["DeviceMountUncertain", "DeviceMounted"]
    # Every attempt but the last failed: while down, and the one the crash cut off.
    assert len(started(log, "volume_mount")) == len(failed(log, "volume_mount")) + 1

    await delete_and_wait(engine, ["pod-a"], ["crashy"])
    assert_nothing_left(driver, layout, ["crashy"])

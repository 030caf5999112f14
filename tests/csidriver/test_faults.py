"""Fault injection: delay, error codes, hang, crash; and ABORTED for concurrent calls."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.helpers.csidriver import (
    CsiClients,
    DriverProcess,
    Mode,
    create_volume,
    loops_of,
    mounts_at,
    publish_volume,
    stage_volume,
    unpublish_volume,
    unstage_volume,
)
from volfsm.csi.v1 import csi_pb2

PathFor = Callable[[str], str]


def _wait_for_log(driver: DriverProcess, text: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in driver.log_text():
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{driver.log_tail()}"
        time.sleep(0.02)


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except grpc.RpcError as err:
            outcome.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_delay(driver: DriverProcess, csi: CsiClients, staging: PathFor) -> None:
    create_volume(csi, "d1")
    driver.set_faults(
        [{"rpc": "NodeStageVolume", "volume_id": "d1", "action": "delay", "seconds": 1.0}]
    )
    stage_volume(csi, "d1", staging("d1"))
    _wait_for_log(driver, "fault injected: NodeStageVolume")  # the delay ran (no clock asserted)
    assert mounts_at(staging("d1"))  # and the call then did its work
    driver.clear_faults()
    unstage_volume(csi, "d1", staging("d1"))


def test_concurrent_call_for_same_volume_is_aborted(
    driver: DriverProcess, csi: CsiClients, staging: PathFor
) -> None:
    create_volume(csi, "busy")
    create_volume(csi, "other")
    driver.set_faults(
        [{"rpc": "NodeStageVolume", "volume_id": "busy", "action": "delay", "seconds": 5.0}]
    )
    thread, outcome = _in_thread(lambda: stage_volume(csi, "busy", staging("busy")))
    _wait_for_log(driver, "fault injected: NodeStageVolume")

    calls: list[Callable[[], Any]] = [
        lambda: stage_volume(csi, "busy", staging("busy")),
        lambda: unstage_volume(csi, "busy", staging("busy")),
        lambda: csi.controller.DeleteVolume(
            csi_pb2.DeleteVolumeRequest(volume_id="busy"), timeout=5
        ),
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.ABORTED
        assert "already pending" in err.value.details()

    # Another volume is not held up by the busy one: it is staged while busy is still held.
    stage_volume(csi, "other", staging("other"))
    assert thread.is_alive()

    thread.join(10)
    assert outcome and not isinstance(outcome[0], grpc.RpcError), outcome
    assert mounts_at(staging("busy"))
    unstage_volume(csi, "busy", staging("busy"))
    unstage_volume(csi, "other", staging("other"))


def test_error_before_and_times(driver: DriverProcess, csi: CsiClients, staging: PathFor) -> None:
    create_volume(csi, "e1")
    driver.set_faults(
        [
            {
                "rpc": "NodeStageVolume",
                "volume_id": "e1",
                "action": "error",
                "code": "RESOURCE_EXHAUSTED",
                "message": "injected: out of loop devices",
                "times": 2,
            }
        ]
    )
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as err:
            stage_volume(csi, "e1", staging("e1"))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.value.details() == "injected: out of loop devices"
        assert mounts_at(staging("e1")) == [], "a 'before' fault does no work"
    stage_volume(csi, "e1", staging("e1"))  # the rule is used up
    assert mounts_at(staging("e1"))
    unstage_volume(csi, "e1", staging("e1"))


def test_error_after_work_was_done(
    driver: DriverProcess, csi: CsiClients, staging: PathFor, target: PathFor
) -> None:
    create_volume(csi, "e2")
    stage_volume(csi, "e2", staging("e2"))
    driver.set_faults(
        [
            {
                "rpc": "NodePublishVolume",
                "action": "error",
                "code": "UNAVAILABLE",
                "when": "after",
                "times": 1,
            }
        ]
    )
    with pytest.raises(grpc.RpcError) as err:
        publish_volume(csi, "e2", staging("e2"), target("p"))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert mounts_at(target("p")), "'after': the work is done, only the reply is an error"
    publish_volume(csi, "e2", staging("e2"), target("p"))  # the retry converges
    assert len(mounts_at(target("p"))) == 1
    unpublish_volume(csi, "e2", target("p"))
    unstage_volume(csi, "e2", staging("e2"))


def test_hang_until_client_deadline(
    driver: DriverProcess, csi: CsiClients, staging: PathFor
) -> None:
    create_volume(csi, "h1")
    driver.set_faults([{"rpc": "NodeStageVolume", "action": "hang", "times": 1}])
    with pytest.raises(grpc.RpcError) as err:
        stage_volume(csi, "h1", staging("h1"), timeout=1.0)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The hung handler notices the cancellation and lets go of the volume.
    _wait_for_log(driver, "NodeStageVolume volume=h1 -> CANCELLED")
    stage_volume(csi, "h1", staging("h1"))
    unstage_volume(csi, "h1", staging("h1"))


def test_crash_before_then_restart_and_retry(
    driver: DriverProcess, csi: CsiClients, staging: PathFor
) -> None:
    create_volume(csi, "c1")
    driver.set_faults([{"rpc": "NodeStageVolume", "action": "crash", "times": 1}])
    with pytest.raises(grpc.RpcError) as err:
        stage_volume(csi, "c1", staging("c1"))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert driver.wait_exit() == 137
    assert mounts_at(staging("c1")) == [] and loops_of(driver.image("c1")) == []

    driver.restart()  # the crash rule stays in the file but has fired its one time
    csi = driver.clients()
    stage_volume(csi, "c1", staging("c1"))
    assert len(mounts_at(staging("c1"))) == 1
    unstage_volume(csi, "c1", staging("c1"))


def test_crash_mid_stage_leftover_loop_is_reused(
    driver: DriverProcess, csi: CsiClients, staging: PathFor
) -> None:
    """A crash between attaching the loop device and mounting: the retry adopts the device."""
    create_volume(csi, "c3")
    driver.set_faults([{"rpc": "NodeStageVolume", "action": "crash", "times": 1}])
    with pytest.raises(grpc.RpcError):
        stage_volume(csi, "c3", staging("c3"))
    assert driver.wait_exit() == 137
    # What the dead driver had got done: the loop device, nothing else.
    loop = subprocess.run(
        ["losetup", "--find", "--show", str(driver.image("c3"))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()

    driver.restart()
    csi = driver.clients()
    stage_volume(csi, "c3", staging("c3"))
    assert loops_of(driver.image("c3")) == [loop]
    assert mounts_at(staging("c3"))[0].source == loop
    unstage_volume(csi, "c3", staging("c3"))
    assert loops_of(driver.image("c3")) == []


def test_crash_after_stage_then_retry_converges(
    driver: DriverProcess, csi: CsiClients, staging: PathFor, target: PathFor
) -> None:
    create_volume(csi, "c2")
    driver.set_faults(
        [{"rpc": "NodeStageVolume", "volume_id": "c2", "action": "crash", "when": "after"}]
    )
    with pytest.raises(grpc.RpcError) as err:
        stage_volume(csi, "c2", staging("c2"))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert driver.wait_exit() == 137
    (loop,) = loops_of(driver.image("c2"))
    assert mounts_at(staging("c2"))[0].source == loop, "the driver finished before it died"

    driver.clear_faults()
    driver.restart()
    csi = driver.clients()
    record = json.loads((driver.state_dir / "volumes" / "c2.json").read_text())
    assert record["loop_device"] == loop and record["staged"]["path"] == staging("c2")
    stage_volume(csi, "c2", staging("c2"))  # the retried stage: OK, nothing doubled
    assert len(mounts_at(staging("c2"))) == 1 and loops_of(driver.image("c2")) == [loop]
    publish_volume(csi, "c2", staging("c2"), target("after-crash"))
    unpublish_volume(csi, "c2", target("after-crash"))
    unstage_volume(csi, "c2", staging("c2"))
    assert loops_of(driver.image("c2")) == []


def test_secrets_are_never_logged(
    driver: DriverProcess, csi: CsiClients, staging: PathFor, tmp_path: Path
) -> None:
    create_volume(csi, "s1")
    secret = "hunter2-do-not-log"
    driver.set_faults(
        [{"rpc": "NodeStageVolume", "action": "error", "code": "UNAUTHENTICATED", "times": 1}]
    )
    request = csi_pb2.NodeStageVolumeRequest(
        volume_id="s1",
        staging_target_path=staging("s1"),
        volume_capability=csi_pb2.VolumeCapability(
            mount=csi_pb2.VolumeCapability.MountVolume(fs_type="ext4"),
            access_mode=csi_pb2.VolumeCapability.AccessMode(mode=Mode.SINGLE_NODE_WRITER),
        ),
        secrets={"password": secret},
        volume_context={"visible": "context-value"},
    )
    with pytest.raises(grpc.RpcError):
        csi.node.NodeStageVolume(request, timeout=10)
    csi.node.NodeStageVolume(request, timeout=10)
    unstage_volume(csi, "s1", staging("s1"))
    log = driver.log_text()
    assert "context-value" in log, "requests are logged (at debug level)"
    assert secret not in log and "password" not in log

"""The replay validator: a legal story passes; each kind of violation is caught at its seq."""

from __future__ import annotations

from events.streams import device_stream, pod_stream, podvol_stream
from events.types import (
    DeviceAttached,
    DeviceDetached,
    DeviceMounted,
    DeviceMountUncertain,
    DeviceUnmounted,
    Envelope,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    PodCleanedUp,
    PodRemoved,
    VolumeMounted,
    VolumeUnmounted,
)
from projections.validate import Violation, validate
from tests.projections.builders import T0, History, raw

DEV = device_stream("vol-1")
PV = podvol_stream("pod-a", "data")
POD = pod_stream("pod-a")

ADDED = PodAdded(pod_uid="pod-a", namespace="ns", name="a")
REMOVED = PodRemoved(pod_uid="pod-a", namespace="ns", name="a")
ATTACHED = DeviceAttached(volume_id="vol-1", plugin="csi")
MOUNTED = DeviceMounted(volume_id="vol-1")
PV_MOUNTED = VolumeMounted(volume_id="vol-1", pod_uid="pod-a", volume_name="data")
PV_UNMOUNTED = VolumeUnmounted(volume_id="vol-1", pod_uid="pod-a", volume_name="data")


def _start(op_id: str) -> OperationStarted:
    return OperationStarted(op_id=op_id, operation="mount_device", volume_id="vol-1")


def _ok(op_id: str) -> OperationSucceeded:
    return OperationSucceeded(op_id=op_id, operation="mount_device")


def _failed(op_id: str) -> OperationFailed:
    return OperationFailed(
        op_id=op_id, operation="mount_device", code="Internal", message="x", final=True
    )


def _legal_story() -> History:
    h = History()
    h.add(0, POD, ADDED)
    h.add(1, DEV, _start("op1"))  # operations are allowed in the initial state
    h.add(2, DEV, ATTACHED)
    h.add(2, DEV, _ok("op1"))
    h.add(3, DEV, _start("op2"))
    h.add(4, DEV, DeviceMountUncertain(volume_id="vol-1", reason="timeout"))
    h.add(4, DEV, _failed("op2"))
    h.add(5, DEV, MOUNTED)
    h.add(6, PV, PV_MOUNTED)
    h.add(7, PV, PV_MOUNTED)  # a remount stays Mounted
    h.add(8, POD, REMOVED)
    h.add(9, PV, PV_UNMOUNTED)
    h.add(10, DEV, DeviceUnmounted(volume_id="vol-1"))
    h.add(11, DEV, DeviceDetached(volume_id="vol-1"))
    h.add(12, DEV, ATTACHED)  # a volume may come back
    h.add(13, POD, ADDED)  # and a pod may be re-added
    return h


def _first(envs: list[Envelope]) -> Violation:
    report = validate(envs)
    assert report.violation is not None, "expected a violation"
    return report.violation


def test_a_legal_story_validates() -> None:
    h = _legal_story()
    report = validate(h.envs)
    assert report.ok
    assert (report.events, report.streams, report.last_seq) == (16, 3, 16)


def test_illegal_transition_is_reported_with_seq_stream_state_and_type() -> None:
    h = History()
    h.add(0, DEV, ATTACHED)
    h.add(1, DEV, DeviceDetached(volume_id="vol-1"))
    h.add(2, DEV, MOUNTED)  # Detached -> DeviceMounted is not in the table
    h.add(3, DEV, DeviceDetached(volume_id="vol-1"))  # a later violation is not reported
    v = _first(h.envs)
    assert (v.seq, v.stream, v.state, v.event_type) == (3, DEV, "Detached", "DeviceMounted")
    assert "illegal transition" in v.reason
    assert str(v).startswith(f"seq 3: stream {DEV} in state Detached: DeviceMounted:")
    report = validate(h.envs)
    assert (report.events, report.last_seq) == (2, 2)


def test_event_of_the_other_machine_on_a_stream_is_a_violation() -> None:
    h = History()
    h.add(0, DEV, PV_MOUNTED)
    v = _first(h.envs)
    assert (v.seq, v.state, v.event_type) == (1, "Detached", "VolumeMounted")
    assert "not an event of the device state machine" in v.reason
    h2 = History()
    h2.add(0, PV, ADDED)
    assert _first(h2.envs).reason == "not an event of the podvol state machine"


def test_operation_answer_without_start_is_a_violation() -> None:
    h = History()
    h.add(0, DEV, _start("op1"))
    h.add(1, DEV, _ok("op2"))
    v = _first(h.envs)
    assert (v.seq, v.event_type) == (2, "OperationSucceeded")
    assert "op2" in v.reason


def test_operation_answered_on_another_stream_is_a_violation() -> None:
    h = History()
    h.add(0, DEV, _start("op1"))
    h.add(1, PV, _failed("op1"))
    v = _first(h.envs)
    assert (v.seq, v.stream, v.event_type) == (2, PV, "OperationFailed")


def test_operation_answered_twice_or_started_twice_is_a_violation() -> None:
    h = History()
    h.add(0, DEV, _start("op1"))
    h.add(1, DEV, _ok("op1"))
    h.add(2, DEV, _failed("op1"))
    assert _first(h.envs).seq == 3
    h2 = History()
    h2.add(0, DEV, _start("op1"))
    h2.add(1, DEV, _start("op1"))
    v = _first(h2.envs)
    assert (v.seq, v.reason) == (2, "operation op1 started twice")


def test_version_gap_repeat_and_bad_first_version_are_violations() -> None:
    gap = [raw(1, DEV, 1, ATTACHED), raw(2, DEV, 3, MOUNTED)]
    v = _first(gap)
    assert (v.seq, v.reason) == (2, "version 3 does not follow version 1")
    repeat = [raw(1, DEV, 1, ATTACHED), raw(2, DEV, 1, MOUNTED)]
    assert _first(repeat).seq == 2
    late_start = [raw(1, POD, 1, ADDED), raw(2, DEV, 2, ATTACHED)]
    v = _first(late_start)
    assert (v.seq, v.stream, v.reason) == (2, DEV, "version 2 does not follow version 0")


def test_seq_must_strictly_increase() -> None:
    dup = [raw(1, POD, 1, ADDED), raw(1, DEV, 1, ATTACHED)]
    v = _first(dup)
    assert (v.seq, v.stream, v.reason) == (1, DEV, "seq 1 does not follow seq 1")
    backwards = [raw(5, POD, 1, ADDED), raw(4, DEV, 1, ATTACHED)]
    assert _first(backwards).reason == "seq 4 does not follow seq 5"
    gap_is_fine = [raw(1, POD, 1, ADDED), raw(7, DEV, 1, ATTACHED)]
    assert validate(gap_is_fine).ok  # an export filtered by --after-seq starts anywhere


def test_timestamps_must_not_go_backwards() -> None:
    envs = [raw(1, POD, 1, ADDED, ts=T0 + 10), raw(2, DEV, 1, ATTACHED, ts=T0 + 5)]
    v = _first(envs)
    assert v.seq == 2 and "before the previous event" in v.reason
    same_time = [raw(1, POD, 1, ADDED, ts=T0), raw(2, DEV, 1, ATTACHED, ts=T0)]
    assert validate(same_time).ok


def test_pod_removed_before_added_or_twice_is_a_violation() -> None:
    h = History()
    h.add(0, POD, REMOVED)
    v = _first(h.envs)
    assert (v.seq, v.stream, v.state, v.event_type) == (1, POD, "Absent", "PodRemoved")
    h2 = History()
    h2.add(0, POD, ADDED)
    h2.add(1, POD, REMOVED)
    h2.add(2, POD, REMOVED)
    v = _first(h2.envs)
    assert (v.seq, v.state) == (3, "Removed")


def test_pod_cleaned_up_of_a_desired_pod_never_removed_is_a_violation() -> None:
    cleaned = PodCleanedUp(pod_uid="pod-a", volume_names=("data",))
    h = History()
    h.add(0, POD, ADDED)
    h.add(1, POD, cleaned)
    v = _first(h.envs)
    assert (v.seq, v.state, v.event_type) == (2, "Added", "PodCleanedUp")
    assert v.reason == "PodCleanedUp of a pod that is desired and was never removed"
    ok = History()
    ok.add(0, POD, ADDED)
    ok.add(1, POD, REMOVED)
    ok.add(2, POD, ADDED)  # the same uid applied again before the cleanup was recorded
    ok.add(3, POD, cleaned)
    ok.add(4, pod_stream("found"), PodCleanedUp(pod_uid="found"))  # only reconstruction knew it
    assert validate(ok.envs).ok


def test_non_desired_event_on_a_pod_stream_is_a_violation() -> None:
    h = History()
    h.add(0, POD, ADDED)
    h.add(1, POD, _start("op1"))
    v = _first(h.envs)
    assert (v.seq, v.reason) == (2, "not a desired-state event")


def test_only_the_first_of_several_violations_is_reported() -> None:
    h = _legal_story()
    h.add(14, PV, PV_UNMOUNTED)  # Unmounted -> VolumeUnmounted: illegal (seq 17)
    h.add(15, DEV, MOUNTED)  # Attached -> DeviceMounted is legal
    h.add(16, POD, REMOVED)
    h.add(17, POD, REMOVED)  # second violation (seq 20)
    report = validate(h.envs)
    assert report.violation is not None
    assert (report.violation.seq, report.violation.state) == (17, "Unmounted")
    assert report.events == 16

"""Timelines: segments, time in each state and operation marks, against hand-computed values."""

from __future__ import annotations

from pathlib import Path

from events.log import EventLog
from events.streams import device_stream, pod_stream, podvol_stream
from events.types import (
    DeviceAttached,
    DeviceMounted,
    DeviceMountUncertain,
    DeviceUnmounted,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    PodRemoved,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeResized,
    VolumeUnmounted,
)
from projections.timeline import build_timelines
from tests.projections.builders import T0, History
from volfsm.engine.handler import CommandHandler

S = 1_000_000
DEV = device_stream("vol-1")
PV = podvol_stream("pod-a", "data")


def _device_story(h: History) -> None:
    h.add(0, DEV, OperationStarted(op_id="a1", operation="attach", volume_id="vol-1"))
    h.add(1, DEV, DeviceAttached(volume_id="vol-1", plugin="csi"))
    h.add(1, DEV, OperationSucceeded(op_id="a1", operation="attach", duration_s=1.0))
    h.add(2, DEV, OperationStarted(op_id="m1", operation="mount_device", volume_id="vol-1"))
    h.add(17, DEV, DeviceMountUncertain(volume_id="vol-1", reason="timeout"))
    h.add(
        17,
        DEV,
        OperationFailed(
            op_id="m1",
            operation="mount_device",
            code="DeadlineExceeded",
            message="deadline",
            final=False,
            backoff_s=0.5,
            duration_s=15.0,
        ),
    )
    h.add(17.5, DEV, OperationStarted(op_id="m2", operation="mount_device", volume_id="vol-1"))
    h.add(20, DEV, DeviceMounted(volume_id="vol-1", device_mount_path="/stage"))
    h.add(20, DEV, OperationSucceeded(op_id="m2", operation="mount_device", duration_s=2.5))
    h.add(30, DEV, VolumeResized(volume_id="vol-1", size_bytes=10))


def test_device_segments_and_time_in_state_match_hand_computed_values() -> None:
    h = History()
    _device_story(h)
    h.add(60, pod_stream("pod-z"), PodAdded(pod_uid="pod-z", namespace="ns", name="z"))
    tls = build_timelines(h.envs)
    tl = tls.streams[DEV]
    assert tls.end_us == T0 + 60 * S
    assert [
        (s.state, s.from_us - T0, None if s.to_us is None else s.to_us - T0) for s in tl.segments
    ] == [
        ("Detached", 0, 1 * S),
        ("Attached", 1 * S, 17 * S),
        ("Uncertain", 17 * S, 20 * S),
        ("DeviceGloballyMounted", 20 * S, None),
    ]
    # The resize at 30 s keeps the state: it does not split the open segment.
    assert tl.state == "DeviceGloballyMounted"
    assert tl.time_in_state(tls.end_us) == {
        "Detached": 1 * S,
        "Attached": 16 * S,
        "DeviceGloballyMounted": 40 * S,
        "Uncertain": 3 * S,
    }
    assert tl.time_in_state(T0 + 25 * S)["DeviceGloballyMounted"] == 5 * S
    assert [s.from_seq for s in tl.segments] == [1, 2, 5, 8]
    assert [s.to_seq for s in tl.segments] == [2, 5, 8, None]


def test_operation_marks_carry_status_code_and_backoff() -> None:
    h = History()
    _device_story(h)
    marks = build_timelines(h.envs).streams[DEV].marks
    assert [(m.operation, m.status, m.seq) for m in marks] == [
        ("attach", "started", 1),
        ("attach", "succeeded", 3),
        ("mount_device", "started", 4),
        ("mount_device", "failed", 6),
        ("mount_device", "started", 7),
        ("mount_device", "succeeded", 9),
    ]
    failed = marks[3]
    assert (failed.op_id, failed.code, failed.final, failed.backoff_s) == (
        "m1",
        "DeadlineExceeded",
        False,
        0.5,
    )
    assert failed.duration_s == 15.0
    assert marks[0].code == "" and marks[0].backoff_s is None


def test_stream_starting_with_a_transition_has_no_empty_initial_segment() -> None:
    h = History()
    uncertain = VolumeMountUncertain(
        volume_id="vol-1", pod_uid="pod-a", volume_name="data", reason="reconstructed"
    )
    h.add(5, PV, uncertain)
    h.add(8, PV, VolumeMounted(volume_id="vol-1", pod_uid="pod-a", volume_name="data"))
    h.add(8, PV, VolumeMounted(volume_id="vol-1", pod_uid="pod-a", volume_name="data"))
    h.add(10, PV, VolumeUnmounted(volume_id="vol-1", pod_uid="pod-a", volume_name="data"))
    tl = build_timelines(h.envs).streams[PV]
    assert [(s.state, s.from_us - T0) for s in tl.segments] == [
        ("Uncertain", 5 * S),
        ("Mounted", 8 * S),
        ("Unmounted", 10 * S),
    ]
    assert tl.time_in_state(T0 + 12 * S) == {
        "Unmounted": 2 * S,
        "Mounted": 2 * S,
        "Uncertain": 3 * S,
    }
    assert (tl.kind, tl.pod_uid, tl.volume_name, tl.volume_id) == (
        "podvol",
        "pod-a",
        "data",
        "vol-1",
    )


def test_queries_by_volume_and_pod_and_pod_lifecycle() -> None:
    h = History()
    _device_story(h)
    h.add(21, pod_stream("pod-a"), PodAdded(pod_uid="pod-a", namespace="ns", name="a"))
    h.add(22, PV, OperationStarted(op_id="p1", operation="volume_mount", volume_id="vol-1"))
    h.add(23, PV, VolumeMounted(volume_id="vol-1", pod_uid="pod-a", volume_name="data"))
    other = podvol_stream("pod-b", "x")
    h.add(24, other, VolumeMounted(volume_id="vol-2", pod_uid="pod-b", volume_name="x"))
    h.add(40, pod_stream("pod-a"), PodRemoved(pod_uid="pod-a", namespace="ns", name="a"))
    tls = build_timelines(h.envs)
    assert {tl.stream for tl in tls.for_volume("vol-1")} == {DEV, PV}
    assert [tl.stream for tl in tls.for_pod("pod-a")] == [PV]
    assert [tl.stream for tl in tls.for_pod("pod-b")] == [other]
    pod = tls.pods["pod-a"]
    assert (pod.namespace, pod.name, pod.added_us, pod.removed_us) == (
        "ns",
        "a",
        T0 + 21 * S,
        T0 + 40 * S,
    )
    # The pod-volume opened (Unmounted) at its OperationStarted, mounted a second later.
    assert tls.streams[PV].time_in_state(T0 + 30 * S) == {
        "Unmounted": 1 * S,
        "Mounted": 7 * S,
        "Uncertain": 0,
    }


class _Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def test_timeline_from_a_real_log_with_a_fake_clock(tmp_path: Path) -> None:
    clock = _Clock()
    log = EventLog(tmp_path / "volfsm.db", node="n1", clock=clock)
    handler = CommandHandler(log)
    try:
        handler.fire(DEV, "attach", DeviceAttached(volume_id="vol-1", plugin="csi"))
        clock.now += 2 * S
        handler.fire(
            DEV, "mark_device_uncertain", DeviceMountUncertain(volume_id="vol-1", reason="t")
        )
        clock.now += 500_000
        handler.fire(DEV, "mount_device", DeviceMounted(volume_id="vol-1"))
        clock.now += 90 * S
        handler.fire(DEV, "unmount_device", DeviceUnmounted(volume_id="vol-1"))
        tls = build_timelines(log.read_after(0))
    finally:
        log.close()
    tl = tls.streams[DEV]
    assert [s.state for s in tl.segments] == [
        "Attached",
        "Uncertain",
        "DeviceGloballyMounted",
        "Attached",
    ]
    assert tl.time_in_state(T0 + 100 * S) == {
        "Detached": 0,
        "Attached": 2 * S + 7_500_000,  # 0-2 s, then 92.5-100 s
        "DeviceGloballyMounted": 90 * S,
        "Uncertain": 500_000,
    }

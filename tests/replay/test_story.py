"""The narrative fold: from-states across a window, operation facts, driver calls, summary."""

from __future__ import annotations

from events.streams import device_stream, pod_stream, podvol_stream
from events.types import (
    DesiredVolume,
    DeviceAttached,
    DeviceMounted,
    DeviceMountUncertain,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    PodRemoved,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeSource,
)
from projections.asw import fold
from projections.story import Story, driver_calls, summary_lines
from projections.textfmt import IsoClock, iso_time, relative_text, size_text
from tests.projections.builders import T0, History
from tests.replay.incident import DATA_PV, WEB_UID, envelopes

S = 1_000_000
DEV = device_stream("vol-1")
PV = podvol_stream("pod-a", "data")
CSI = "kubernetes.io/csi:csi.example"


def _stage_story() -> History:
    h = History()
    vol = DesiredVolume(
        name="data", volume_id="vol-1", source=VolumeSource(plugin="kubernetes.io/csi")
    )
    h.add(
        0, pod_stream("pod-a"), PodAdded(pod_uid="pod-a", namespace="ns", name="a", volumes=(vol,))
    )
    start = OperationStarted(
        op_id="m1",
        operation="volume_mount",
        volume_id="vol-1",
        pod_uid="pod-a",
        plugin=CSI,
        reason="desired and not mounted",
    )
    h.add(0.1, PV, start)
    h.add(0.2, DEV, DeviceAttached(volume_id="vol-1", plugin=CSI, attachable=True))
    h.add(15.2, DEV, DeviceMountUncertain(volume_id="vol-1", reason="stage timed out"))
    failed = OperationFailed(
        op_id="m1",
        operation="volume_mount",
        code="DeadlineExceeded",
        message="too slow",
        final=False,
        backoff_s=0.5,
        duration_s=15.1,
    )
    h.add(15.3, PV, failed)
    h.add(
        15.9,
        PV,
        OperationStarted(
            op_id="m2",
            operation="volume_mount",
            volume_id="vol-1",
            pod_uid="pod-a",
            plugin=CSI,
            reason="desired and not mounted",
        ),
    )
    h.add(17.0, DEV, DeviceMounted(volume_id="vol-1", device_mount_path="/stage"))
    h.add(
        17.5,
        PV,
        VolumeMountUncertain(
            volume_id="vol-1", pod_uid="pod-a", volume_name="data", reason="publish timed out"
        ),
    )
    h.add(
        17.6,
        PV,
        VolumeMounted(
            volume_id="vol-1", pod_uid="pod-a", volume_name="data", mount_path="/pods/a/data"
        ),
    )
    h.add(17.7, PV, OperationSucceeded(op_id="m2", operation="volume_mount", duration_s=1.8))
    h.add(30, pod_stream("pod-a"), PodRemoved(pod_uid="pod-a", namespace="ns", name="a"))
    return h


def test_every_line_names_its_subject_and_says_what_happened() -> None:
    story = Story()
    lines = [story.tell(e) for e in _stage_story().envs]
    texts = [f"{line.subject}: {line.text}" for line in lines]
    assert texts == [
        "pod ns/a: desired: pod added (uid pod-a); volumes: data=vol-1",
        "ns/a:data: volume_mount started (op m1): desired and not mounted; "
        "calls NodeStageVolume -> NodePublishVolume via kubernetes.io/csi:csi.example",
        "device vol-1: Detached -> Attached: plugin kubernetes.io/csi:csi.example, attachable",
        "device vol-1: Attached -> Uncertain: stage timed out",
        "ns/a:data: volume_mount failed after 15.100s (op m1): DeadlineExceeded: too slow "
        f"(non-final); backoff 0.5s until {iso_time(T0 + 15_800_000)}",
        "ns/a:data: volume_mount started (op m2, attempt 2): desired and not mounted; "
        "calls NodeStageVolume -> NodePublishVolume via kubernetes.io/csi:csi.example",
        "device vol-1: Uncertain -> DeviceGloballyMounted: staged at /stage",
        "ns/a:data: Unmounted -> Uncertain: publish timed out",
        "ns/a:data: Uncertain -> Mounted: mounted at /pods/a/data",
        "ns/a:data: volume_mount succeeded in 1.800s (op m2)",
        "pod ns/a: desired: pod removed (uid pod-a); unmount pending for data (Mounted)",
    ]
    failed = lines[4]
    assert failed.op is not None
    assert (failed.op.code, failed.op.final, failed.op.backoff_s) == (
        "DeadlineExceeded",
        False,
        0.5,
    )
    assert failed.op.retry_at_us == T0 + 15_800_000
    assert lines[5].op is not None and lines[5].op.attempt == 2
    assert lines[5].op.calls == ("NodeStageVolume", "NodePublishVolume")
    assert (lines[6].from_state, lines[6].to_state) == ("Uncertain", "DeviceGloballyMounted")


def test_a_window_starts_with_the_true_from_state_and_attempt() -> None:
    """Folding the events before a window silently tells the window exactly as a full replay."""
    envs = envelopes()
    full = Story()
    everything = [full.tell(e) for e in envs]
    for start in range(len(envs) + 1):
        story = Story()
        for env in envs[:start]:
            story.absorb(env)
        assert [story.tell(e) for e in envs[start:]] == everything[start:], start
        assert story.asw == full.asw


def test_the_story_keeps_the_same_state_as_the_asw_fold() -> None:
    story = Story()
    for env in envelopes():
        story.tell(env)
    assert story.asw == fold(envelopes())


def test_driver_calls_follow_the_plugin_and_the_device_state() -> None:
    assert driver_calls("volume_mount", CSI, "Attached") == ("NodeStageVolume", "NodePublishVolume")
    assert driver_calls("volume_mount", CSI, "Uncertain") == (
        "NodeStageVolume",
        "NodePublishVolume",
    )
    assert driver_calls("volume_mount", CSI, "DeviceGloballyMounted") == ("NodePublishVolume",)
    assert driver_calls("volume_unmount", CSI, "") == ("NodeUnpublishVolume",)
    assert driver_calls("unmount_device", CSI, "") == ("NodeUnstageVolume",)
    assert driver_calls("mount_device", "kubernetes.io/csi", "") == ("NodeStageVolume",)
    assert driver_calls("volume_fs_resize", CSI, "") == ("NodeExpandVolume",)
    assert driver_calls("volume_mount", "kubernetes.io/empty-dir", "Attached") == ("SetUp",)
    assert driver_calls("volume_unmount", "kubernetes.io/empty-dir", "") == ("TearDown",)
    assert driver_calls("map_volume", "example.com/local", "Attached") == (
        "SetUpDevice",
        "MapPodDevice",
    )
    assert driver_calls("verify_controller_attached_volume", CSI, "") == ()


def test_an_event_on_a_foreign_stream_is_named_not_misread() -> None:
    story = Story()
    line = story.tell(History().add(0, "weird/stream", DeviceAttached(volume_id="v", plugin="p")))
    assert (line.subject, line.text, line.from_state) == ("weird/stream", "DeviceAttached", None)


def test_the_summary_counts_states_and_lists_what_matters() -> None:
    story = Story()
    for env in envelopes():
        story.tell(env)
    summary = story.summary()
    assert summary.seq == len(envelopes())
    assert summary.devices == {"DeviceGloballyMounted": 4}
    assert summary.pod_volumes == {"Unmounted": 4, "Mounted": 2}
    assert summary.desired_pods == [
        "batch/report-1",
        "ci/builder-7",
        "monitoring/metrics-0",
        "shop/cart-0",
    ]
    subjects = [e.subject for e in summary.entries]
    # web-0 is gone and its volumes are unmounted: counted, not listed; its device is detached.
    assert not any("web-0" in s or DATA_PV in s for s in subjects)
    assert len(subjects) == 8
    report = next(e for e in summary.entries if e.subject == "batch/report-1:input")
    assert report.retry_at_us == 1_714_533_000_000_000 + 176_100_000
    text = summary_lines(summary)
    assert text[0] == "state at the end (seq 86, 2024-05-01T03:11:52.100Z):"
    assert text[1] == "  devices: 4 (DeviceGloballyMounted 4)"


def test_pod_names_are_learnt_and_kept_after_removal() -> None:
    story = Story()
    for env in envelopes():
        story.tell(env)
    assert story.pod_names[WEB_UID] == "shop/web-0"
    assert story.subject(podvol_stream(WEB_UID, "data")) == "shop/web-0:data"
    assert story.subject(podvol_stream("unknown-uid", "x")) == "pod unknown-uid:x"


def test_text_helpers() -> None:
    assert iso_time(1_714_533_000_123_456) == "2024-05-01T03:10:00.123Z"
    assert iso_time(None) == ""
    clock = IsoClock()
    assert [clock(t) for t in (5_000, 5_000, 1_000_000, 1_999_999)] == [
        "1970-01-01T00:00:00.005Z",
        "1970-01-01T00:00:00.005Z",
        "1970-01-01T00:00:01.000Z",
        "1970-01-01T00:00:01.999Z",
    ]
    assert relative_text(3 * S, S) == "in 2.000s"
    assert relative_text(S, 3 * S) == "2.000s ago"
    assert relative_text(S, S) == "now"
    assert size_text(None) == "?"
    assert size_text(8 * 1024**3) == "8GiB"
    assert size_text(1536) == "1.5KiB"
    assert size_text(3 * 1024**5) == "3072TiB"

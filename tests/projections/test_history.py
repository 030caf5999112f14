"""Selecting events for `volfsm history`: by stream, volume, pod, time and type."""

from __future__ import annotations

from events.streams import device_stream, pod_stream, podvol_stream
from events.types import (
    DesiredSizeChanged,
    DesiredVolume,
    DeviceAttached,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    PodRemoved,
    VolumeMounted,
    VolumeSource,
)
from projections.history import EventFilter, select
from tests.projections.builders import T0, History

S = 1_000_000


def _history() -> History:
    h = History()
    src = VolumeSource(plugin="kubernetes.io/csi", driver="d")
    vols = (DesiredVolume(name="data", volume_id="vol-1", source=src),)
    h.add(0, pod_stream("a"), PodAdded(pod_uid="a", namespace="ns", name="a", volumes=vols))  # 1
    h.add(1, device_stream("vol-1"), DeviceAttached(volume_id="vol-1", plugin="csi"))  # 2
    h.add(2, device_stream("vol-2"), DeviceAttached(volume_id="vol-2", plugin="csi"))  # 3
    pv = podvol_stream("a", "data")
    h.add(3, pv, OperationStarted(op_id="o1", operation="volume_mount", volume_id="vol-1"))  # 4
    h.add(4, pv, VolumeMounted(volume_id="vol-1", pod_uid="a", volume_name="data"))  # 5
    h.add(4, pv, OperationSucceeded(op_id="o1", operation="volume_mount"))  # 6: no volume_id
    h.add(5, pod_stream("a"), DesiredSizeChanged(volume_id="vol-1", size_bytes=5))  # 7
    other = podvol_stream("b", "x")
    h.add(6, other, VolumeMounted(volume_id="vol-2", pod_uid="b", volume_name="x"))  # 8
    h.add(7, pod_stream("a"), PodRemoved(pod_uid="a", namespace="ns", name="a"))  # 9
    return h


def _seqs(flt: EventFilter) -> list[int]:
    return [e.seq for e in select(_history().envs, flt)]


def test_no_criteria_keeps_everything() -> None:
    assert _seqs(EventFilter()) == list(range(1, 10))


def test_volume_filter_follows_device_pod_volumes_and_desired_events() -> None:
    assert _seqs(EventFilter(volume_id="vol-1")) == [1, 2, 4, 5, 6, 7, 9]
    assert _seqs(EventFilter(volume_id="vol-2")) == [3, 8]


def test_pod_stream_type_and_time_filters() -> None:
    assert _seqs(EventFilter(pod_uid="a")) == [1, 4, 5, 6, 7, 9]
    assert _seqs(EventFilter(pod_uid="b")) == [8]
    assert _seqs(EventFilter(streams=frozenset({device_stream("vol-2")}))) == [3]
    assert _seqs(EventFilter(types=frozenset({"VolumeMounted", "PodRemoved"}))) == [5, 8, 9]
    assert _seqs(EventFilter(since_us=T0 + 4 * S, until_us=T0 + 6 * S)) == [5, 6, 7, 8]


def test_criteria_combine_and_volume_links_survive_a_since_cut() -> None:
    # The pod-volume joined vol-1 at seq 4, before --since; its later events still match.
    assert _seqs(EventFilter(volume_id="vol-1", since_us=T0 + 4 * S)) == [5, 6, 7, 9]
    flt = EventFilter(volume_id="vol-1", pod_uid="a", types=frozenset({"VolumeMounted"}))
    assert _seqs(flt) == [5]

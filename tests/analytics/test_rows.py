"""Flat rows: the JSON fast path equals the envelope path, drivers and phases are named right."""

from __future__ import annotations

import msgspec
import pytest

from events.codec import envelope_to_json
from events.errors import UnknownEventError
from events.streams import object_stream, pod_stream, podvol_stream
from events.types import (
    EVENT_TYPES,
    Envelope,
    ObjectApplied,
    ObjectDeleted,
    PendingVolume,
    PodCleanedUp,
    PodPending,
    VolumeConditionChanged,
    VolumeUsageChanged,
)
from projections.analytics import (
    PHASES,
    STAGE_OF,
    EventRow,
    driver_of,
    flatten,
    flatten_json,
    phase_of,
)
from tests.analytics.scenario import node1, node2
from tests.analytics.sim import SimNode, csi_vid, mixed_workload
from volfsm.engine import operations


def sample_envelopes() -> list[Envelope]:
    sim = SimNode("n9")
    mixed_workload(sim, pods=60, seed=3)
    uid = "n9-pod0"
    sim.emit(pod_stream(uid), PodCleanedUp(pod_uid=uid, volume_names=("v0",)), 1_000)
    vol = {"volume_id": "v9", "pod_uid": "n9-pod1", "volume_name": "v0"}
    claim = {"namespace": "default", "claim": "data"}
    stream = podvol_stream("n9-pod1", "v0")
    sim.emit(stream, VolumeUsageChanged(**vol, **claim, capacity_bytes=100, used_bytes=95), 10)
    sim.emit(stream, VolumeConditionChanged(**vol, **claim, abnormal=True, message="I/O"), 10)
    cm = {"kind": "ConfigMap", "namespace": "default", "name": "cm", "uid": "u-cm"}
    objects = object_stream("ConfigMap", "default", "cm")
    sim.emit(objects, ObjectApplied(**cm, resource_version=1, content_hash="sha256:0"), 10)
    sim.emit(objects, ObjectDeleted(**cm, resource_version=2), 10)
    waits = PendingVolume(name="v0", waits_for="PersistentVolumeClaim default/p-v0", reason="x")
    pending = PodPending(pod_uid="n9-p", namespace="default", name="p", waiting=(waits,))
    sim.emit(pod_stream("n9-p"), pending, 10)
    return node1() + node2() + sim.envs


def test_the_samples_cover_every_event_type() -> None:
    assert {e.type for e in sample_envelopes()} >= set(EVENT_TYPES) - {
        "DesiredSizeChanged",
        "DeviceDetached",
    }


def test_flatten_json_equals_flatten_for_every_envelope() -> None:
    for env in sample_envelopes():
        assert flatten_json(envelope_to_json(env)) == flatten(env), env


def test_an_old_schema_body_goes_through_the_upcaster() -> None:
    old = (
        b'{"seq":7,"stream":"device/v","version":2,"type":"OperationFailed","schema":1,'
        b'"ts":5,"node":"n1","body":{"type":"OperationFailed","op_id":"o","operation":'
        b'"unmount_device","error":"Internal: boom","retriable":true,"backoff_ms":500}}'
    )
    row = flatten_json(old)
    assert (row.type, row.op_id, row.code, row.final, row.volume_id) == (
        "OperationFailed",
        "o",
        "Internal",
        False,
        "v",
    )


def test_unreadable_events_raise() -> None:
    with pytest.raises(msgspec.DecodeError):
        flatten_json(b"not json")
    future = (
        b'{"seq":1,"stream":"device/v","version":1,"type":"VolumeTeleported","schema":1,'
        b'"ts":5,"node":"n1","body":{"type":"VolumeTeleported"}}'
    )
    with pytest.raises(UnknownEventError):
        flatten_json(future)


def test_row_columns_for_an_operation_start() -> None:
    env = node1()[1]
    assert flatten(env) == EventRow(
        node="n1",
        seq=2,
        ts_us=env.ts,
        type="OperationStarted",
        kind="operation",
        stream="podvol/p1/data",
        volume_id=csi_vid("ebs.csi.aws.com", "v1"),
        pod_uid="p1",
        volume_name="data",
        driver="ebs.csi.aws.com",
        operation="volume_mount",
        op_id="o1",
    )


@pytest.mark.parametrize(
    ("plugin", "volume_id", "driver"),
    [
        ("kubernetes.io/csi:ebs.csi.aws.com", "", "ebs.csi.aws.com"),
        ("", "kubernetes.io/csi/pd.csi.storage.gke.io^proj/disk-1", "pd.csi.storage.gke.io"),
        ("kubernetes.io/csi:a", "kubernetes.io/csi/b^h", "a"),
        ("kubernetes.io/empty-dir", "kubernetes.io/empty-dir/uid-cache", "kubernetes.io/empty-dir"),
        ("", "kubernetes.io/empty-dir/uid-cache", "kubernetes.io/empty-dir"),
        ("", "", ""),
        ("", "plain-id", ""),
    ],
)
def test_driver_of(plugin: str, volume_id: str, driver: str) -> None:
    assert driver_of(plugin, volume_id) == driver


def test_phases_use_the_engines_operation_names() -> None:
    engine_names = {
        operations.VOLUME_MOUNT,
        operations.MAP_VOLUME,
        operations.VOLUME_UNMOUNT,
        operations.UNMAP_VOLUME,
        operations.UNMOUNT_DEVICE,
        operations.UNMAP_DEVICE,
        operations.EXPAND_VOLUME,
    }
    assert engine_names == set(PHASES) - set(STAGE_OF.values())
    assert set(STAGE_OF) == {operations.VOLUME_MOUNT, operations.MAP_VOLUME}
    assert [phase_of(n) for n in ("volume_mount", "unmount_device", "volume_fs_resize")] == [
        "publish",
        "unstage",
        "expand",
    ]
    assert phase_of(operations.MARK_DETACHED) == "other"

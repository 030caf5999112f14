"""`Asw.fold_rows` (the start's fold: stored rows, bodies decoded as views) folds like `apply`.

The log has every event type, on the streams it belongs to and, now and
then, on any other stream (the fold must take any log), with operation ids
that match and do not, states that move and moves that are illegal,
entries that are deleted and come back.
"""

from __future__ import annotations

import itertools
import random
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from events.errors import UnknownEventError
from events.log import ANY_VERSION, EventLog
from events.streams import device_stream, object_stream, pod_stream, podvol_stream
from events.types import (
    EVENT_TYPES,
    Body,
    DesiredSizeChanged,
    DesiredVolume,
    DeviceAttached,
    DeviceDetached,
    DeviceMounted,
    DeviceMountUncertain,
    DeviceUnmounted,
    ObjectApplied,
    ObjectDeleted,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PendingVolume,
    PodAdded,
    PodCleanedUp,
    PodPending,
    PodRemoved,
    VolumeConditionChanged,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeResized,
    VolumeSource,
    VolumeUnmounted,
    VolumeUsageChanged,
)
from projections.asw import Asw, fold

UIDS = ("u1", "u2")
NAMES = ("data", "cache")
VOLUMES = ("v1", "v2")
OPS = ("o1", "o2")
SOURCE = VolumeSource(plugin="kubernetes.io/csi", driver="fold.volfsm.io")

Maker = Callable[[random.Random, str, str, str], Body]
"""(random, pod uid, volume name, volume id) -> a body."""


def _op(r: random.Random) -> str:
    return r.choice(OPS)


MAKERS: dict[str, Maker] = {
    "PodAdded": lambda r, uid, name, vid: PodAdded(
        pod_uid=uid,
        namespace="ns",
        name="p",
        volumes=(DesiredVolume(name=name, volume_id=vid, source=SOURCE),),
    ),
    "PodRemoved": lambda r, uid, name, vid: PodRemoved(pod_uid=uid, namespace="ns", name="p"),
    "PodCleanedUp": lambda r, uid, name, vid: PodCleanedUp(pod_uid=uid, volume_names=NAMES),
    "DesiredSizeChanged": lambda r, uid, name, vid: DesiredSizeChanged(
        volume_id=vid, size_bytes=r.choice((1, 2))
    ),
    "PodPending": lambda r, uid, name, vid: PodPending(
        pod_uid=uid,
        namespace="ns",
        name="p",
        waiting=(PendingVolume(name=name, waits_for="ConfigMap ns/c"),),
    ),
    "ObjectApplied": lambda r, uid, name, vid: ObjectApplied(
        kind="ConfigMap",
        namespace="ns",
        name="c",
        uid="c1",
        resource_version=r.randint(1, 9),
        content_hash="sha256:00",
        keys=("k",),
    ),
    "ObjectDeleted": lambda r, uid, name, vid: ObjectDeleted(
        kind="ConfigMap", namespace="ns", name="c", uid="c1", resource_version=9
    ),
    "DeviceAttached": lambda r, uid, name, vid: DeviceAttached(
        volume_id=vid,
        plugin=r.choice(("csi", "emptydir")),
        attachable=r.choice((True, False)),
        device_path=r.choice(("", "/dev/vdb")),
    ),
    "DeviceMounted": lambda r, uid, name, vid: DeviceMounted(
        volume_id=vid, device_mount_path=f"/stage/{vid}", mount_found=r.choice((True, False))
    ),
    "DeviceMountUncertain": lambda r, uid, name, vid: DeviceMountUncertain(
        volume_id=vid,
        reason="timeout",
        reconstructed=r.choice((True, False)),
        device_mount_path=r.choice(("", f"/stage/{vid}")),
    ),
    "DeviceUnmounted": lambda r, uid, name, vid: DeviceUnmounted(
        volume_id=vid, reason=r.choice(("", "unstaged"))
    ),
    "DeviceDetached": lambda r, uid, name, vid: DeviceDetached(volume_id=vid),
    "VolumeResized": lambda r, uid, name, vid: VolumeResized(
        volume_id=vid, size_bytes=r.choice((1, 2))
    ),
    "VolumeMounted": lambda r, uid, name, vid: VolumeMounted(
        volume_id=vid,
        pod_uid=uid,
        volume_name=name,
        mount_path=r.choice(("", f"/pods/{uid}/{name}")),
        contents=r.choice(("", "written: ConfigMap ns/c rv=3")),
    ),
    "VolumeMountUncertain": lambda r, uid, name, vid: VolumeMountUncertain(
        volume_id=vid,
        pod_uid=uid,
        volume_name=name,
        reason="publish timed out",
        reconstructed=r.choice((True, False)),
    ),
    "VolumeUnmounted": lambda r, uid, name, vid: VolumeUnmounted(
        volume_id=vid, pod_uid=uid, volume_name=name, reason=r.choice(("", "gone"))
    ),
    "OperationStarted": lambda r, uid, name, vid: OperationStarted(
        op_id=_op(r),
        operation=r.choice(("volume_mount", "mount_device")),
        volume_id=r.choice(("", vid)),
        pod_uid=uid,
        plugin="csi",
    ),
    "OperationSucceeded": lambda r, uid, name, vid: OperationSucceeded(
        op_id=_op(r), operation="volume_mount", duration_s=0.5
    ),
    "OperationFailed": lambda r, uid, name, vid: OperationFailed(
        op_id=_op(r),
        operation="volume_mount",
        code=r.choice(("Internal", "DeadlineExceeded")),
        message="boom",
        final=r.choice((True, False)),
        backoff_s=r.choice((0.0, 0.5)),
    ),
    "VolumeConditionChanged": lambda r, uid, name, vid: VolumeConditionChanged(
        volume_id=vid,
        pod_uid=uid,
        volume_name=name,
        abnormal=r.choice((True, False)),
        message=r.choice(("", "disk failing")),
    ),
    "VolumeUsageChanged": lambda r, uid, name, vid: VolumeUsageChanged(
        volume_id=vid,
        pod_uid=uid,
        volume_name=name,
        namespace="ns",
        claim="c",
        capacity_bytes=r.choice((0, 100)),
        used_bytes=r.choice((0, 40)),
    ),
}

HOME: dict[str, tuple[str, ...]] = {
    "desired": ("pod",),
    "object": ("object",),
    "device": ("device",),
    "podvol": ("podvol",),
    "operation": ("device", "podvol"),
    "observation": ("podvol",),
}
"""Body KIND -> the kinds of stream it is written to (and, rarely, any other)."""


def _stream(kind: str, uid: str, name: str, vid: str) -> str:
    if kind == "device":
        return device_stream(vid)
    if kind == "podvol":
        return podvol_stream(uid, name)
    if kind == "pod":
        return pod_stream(uid)
    return object_stream("ConfigMap", "ns", "c")


def _steps(seed: int, count: int) -> Iterator[tuple[str, list[Body]]]:
    """`count` appends of 1-3 bodies of random types, each type on its own kind of stream."""
    r = random.Random(seed)
    types = sorted(MAKERS)
    for _ in range(count):
        uid, name, vid = r.choice(UIDS), r.choice(NAMES), r.choice(VOLUMES)
        type_name = r.choice(types)
        kinds = HOME[EVENT_TYPES[type_name].KIND]
        kind = r.choice(("device", "podvol", "pod", "object")) if r.random() < 0.05 else None
        stream = _stream(kind or r.choice(kinds), uid, name, vid)
        bodies = [MAKERS[type_name](r, uid, name, vid)]
        for _ in range(r.randint(0, 2)):  # more of the same stream's kinds
            more = r.choice([t for t in types if set(HOME[EVENT_TYPES[t].KIND]) & set(kinds)])
            bodies.append(MAKERS[more](r, uid, name, vid))
        yield stream, bodies


def _write(log: EventLog, seed: int, count: int) -> int:
    last = 0
    for stream, bodies in _steps(seed, count):
        last = log.append(stream, ANY_VERSION, bodies)[-1].seq
    return last


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    ticks = itertools.count(1_700_000_000_000_000, 1000)
    with EventLog(tmp_path / "volfsm.db", node="n1", clock=lambda: next(ticks)) as opened:
        yield opened


def _fast(log: EventLog, after: int = 0, until: int | None = None, into: Asw | None = None) -> Asw:
    asw = into if into is not None else Asw()
    with log.scan_fold(after, until) as rows:
        asw.fold_rows(rows)
    return asw


def _shape(asw: Asw) -> list[Any]:
    """What `==` on the ASW does not compare: dict orders, and which errors are the last op."""
    return [
        list(asw.devices),
        list(asw.podvols),
        list(asw.desired_pods),
        list(asw.desired_sizes),
        [e.last_error is e.last_operation for e in asw.devices.values()],
        [e.last_error is e.last_operation for e in asw.podvols.values()],
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_fast_fold_folds_every_event_type_like_apply(log: EventLog, seed: int) -> None:
    last = _write(log, seed, 1500)
    envelopes = list(log.read_after(0))
    assert {e.type for e in envelopes} == set(EVENT_TYPES)  # every type is in the log
    want = fold(envelopes)
    got = _fast(log)
    assert got == want
    assert _shape(got) == _shape(want)
    assert (got.last_seq, got.last_ts) == (last, envelopes[-1].ts)
    for cut in (len(envelopes) // 3, len(envelopes) // 2):  # states on the way too
        part, want_part = _fast(log, until=cut), fold(envelopes[:cut])
        assert part == want_part and _shape(part) == _shape(want_part)


def test_a_fold_in_pieces_equals_one_fold(log: EventLog) -> None:
    last = _write(log, 4, 800)
    whole = _fast(log)
    pieces = Asw()
    for after, until in ((0, 300), (300, 301), (301, 1000), (1000, last)):
        with log.scan_fold(after, until) as rows:
            assert pieces.fold_rows(rows) == (min(until, last), min(until, last) - after)
    assert pieces == whole and _shape(pieces) == _shape(whole)
    with log.scan_fold(last) as rows:
        assert pieces.fold_rows(rows) == (last, 0)  # nothing after the end
    assert pieces.last_seq == last


def test_hooks_get_every_body_of_their_types_in_full(log: EventLog) -> None:
    _write(log, 5, 600)
    envelopes = list(log.read_after(0))
    seen: list[tuple[Body, int]] = []

    def hook(body: Any, version: int) -> None:
        seen.append((body, version))

    hooked = Asw()
    with log.scan_fold() as rows:
        hooked.fold_rows(rows, {cls: hook for cls in EVENT_TYPES.values()})
    assert seen == [(e.body, e.version) for e in envelopes]
    assert hooked == fold(envelopes)


def test_a_split_fold_equals_the_whole(log: EventLog) -> None:
    """Pod-volume rows folded apart (the child of a split start) plus the rest (with_podvols
    False): the same ASW."""
    last = _write(log, 6, 800)
    rest = Asw()
    with log.scan_fold(prefix="podvol/", other_streams=True) as rows:
        rest.fold_rows(rows, with_podvols=False)
    part = Asw()
    with log.scan_fold(prefix="podvol/", also_types=("PodCleanedUp",)) as rows:
        part.fold_rows(rows)
    whole = _fast(log)
    assert not rest.podvols and part.podvols
    rest.podvols.update(part.podvols)
    assert rest.podvols == whole.podvols and list(rest.podvols) == list(whole.podvols)
    assert rest.devices == whole.devices and rest.desired_pods == whole.desired_pods
    assert max(rest.last_seq, part.last_seq) == last


@pytest.mark.parametrize("schema", [1, 7])
def test_a_type_this_build_does_not_know_is_refused(tmp_path: Path, schema: int) -> None:
    path = tmp_path / "volfsm.db"
    with EventLog(path, node="n1") as log:
        log.append("device/v1", 0, [DeviceDetached(volume_id="v1")])
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO events (seq, stream, version, type, schema, ts, node, body) "
        "VALUES (2, 'device/v1', 2, 'Bogus', ?, 1, 'n1', ?)",
        (schema, msgspec.msgpack.encode({"type": "Bogus", "volume_id": "v1"})),
    )
    conn.commit()
    conn.close()
    with (
        EventLog(path, node="n1") as log,
        log.scan_fold() as rows,
        pytest.raises(UnknownEventError, match="unknown event type 'Bogus'"),
    ):
        Asw().fold_rows(rows)

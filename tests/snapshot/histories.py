"""Event histories for the snapshot tests, and the engine state they fold to.

`histories()` draws appends of every event type over a few pods, volumes
and operation ids, legal or not (the fold must take any log), with the
cases a snapshot codec can get wrong: a pod re-added or replaced under the
same name, sizes of volumes no pod wants, a failed operation that later
succeeds (its record is then both `last_operation` and `last_error`),
detached devices. `random_history(seed, n)` draws the same kinds of steps
without hypothesis, for fixed logs.
"""

from __future__ import annotations

import contextlib
import random
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from events.log import ANY_VERSION, EventLog
from events.streams import device_stream, pod_stream, podvol_stream
from events.types import (
    Body,
    DesiredSizeChanged,
    DesiredVolume,
    DeviceAttached,
    DeviceDetached,
    DeviceMounted,
    DeviceMountUncertain,
    DeviceUnmounted,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PendingVolume,
    PodAdded,
    PodCleanedUp,
    PodPending,
    PodRemoved,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeResized,
    VolumeSource,
    VolumeUnmounted,
)
from projections.asw import Asw
from volfsm.desired.dsw import DesiredStateOfWorld
from volfsm.engine.index import EngineIndex
from volfsm.engine.snapshot import fold_log

UIDS = ("u1", "u2", "u3")
NAMES = ("data", "cache")
VOLUMES = ("v1", "v2", "v3")
OP_IDS = ("o1", "o2", "o3")
GI = 1 << 30
SOURCE = VolumeSource(plugin="kubernetes.io/csi", driver="snap.volfsm.io")

Step = tuple[str, list[Body]]
"""One append: a stream and its bodies."""


class StepClock:
    """UTC µs, 1 ms later at every commit."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000_000

    def __call__(self) -> int:
        self.now += 1000
        return self.now


# ------------------------------------------------------------------ bodies


def _pod_added(r: Any, uid: str) -> PodAdded:
    names = r.sample(NAMES, r.randint(0, 2))
    vols = tuple(
        DesiredVolume(
            name=n,
            volume_id=r.choice(VOLUMES),
            source=SOURCE,
            size_bytes=r.choice((None, GI, 2 * GI)),
        )
        for n in names
    )
    return PodAdded(pod_uid=uid, namespace="ns", name=r.choice(("a", "b")), volumes=vols)


def _operation(r: Any, vid: str, uid: str) -> Body:
    op_id = r.choice(OP_IDS)
    kind = r.randint(0, 2)
    if kind == 0:
        return OperationStarted(op_id=op_id, operation="volume_mount", volume_id=vid, pod_uid=uid)
    if kind == 1:
        return OperationSucceeded(op_id=op_id, operation="volume_mount", duration_s=0.1)
    return OperationFailed(
        op_id=op_id,
        operation="volume_mount",
        code=r.choice(("Internal", "DeadlineExceeded")),
        message="boom",
        final=r.choice((True, False)),
        backoff_s=r.choice((0.0, 0.5, 3600.0)),
    )


def _device_body(r: Any, vid: str) -> Body:
    kind = r.randint(0, 6)
    if kind == 0:
        return DeviceAttached(volume_id=vid, plugin="csi", attachable=r.choice((True, False)))
    if kind == 1:
        return DeviceMounted(volume_id=vid, device_mount_path=f"/stage/{vid}")
    if kind == 2:
        return DeviceMountUncertain(
            volume_id=vid,
            reason="timeout",
            reconstructed=r.choice((True, False)),
            device_mount_path=r.choice(("", f"/stage/{vid}")),
        )
    if kind == 3:
        return DeviceUnmounted(volume_id=vid, reason="unstaged")
    if kind == 4:
        return DeviceDetached(volume_id=vid)
    if kind == 5:
        return VolumeResized(volume_id=vid, size_bytes=r.choice((GI, 2 * GI)))
    return _operation(r, vid, "")


def _podvol_body(r: Any, uid: str, name: str) -> Body:
    vid = r.choice(VOLUMES)
    kind = r.randint(0, 3)
    if kind == 0:
        return VolumeMounted(
            volume_id=vid, pod_uid=uid, volume_name=name, mount_path=f"/pods/{uid}/{name}"
        )
    if kind == 1:
        return VolumeMountUncertain(
            volume_id=vid,
            pod_uid=uid,
            volume_name=name,
            reason="publish timed out",
            reconstructed=r.choice((True, False)),
        )
    if kind == 2:
        return VolumeUnmounted(volume_id=vid, pod_uid=uid, volume_name=name, reason="gone")
    return _operation(r, vid, uid)


def draw_step(r: Any) -> Step:
    """One append drawn with `r` (a `random.Random`, or hypothesis' `st.randoms()`)."""
    what = r.randint(0, 9)
    uid = r.choice(UIDS)
    if what == 1 and r.randint(0, 3) == 0:  # pending: waits for its claim, mounts nothing
        waits = PendingVolume(name=r.choice(NAMES), waits_for="PersistentVolumeClaim ns/c")
        return pod_stream(uid), [
            PodPending(pod_uid=uid, namespace="ns", name="a", waiting=(waits,))
        ]
    if what <= 1:
        return pod_stream(uid), [_pod_added(r, uid)]
    if what == 2:
        removed: list[Body] = [PodRemoved(pod_uid=uid, namespace="ns", name="a")]
        if r.randint(0, 2) == 0:  # and cleaned up: the fold forgets its Unmounted entries
            removed.append(PodCleanedUp(pod_uid=uid, volume_names=NAMES))
        return pod_stream(uid), removed
    if what == 3:
        return pod_stream(uid), [
            DesiredSizeChanged(volume_id=r.choice(VOLUMES), size_bytes=r.choice((GI, 3 * GI)))
        ]
    if what <= 6:
        vid = r.choice(VOLUMES)
        return device_stream(vid), [_device_body(r, vid) for _ in range(r.randint(1, 3))]
    name = r.choice(NAMES)
    return podvol_stream(uid, name), [_podvol_body(r, uid, name) for _ in range(r.randint(1, 3))]


@st.composite
def histories(draw: st.DrawFn, max_steps: int = 60) -> list[Step]:
    """A list of appends (hypothesis shrinks it towards fewer, simpler steps)."""
    r = draw(st.randoms(use_true_random=False))
    n = draw(st.integers(min_value=1, max_value=max_steps))
    return [draw_step(r) for _ in range(n)]


def random_history(seed: int, steps: int) -> list[Step]:
    """`steps` appends drawn from a seeded generator."""
    r = random.Random(seed)
    return [draw_step(r) for _ in range(steps)]


def fold_settings(max_examples: int) -> settings:
    """Hypothesis settings for the fold properties: no deadline (they write a log each)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@contextlib.contextmanager
def temp_log() -> Iterator[EventLog]:
    """A fresh log in a temporary directory (hypothesis tests cannot use `tmp_path`)."""
    with (
        tempfile.TemporaryDirectory(prefix="volfsm-snap-") as tmp,
        EventLog(Path(tmp) / "volfsm.db", node="n1", clock=StepClock()) as log,
    ):
        yield log


def write_history(log: EventLog, steps: Sequence[Step]) -> int:
    """Append every step (one transaction each); the last seq."""
    for stream, bodies in steps:
        log.append(stream, ANY_VERSION, bodies)
    return log.last_seq()


# ------------------------------------------------------------ engine state

EngineParts = tuple[Asw, DesiredStateOfWorld, EngineIndex]


def fresh_parts() -> EngineParts:
    """An empty ASW, DSW and index, wired as the engine wires them."""
    asw = Asw()
    dsw = DesiredStateOfWorld(lambda source, mode: None)
    return asw, dsw, EngineIndex(dsw)


def full_fold(log: EventLog, until: int | None = None) -> EngineParts:
    """ASW, DSW and index folded from the first event (up to `until`)."""
    parts = fresh_parts()
    fold_log(log, *parts, until=until)
    return parts


def state_view(parts: EngineParts) -> dict[str, Any]:
    """Everything the three folds hold that a later event or query can tell apart.

    Order is kept where a query reports it (dict insertion orders of the
    entries, pods, sizes, holders); `shared` says where `last_error` is the
    same object as `last_operation`, which decides how a later outcome of
    that operation folds.
    """
    asw, dsw, index = parts
    by_volume = dsw._by_volume
    return {
        "devices": list(asw.devices.items()),
        "podvols": list(asw.podvols.items()),
        "shared": sorted(
            str(key)
            for key, entry in [*asw.devices.items(), *asw.podvols.items()]
            if entry.last_error is not None and entry.last_error is entry.last_operation
        ),
        "desired_pods": list(asw.desired_pods.items()),
        "desired_sizes": list(asw.desired_sizes.items()),
        "seq_ts": (asw.last_seq, asw.last_ts),
        "dsw_pods": list(dsw.pods.items()),
        "dsw_by_name": list(dsw._by_name.items()),
        "dsw_entries": list(dsw._entries.items()),
        "dsw_by_volume": {vid: list(users) for vid, users in by_volume.items()},
        "dsw_sizes": list(dsw._sizes.items()),
        "dsw_generation": dsw.generation,
        "dsw_pending": list(dsw.pending.items()),
        "to_mount": list(dsw.volumes_to_mount()),
        "removed_pods": list(index.removed_pods.items()),
        "removed_volumes": list(index.removed_volumes.items()),
        "holders": list(index.holders.items()),
        "detached_versions": list(index.detached_versions.items()),
    }

"""The snapshot body of format 2: each desired pod stored once, pod-volume entries in chunks.

A restore from it gives exactly the state of the fold, with the ASW's
desired pods being the DSW's pod objects and the pod-volume entries keyed
by the DSW's key tuples; a snapshot of format 1 (the whole state in one
msgpack, every desired pod twice) is refused by its version and the log
replayed.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import msgspec

from events.log import ANY_VERSION, EventLog
from events.streams import pod_stream, podvol_stream
from events.types import DesiredVolume, PendingVolume, PodAdded, PodPending, VolumeMounted
from projections.snapshot import AswSnapshot, snapshot_asw
from volfsm.desired.dsw import DswSnapshot
from volfsm.engine.index import IndexSnapshot
from volfsm.engine.snapshot import (
    FORMAT_VERSION,
    KIND,
    encode_state,
    fold_fingerprint,
    restore,
    save_state,
)

from .histories import (
    SOURCE,
    StepClock,
    fresh_parts,
    full_fold,
    random_history,
    state_view,
    write_history,
)

PENDING = "pending-after-added"


class V1State(msgspec.Struct, array_like=True, frozen=True):
    """The body of a format-1 snapshot (before zlib)."""

    seq: int
    asw: AswSnapshot
    dsw: DswSnapshot
    index: IndexSnapshot


def _history(log: EventLog) -> int:
    """A long random history, then pods that stay desired with a mounted volume each and a
    pod that was added and is now pending (the ASW keeps its PodAdded, the DSW holds it as
    pending); the last seq."""
    write_history(log, random_history(seed=21, steps=1500))
    for uid in ("kept-1", "kept-2", PENDING):
        vid = f"vol-{uid}"
        volume = DesiredVolume(name="data", volume_id=vid, source=SOURCE)
        added = PodAdded(pod_uid=uid, namespace="ns", name=uid, volumes=(volume,))
        log.append(pod_stream(uid), ANY_VERSION, [added])
        mounted = VolumeMounted(volume_id=vid, pod_uid=uid, volume_name="data")
        log.append(podvol_stream(uid, "data"), ANY_VERSION, [mounted])
    waits = PendingVolume(name="data", reason="NoClaim", waits_for="claim:ns/c")
    log.append(
        pod_stream(PENDING),
        ANY_VERSION,
        [PodPending(pod_uid=PENDING, namespace="ns", name=PENDING, waiting=(waits,))],
    )
    return log.last_seq()


def test_a_restore_of_format_2_is_the_fold_with_each_object_once(tmp_path: Path) -> None:
    with EventLog(tmp_path / "volfsm.db", node="n1", clock=StepClock()) as log:
        last = _history(log)
        folded = full_fold(log)
        asw, dsw, _ = folded
        assert any(dsw.pods.get(uid) is not pod for uid, pod in asw.desired_pods.items())
        save_state(log, last, encode_state(*folded, seq=last))
        parts = fresh_parts()
        report = restore(log, *parts)
    assert report.snapshot is not None and report.snapshot.format_version == FORMAT_VERSION == 2
    assert report.events_replayed == 0
    assert state_view(parts) == state_view(folded)
    asw, dsw, _ = parts
    entries = dsw.desired_entries()
    assert all(pod is dsw.pods[uid] for uid, pod in asw.desired_pods.items() if uid in dsw.pods)
    assert PENDING in asw.desired_pods and PENDING in dsw.pending
    dsw_keys = {key: key for key in entries}
    both = [key for key in asw.podvols if key in dsw_keys]
    assert both and all(key is dsw_keys[key] for key in both)


def test_a_format_1_snapshot_is_refused_and_the_log_replayed(tmp_path: Path) -> None:
    with EventLog(tmp_path / "volfsm.db", node="n1", clock=StepClock()) as log:
        last = _history(log)
        asw, dsw, index = full_fold(log)
        old = V1State(last, snapshot_asw(asw), dsw.export_state(), index.export_state())
        log.snapshots.save(
            kind=KIND,
            format_version=1,
            fingerprint=fold_fingerprint(),
            seq=last,
            body=zlib.compress(msgspec.msgpack.encode(old)),
            keep=3,
            chunk_bytes=1 << 20,
        )
        parts = fresh_parts()
        report = restore(log, *parts)
        assert report.snapshot is None
        assert report.refused == (
            f"{log.snapshots.headers(KIND)[0].describe()}: format version 1, "
            f"this build reads {FORMAT_VERSION}",
        )
        assert report.events_replayed == last
        assert state_view(parts) == state_view(full_fold(log))

"""Per-volume and per-pod timelines: the states an FSM went through and when.

A timeline covers one device stream or one pod-volume stream. It opens in
the table's initial state at the stream's first event; every transition
that changes the state closes the current segment and opens the next.
Operation records become marks (started / succeeded / failed with code).
Transitions that keep the state (a resize, a remount) do not split a
segment. The last segment is open (`to_us` None) until the state changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from events.streams import DEVICE_PREFIX, PODVOL_PREFIX, stream_kind
from events.tables import FsmTable, table_for_stream_kind
from events.types import (
    Envelope,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    PodPending,
    PodRemoved,
)
from projections.pending import PendingPods


@dataclass(slots=True)
class Segment:
    """A stretch of time an FSM spent in one state."""

    state: str
    from_us: int
    from_seq: int
    to_us: int | None = None
    to_seq: int | None = None

    def duration_us(self, end_us: int) -> int:
        """Length of the segment; an open one is measured up to `end_us`."""
        stop = self.to_us if self.to_us is not None else end_us
        return max(0, stop - self.from_us)


@dataclass(slots=True)
class OperationMark:
    """One operation record on a timeline."""

    seq: int
    ts: int
    op_id: str
    operation: str
    status: str
    code: str = ""
    message: str = ""
    final: bool | None = None
    backoff_s: float | None = None
    duration_s: float | None = None


@dataclass(slots=True)
class Timeline:
    """The state history of one device or pod-volume stream."""

    stream: str
    kind: str
    states: tuple[str, ...]
    segments: list[Segment] = field(default_factory=list)
    marks: list[OperationMark] = field(default_factory=list)
    volume_id: str = ""
    pod_uid: str = ""
    volume_name: str = ""
    last_us: int = 0

    @property
    def state(self) -> str:
        """The state at the end of the timeline."""
        return self.segments[-1].state

    def time_in_state(self, end_us: int | None = None) -> dict[str, int]:
        """Total µs spent in each of the FSM's states (0 for states never entered).

        The open last segment counts up to `end_us` (default: this stream's last event).
        """
        end = end_us if end_us is not None else self.last_us
        totals = dict.fromkeys(self.states, 0)
        for seg in self.segments:
            totals[seg.state] = totals.get(seg.state, 0) + seg.duration_us(end)
        return totals


@dataclass(slots=True)
class PodLifecycle:
    """When a pod entered and left the desired state."""

    pod_uid: str
    namespace: str = ""
    name: str = ""
    added_us: int | None = None
    removed_us: int | None = None


@dataclass(slots=True)
class Timelines:
    """Every timeline of a log (or a slice of it), keyed by stream."""

    streams: dict[str, Timeline] = field(default_factory=dict)
    pods: dict[str, PodLifecycle] = field(default_factory=dict)
    end_us: int = 0
    pending: PendingPods = field(default_factory=PendingPods)
    """The pods' waits for their claims (a pending pod has no pod-volume timeline)."""

    def apply(self, env: Envelope) -> None:
        """Fold one envelope (in `seq` order)."""
        self.end_us = max(self.end_us, env.ts)
        kind = stream_kind(env.stream)
        table = table_for_stream_kind(kind)
        if table is not None:
            self._apply_fsm(env, kind, table)
        elif kind == "pod":
            self._apply_pod(env)

    def _timeline(self, env: Envelope, kind: str, table: FsmTable) -> Timeline:
        tl = self.streams.get(env.stream)
        if tl is None:
            tl = Timeline(stream=env.stream, kind=kind, states=table.states)
            tl.segments.append(Segment(table.initial, env.ts, env.seq))
            if kind == "device":
                tl.volume_id = env.stream[len(DEVICE_PREFIX) :]
            else:
                uid, _, name = env.stream[len(PODVOL_PREFIX) :].partition("/")
                tl.pod_uid, tl.volume_name = uid, name
            self.streams[env.stream] = tl
        return tl

    def _apply_fsm(self, env: Envelope, kind: str, table: FsmTable) -> None:
        tl = self._timeline(env, kind, table)
        tl.last_us = env.ts
        volume_id = getattr(env.body, "volume_id", "")
        if kind == "podvol" and volume_id:
            tl.volume_id = volume_id
        mark = _operation_mark(env)
        if mark is not None:
            tl.marks.append(mark)
            return
        new_state = table.next_state(tl.state, env.type)
        if new_state is None or new_state == tl.state:
            return
        current = tl.segments[-1]
        if len(tl.segments) == 1 and current.from_seq == env.seq:
            # The synthetic initial segment spans no event: start in the new state.
            tl.segments[0] = Segment(new_state, env.ts, env.seq)
            return
        current.to_us, current.to_seq = env.ts, env.seq
        tl.segments.append(Segment(new_state, env.ts, env.seq))

    def _apply_pod(self, env: Envelope) -> None:
        body = env.body
        self.pending.apply(env)
        if isinstance(body, PodPending):
            pod = self.pods.setdefault(body.pod_uid, PodLifecycle(body.pod_uid))
            pod.namespace, pod.name = body.namespace, body.name
        elif isinstance(body, PodAdded):
            pod = self.pods.setdefault(body.pod_uid, PodLifecycle(body.pod_uid))
            pod.namespace, pod.name = body.namespace, body.name
            if pod.added_us is None or pod.removed_us is not None:
                pod.added_us, pod.removed_us = env.ts, None
        elif isinstance(body, PodRemoved):
            pod = self.pods.setdefault(body.pod_uid, PodLifecycle(body.pod_uid))
            pod.namespace, pod.name = body.namespace, body.name
            pod.removed_us = env.ts

    # --------------------------------------------------------------- queries

    def for_volume(self, volume_id: str) -> list[Timeline]:
        """The device timeline of `volume_id` and the pod-volume timelines on it."""
        return [tl for tl in self.streams.values() if tl.volume_id == volume_id]

    def for_pod(self, pod_uid: str) -> list[Timeline]:
        """The pod-volume timelines of one pod."""
        return [tl for tl in self.streams.values() if tl.kind == "podvol" and tl.pod_uid == pod_uid]


def _operation_mark(env: Envelope) -> OperationMark | None:
    body = env.body
    if isinstance(body, OperationStarted):
        return OperationMark(env.seq, env.ts, body.op_id, body.operation, "started")
    if isinstance(body, OperationSucceeded):
        return OperationMark(
            env.seq, env.ts, body.op_id, body.operation, "succeeded", duration_s=body.duration_s
        )
    if isinstance(body, OperationFailed):
        return OperationMark(
            env.seq,
            env.ts,
            body.op_id,
            body.operation,
            "failed",
            code=body.code,
            message=body.message,
            final=body.final,
            backoff_s=body.backoff_s,
            duration_s=body.duration_s,
        )
    return None


def build_timelines(envelopes: Iterable[Envelope]) -> Timelines:
    """Fold envelopes (in `seq` order) into every device and pod-volume timeline."""
    result = Timelines()
    for env in envelopes:
        result.apply(env)
    return result

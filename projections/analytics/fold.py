"""Folding analytics rows of many nodes into facts, with explicit open state.

Facts: finished operations with their latency (`OpSample`), spans of time
an entry sat Uncertain (`UncertainSpan`), pod mount-to-ready times
(`PodReady`) and per-node counters (`NodeStats`). The open state (running
operations, open Uncertain spans, pods not yet ready) is plain data, so a
store can persist it beside the rows; `drain()` reports every change.
The latest usage and condition per pod-volume (`health`, a `HealthFold`)
is open state too: the caller feeds it the envelopes (`health.apply_json`)
and a store persists it with the rest. So are the waits of pods for their
claims (`waits`, a `WaitFold`): the caller feeds it the `PodPending`
envelopes (`waits.apply_json`), the fold ends a wait at the pod's
`PodAdded` or `PodRemoved`, and each step of a wait that ended is a fact
(`PodWait`). A pod's mount-to-ready is measured from its `PodAdded`, so
from the moment it stopped waiting: the wait is reported apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from events.tables import DEVICE_FSM, PODVOL_FSM, UNCERTAIN
from projections.analytics.health import HealthFold, VolumeHealth
from projections.analytics.rows import STAGE_OF, UNKNOWN_DRIVER, EventRow, phase_of
from projections.analytics.waits import DELETED, RESOLVED, OpenWait, PodWait, WaitFold

_LEAVE_UNCERTAIN = {
    table.name: frozenset(
        t for t in table.event_types() if table.next_state(UNCERTAIN, t) not in (None, UNCERTAIN)
    )
    for table in (DEVICE_FSM, PODVOL_FSM)
}
_ENTER_UNCERTAIN = {"DeviceMountUncertain": "device", "VolumeMountUncertain": "podvol"}

# --------------------------------------------------------------------------
# Facts and open state


@dataclass(slots=True)
class OpenOp:
    """An operation that started and has not finished (yet)."""

    node: str
    op_id: str
    operation: str
    driver: str
    volume_id: str
    pod_uid: str
    stream: str
    started_us: int
    staged: bool = False


@dataclass(slots=True)
class OpSample:
    """A finished operation (or a derived stage): how long it took and how it ended."""

    node: str
    op_id: str
    operation: str
    phase: str
    driver: str
    volume_id: str
    started_us: int
    ended_us: int
    duration_s: float
    failed: bool = False
    code: str = ""
    final: bool | None = None

    def figure_row(self) -> OpRow:
        """The tuple the report's aggregates read."""
        return (
            self.driver,
            self.operation,
            self.ended_us,
            whole_us(self.duration_s),
            self.failed,
            self.code,
            self.final,
        )


def whole_us(seconds: float) -> int:
    """A duration in whole microseconds (the unit the report adds and ranks)."""
    return round(seconds * 1e6)


OpRow = tuple[str, str, int, int, bool, str, bool | None]
"""(driver, operation, ended_us, duration_us, failed, code, final) of one finished operation."""


@dataclass(slots=True)
class UncertainSpan:
    """A stretch of time one device or pod-volume sat Uncertain (`to_us` None: still open)."""

    node: str
    stream: str
    kind: str
    volume_id: str
    pod_uid: str
    from_us: int
    to_us: int | None = None
    reconstructed: bool = False


@dataclass(slots=True)
class PendingPod:
    """A pod in the desired state whose volumes are not all Mounted yet."""

    node: str
    pod_uid: str
    added_us: int
    waiting: set[str]
    volumes: int


@dataclass(slots=True)
class PodReady:
    """A pod whose volumes all became Mounted: from PodAdded to the last VolumeMounted.

    A pod that waited for its claims (`PodPending`) is measured from the `PodAdded` that
    resolved it: the wait is a `PodWait`, not mount time.
    """

    node: str
    pod_uid: str
    added_us: int
    ready_us: int
    volumes: int


@dataclass(slots=True)
class NodeStats:
    """What one node's events tell about the node itself (whole history)."""

    node: str
    events: int = 0
    first_seq: int = 0
    last_seq: int = 0
    first_us: int = 0
    last_us: int = 0
    reconstructions: int = 0
    restarts: int = 0
    interrupted_ops: int = 0
    last_reconstructed: bool = False
    last_stream_us: int = 0
    publish_lag_s: float = 0.0


NodeKey = tuple[str, str]
"""(node, op_id), (node, stream) or (node, pod_uid)."""


@dataclass(slots=True)
class FoldChanges:
    """What a fold changed since the last `drain()`: new facts and the open state to persist.

    `open_ops` / `open_spans` / `pending_pods` map each changed key to its
    current value, or None where the entry closed.
    """

    samples: list[OpSample] = field(default_factory=list)
    closed_spans: list[UncertainSpan] = field(default_factory=list)
    ready: list[PodReady] = field(default_factory=list)
    open_ops: dict[NodeKey, OpenOp | None] = field(default_factory=dict)
    open_spans: dict[NodeKey, UncertainSpan | None] = field(default_factory=dict)
    pending_pods: dict[NodeKey, PendingPod | None] = field(default_factory=dict)
    nodes: list[NodeStats] = field(default_factory=list)
    waits: list[PodWait] = field(default_factory=list)
    """Steps of pods' waits for their claims that ended."""


class AnalyticsFold:
    """Folds event rows of many nodes into facts. Each node's rows must come in `seq` order.

    `apply` may fill a row's driver / volume_id / pod_uid from the operation it
    ends, so store the row after applying it.
    """

    def __init__(self) -> None:
        self.open_ops: dict[NodeKey, OpenOp] = {}
        self.open_spans: dict[NodeKey, UncertainSpan] = {}
        self.pending_pods: dict[NodeKey, PendingPod] = {}
        self.nodes: dict[str, NodeStats] = {}
        self.health = HealthFold()
        self.waits = WaitFold()
        self._mount_ops: dict[NodeKey, str] = {}  # (node, volume_id) -> op_id of a running mount
        self._stream_ops: dict[NodeKey, str] = {}  # (node, stream) -> op_id running on it
        self._changes = FoldChanges()
        self._dirty_nodes: set[str] = set()

    # ----------------------------------------------------------- restoring

    def restore(
        self,
        ops: Iterable[OpenOp],
        spans: Iterable[UncertainSpan],
        pods: Iterable[PendingPod],
        nodes: Iterable[NodeStats],
        health: Iterable[VolumeHealth] = (),
        waits: Iterable[OpenWait] = (),
    ) -> None:
        """Load open state saved by a store (nothing is reported as changed)."""
        for op in ops:
            self._open(op)
        for span in spans:
            self.open_spans[(span.node, span.stream)] = span
        for pod in pods:
            self.pending_pods[(pod.node, pod.pod_uid)] = pod
        for stats in nodes:
            self.nodes[stats.node] = stats
        for vol in health:
            self.health.volumes[(vol.node, vol.pod_uid, vol.volume_name)] = vol
        self.waits.restore(waits)

    def _open(self, op: OpenOp) -> None:
        self.open_ops[(op.node, op.op_id)] = op
        self._stream_ops[(op.node, op.stream)] = op.op_id
        if op.operation in STAGE_OF and op.volume_id:
            self._mount_ops[(op.node, op.volume_id)] = op.op_id

    def _close(self, key: NodeKey) -> OpenOp | None:
        op = self.open_ops.pop(key, None)
        if op is None:
            return None
        node = op.node
        if self._stream_ops.get((node, op.stream)) == op.op_id:
            del self._stream_ops[(node, op.stream)]
        if self._mount_ops.get((node, op.volume_id)) == op.op_id:
            del self._mount_ops[(node, op.volume_id)]
        self._changes.open_ops[key] = None
        return op

    # -------------------------------------------------------------- folding

    def apply(self, row: EventRow) -> None:
        """Fold one row."""
        stats = self._node(row)
        kind = row.kind
        if kind == "operation":
            self._apply_operation(row, stats)
        elif kind == "desired":
            self._apply_desired(row)
        else:
            self._apply_transition(row, kind, stats)
        stats.last_reconstructed = row.reconstructed

    def _node(self, row: EventRow) -> NodeStats:
        node = row.node
        stats = self.nodes.get(node)
        if stats is None:
            stats = self.nodes[node] = NodeStats(
                node, first_seq=row.seq, last_seq=row.seq, first_us=row.ts_us
            )
        stats.events += 1
        if row.seq > stats.last_seq:
            stats.last_seq = row.seq
        elif row.seq < stats.first_seq:
            stats.first_seq = row.seq
        if row.ts_us > stats.last_us:
            stats.last_us = row.ts_us
        if row.ts_us < stats.first_us:
            stats.first_us = row.ts_us
        self._dirty_nodes.add(node)
        return stats

    def _apply_operation(self, row: EventRow, stats: NodeStats) -> None:
        node = row.node
        key = (node, row.op_id)
        if row.type == "OperationStarted":
            self._interrupt(node, row.stream, stats)
            started = OpenOp(
                node,
                row.op_id,
                row.operation,
                row.driver,
                row.volume_id,
                row.pod_uid,
                row.stream,
                row.ts_us,
            )
            self._open(started)
            self._changes.open_ops[key] = started
            return
        op = self._close(key)
        if op is not None:
            row.driver = row.driver or op.driver
            row.volume_id = row.volume_id or op.volume_id
            row.pod_uid = row.pod_uid or op.pod_uid
        duration = row.duration_s or 0.0
        self._changes.samples.append(
            OpSample(
                node,
                row.op_id,
                row.operation,
                phase_of(row.operation),
                row.driver or UNKNOWN_DRIVER,
                row.volume_id,
                op.started_us if op is not None else row.ts_us - round(duration * 1e6),
                row.ts_us,
                duration,
                row.type == "OperationFailed",
                row.code,
                row.final,
            )
        )

    def _interrupt(self, node: str, stream: str, stats: NodeStats) -> None:
        """A new operation on a stream whose last one never ended: that one was cut short."""
        running = self._stream_ops.get((node, stream))
        if running is not None and self._close((node, running)) is not None:
            stats.interrupted_ops += 1

    def _apply_desired(self, row: EventRow) -> None:
        key = (row.node, row.pod_uid)
        if row.type == "PodAdded":
            self.waits.end(row.node, row.pod_uid, row.ts_us, RESOLVED)
            names = {n for n in row.pod_volumes.split(",") if n}
            if names:
                pod = PendingPod(row.node, row.pod_uid, row.ts_us, names, len(names))
                self.pending_pods[key] = pod
                self._changes.pending_pods[key] = pod
        elif row.type == "PodRemoved":
            self.waits.end(row.node, row.pod_uid, row.ts_us, DELETED)
            if self.pending_pods.pop(key, None) is not None:
                self._changes.pending_pods[key] = None

    def _apply_transition(self, row: EventRow, kind: str, stats: NodeStats) -> None:
        node = row.node
        etype = row.type
        if etype == "DeviceMounted":
            self._stage_done(row)
        elif etype == "VolumeMounted":
            self._volume_mounted(row)
        key = (node, row.stream)
        entered = _ENTER_UNCERTAIN.get(etype)
        if entered is not None:
            if row.reconstructed:
                stats.reconstructions += 1
                if not stats.last_reconstructed:
                    stats.restarts += 1
            if key not in self.open_spans:
                span = UncertainSpan(
                    node,
                    row.stream,
                    entered,
                    row.volume_id,
                    row.pod_uid,
                    row.ts_us,
                    reconstructed=row.reconstructed,
                )
                self.open_spans[key] = span
                self._changes.open_spans[key] = span
        elif etype in _LEAVE_UNCERTAIN.get(kind, ()):
            closing = self.open_spans.pop(key, None)
            if closing is not None:
                closing.to_us = row.ts_us
                self._changes.closed_spans.append(closing)
                self._changes.open_spans[key] = None

    def _stage_done(self, row: EventRow) -> None:
        op_id = self._mount_ops.get((row.node, row.volume_id))
        op = self.open_ops.get((row.node, op_id)) if op_id is not None else None
        if op is None or op.staged:
            return
        op.staged = True
        self._changes.open_ops[(op.node, op.op_id)] = op
        self._changes.samples.append(
            OpSample(
                op.node,
                op.op_id,
                STAGE_OF[op.operation],
                "stage",
                op.driver or row.driver or UNKNOWN_DRIVER,
                op.volume_id,
                op.started_us,
                row.ts_us,
                max(0, row.ts_us - op.started_us) / 1e6,
            )
        )

    def _volume_mounted(self, row: EventRow) -> None:
        key = (row.node, row.pod_uid)
        pod = self.pending_pods.get(key)
        if pod is None:
            return
        pod.waiting.discard(row.volume_name)
        self._changes.pending_pods[key] = pod
        if not pod.waiting:
            del self.pending_pods[key]
            self._changes.pending_pods[key] = None
            self._changes.ready.append(
                PodReady(pod.node, pod.pod_uid, pod.added_us, row.ts_us, pod.volumes)
            )

    # -------------------------------------------------------------- draining

    def drain(self) -> FoldChanges:
        """The changes since the last drain (and forget them)."""
        changes = self._changes
        changes.nodes = [self.nodes[n] for n in sorted(self._dirty_nodes)]
        changes.waits = self.waits.drain()
        self._changes = FoldChanges()
        self._dirty_nodes = set()
        return changes

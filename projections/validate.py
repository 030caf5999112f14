"""Replay validator: does a log (or an export of one) tell a legal story?

Checks, in `seq` order, and stops at the first violation:

* `seq` strictly increases and timestamps never go backwards;
* each stream's versions run 1, 2, 3, ... with no gap or repeat;
* device and pod-volume streams: every transition event is legal from the
  stream's state in `events.tables` (starting at the table's initial
  state); operation records may appear in any state, but an
  OperationSucceeded/Failed must answer an open OperationStarted with the
  same `op_id` on the same stream; observations (volume health and usage)
  may appear in any state of a pod-volume stream; no other event type
  belongs there;
* desired-state streams (`pod/<uid>`): only desired-state events, a
  PodRemoved only while the pod is added, no PodCleanedUp of a pod that
  is added and was never removed;
* object streams (`object/<Kind>/...`): only ObjectApplied/ObjectDeleted,
  an ObjectDeleted only while the object is stored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from events.streams import stream_kind
from events.tables import (
    DESIRED_EVENTS,
    OBJECT_EVENTS,
    OBSERVATION_EVENTS,
    OPERATION_EVENTS,
    PODVOL_FSM,
    FsmTable,
    table_for_stream_kind,
)
from events.types import Envelope, OperationStarted


@dataclass(frozen=True, slots=True)
class Violation:
    """The first event that breaks a rule, and why."""

    seq: int
    stream: str
    state: str
    event_type: str
    reason: str

    def __str__(self) -> str:
        state = f" in state {self.state}" if self.state else ""
        return f"seq {self.seq}: stream {self.stream}{state}: {self.event_type}: {self.reason}"


@dataclass(slots=True)
class ValidationReport:
    """What was checked and the first violation (None: the log is valid)."""

    events: int = 0
    streams: int = 0
    last_seq: int = 0
    violation: Violation | None = None

    @property
    def ok(self) -> bool:
        """True when no rule was broken."""
        return self.violation is None


@dataclass(slots=True)
class _StreamState:
    version: int = 0
    state: str = ""
    open_ops: set[str] = field(default_factory=set)
    removed: bool = False
    """pod streams: a PodRemoved was seen."""


class Validator:
    """Checks envelopes one at a time; `check` returns the first violation it finds."""

    def __init__(self) -> None:
        self._streams: dict[str, _StreamState] = {}
        self._last_seq = 0
        self._last_ts = 0

    @property
    def stream_count(self) -> int:
        """How many distinct streams have been seen."""
        return len(self._streams)

    def check(self, env: Envelope) -> Violation | None:
        """Apply one envelope; the violation it causes, if any."""
        st = self._streams.get(env.stream)
        if st is None:
            st = self._streams[env.stream] = _StreamState(state=_initial(env.stream))
        problem = self._check_order(env, st)
        if problem is None:
            problem = self._check_body(env, st)
        if problem is not None:
            return Violation(env.seq, env.stream, st.state, env.type, problem)
        self._last_seq, self._last_ts = env.seq, env.ts
        st.version = env.version
        return None

    def _check_order(self, env: Envelope, st: _StreamState) -> str | None:
        if env.seq <= self._last_seq:
            return f"seq {env.seq} does not follow seq {self._last_seq}"
        if env.ts < self._last_ts:
            return f"timestamp {env.ts} is before the previous event's {self._last_ts}"
        if env.version != st.version + 1:
            return f"version {env.version} does not follow version {st.version}"
        return None

    def _check_body(self, env: Envelope, st: _StreamState) -> str | None:
        kind = stream_kind(env.stream)
        table = table_for_stream_kind(kind)
        if table is not None:
            return _check_fsm_event(env, st, table)
        if kind == "pod":
            return _check_desired_event(env, st)
        if kind == "object":
            return _check_object_event(env, st)
        return None


def _initial(stream: str) -> str:
    kind = stream_kind(stream)
    table = table_for_stream_kind(kind)
    if table is not None:
        return table.initial
    return "Absent" if kind == "pod" else ""


def _check_fsm_event(env: Envelope, st: _StreamState, table: FsmTable) -> str | None:
    if env.type in OPERATION_EVENTS:
        return _check_operation(env, st)
    if env.type in OBSERVATION_EVENTS:
        return None if table is PODVOL_FSM else "an observation belongs on a pod-volume stream"
    if env.type not in table.event_types():
        return f"not an event of the {table.name} state machine"
    new_state = table.next_state(st.state, env.type)
    if new_state is None:
        return f"illegal transition from {st.state}"
    st.state = new_state
    return None


def _check_operation(env: Envelope, st: _StreamState) -> str | None:
    body = env.body
    if isinstance(body, OperationStarted):
        if body.op_id in st.open_ops:
            return f"operation {body.op_id} started twice"
        st.open_ops.add(body.op_id)
        return None
    op_id = getattr(body, "op_id", "")
    if op_id not in st.open_ops:
        return f"operation {op_id} has no open OperationStarted on this stream"
    st.open_ops.discard(op_id)
    return None


def _check_desired_event(env: Envelope, st: _StreamState) -> str | None:
    if env.type not in DESIRED_EVENTS:
        return "not a desired-state event"
    if env.type == "PodAdded":
        st.state = "Added"
    elif env.type == "PodPending":
        if st.state == "Added":
            return "PodPending of a pod already added (a pending pod waits before its PodAdded)"
        st.state = "Pending"
    elif env.type == "PodRemoved":
        if st.state not in ("Added", "Pending"):
            return "PodRemoved without a PodAdded or PodPending before it"
        st.state = "Removed"
        st.removed = True
    elif env.type == "PodCleanedUp" and st.state in ("Added", "Pending") and not st.removed:
        # Not of a pod that is desired and never was removed. After a removal the same uid
        # may be added again before the cleanup is recorded, and a pod only reconstruction
        # knew (found on the node) has no PodAdded at all: the fold forgets only Unmounted
        # entries, so neither changes anything.
        return "PodCleanedUp of a pod that is desired and was never removed"
    return None


def _check_object_event(env: Envelope, st: _StreamState) -> str | None:
    if env.type not in OBJECT_EVENTS:
        return "not an object-store event"
    if env.type == "ObjectApplied":
        st.state = "Stored"
    elif st.state != "Stored":
        return "ObjectDeleted of an object that is not stored"
    else:
        st.state = "Deleted"
    return None


def validate(envelopes: Iterable[Envelope]) -> ValidationReport:
    """Check envelopes in order; stop at and report the first violation."""
    validator = Validator()
    report = ValidationReport()
    for env in envelopes:
        report.violation = validator.check(env)
        if report.violation is not None:
            break
        report.events += 1
        report.last_seq = env.seq
    report.streams = validator.stream_count
    return report

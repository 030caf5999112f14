"""Pods that waited for their claims, across nodes: how long, and for what.

A pod whose claim is missing or not bound, or whose PV is not applied, is
recorded as `PodPending` and waits; a later `PodPending` replaces the
reasons; its `PodAdded` resolves it, a `PodRemoved` deletes it while it
waits. No volume operation runs meanwhile, so the wait is no driver's
time: the kubelet's WaitForAttachAndMount timeout covers it (the pod's
start simply takes longer), and its `storage_operation_duration_seconds`
never sees it. The analytics likewise keep it out of the operation
latencies and out of mount-to-ready (measured from the `PodAdded` that
ends the wait), and report it apart: this fold turns each step of a wait
(one `PodPending`, until the next `PodPending`, `PodAdded` or `PodRemoved`
of the pod) into a `PodWait` fact with its reason, grouped by what was
missing (`reason_of`), never by claim name.

The reasons come from the `PodPending` bodies, which the flat `EventRow`
does not carry: like `HealthFold`, this fold reads envelopes (`apply`) or
their JSON form (`apply_json`) for `PodPending`, and the row (`end`) for
`PodAdded` / `PodRemoved`. Its open waits are open state a store persists
with each batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from events.types import Envelope, PendingVolume, PodPending

RESOLVED = "resolved"
"""The wait ended with the pod's `PodAdded`."""
DELETED = "deleted"
"""The wait ended with the pod's `PodRemoved` (deleted while pending)."""
REWAITED = "waits again"
"""The step ended with another `PodPending` (the pod waits for something else now)."""
ENDS_A_WAIT = (RESOLVED, DELETED)

WaitKey = tuple[str, str]
"""(node, pod uid)."""


_KINDS = frozenset({"PersistentVolumeClaim", "PersistentVolume"})
_MISSING = ("not found yet", "not bound yet")
_DRIVER = "CSI driver "
_UNREGISTERED = "not registered"


def reason_of(waiting: Iterable[PendingVolume]) -> str:
    """What a pending pod waits for, without names (a few values, fit for a label):
    'PersistentVolumeClaim not found yet', 'PersistentVolumeClaim not bound yet',
    'PersistentVolume not found yet', 'CSI driver not registered yet'; any other reason
    (a claim with a problem) is '<kind> problem'. Several volumes' distinct reasons are
    sorted and joined by ' + '."""
    found = set()
    for w in waiting:
        if w.waits_for.startswith(_DRIVER):
            registered = w.reason.startswith(_UNREGISTERED)
            found.add(f"{_DRIVER}{'not registered yet' if registered else 'problem'}")
            continue
        kind = w.waits_for.split(" ", 1)[0]
        head = next((m for m in _MISSING if w.reason.startswith(m)), "problem")
        found.add(f"{kind if kind in _KINDS else 'object'} {head}")
    return " + ".join(sorted(found)) or "unknown"


@dataclass(slots=True)
class OpenWait:
    """A pod waiting now: since when (its first `PodPending`), and its current step."""

    node: str
    pod_uid: str
    since_us: int
    step_us: int
    reason: str


@dataclass(slots=True)
class PodWait:
    """One step of a wait: `reason` from `from_us` to `to_us`, and what ended it (`outcome`:
    RESOLVED, DELETED or REWAITED). `since_us` is when the whole wait began."""

    node: str
    pod_uid: str
    reason: str
    since_us: int
    from_us: int
    to_us: int
    outcome: str

    @property
    def wait_us(self) -> int:
        """The whole wait, for the step that ended it (first `PodPending` to the end)."""
        return self.to_us - self.since_us

    @property
    def step_us(self) -> int:
        """This step alone."""
        return self.to_us - self.from_us


WaitRow = tuple[str, str, str, int, int, int, str]
"""(node, pod_uid, reason, since_us, from_us, to_us, outcome) of a `PodWait`."""


class _Volume(msgspec.Struct):
    name: str = ""
    waits_for: str = ""
    reason: str = ""


class _Body(msgspec.Struct):
    pod_uid: str = ""
    waiting: list[_Volume] = []


class _Envelope(msgspec.Struct):
    type: str
    ts: int
    node: str
    body: _Body


_decode = msgspec.json.Decoder(_Envelope).decode
_PENDING = PodPending.__name__


@dataclass(slots=True)
class WaitFold:
    """Open waits per (node, pod) and the `PodWait` facts of the steps that ended."""

    open: dict[WaitKey, OpenWait] = field(default_factory=dict)
    facts: list[PodWait] = field(default_factory=list)
    """Steps that ended since the last `drain`."""

    def restore(self, waits: Iterable[OpenWait]) -> None:
        """Load open waits a store saved."""
        for w in waits:
            self.open[(w.node, w.pod_uid)] = w

    def apply(self, env: Envelope) -> None:
        """Fold a `PodPending` envelope (other types: `end`, from the row)."""
        body = env.body
        if isinstance(body, PodPending):
            self._pending(env.node, body.pod_uid, env.ts, reason_of(body.waiting))

    def apply_json(self, data: bytes | str) -> None:
        """Fold a `PodPending` in its JSON form (anything else is ignored, cheaply)."""
        hit = _PENDING.encode() in data if isinstance(data, bytes) else _PENDING in data
        if not hit:
            return
        env = _decode(data)
        if env.type == _PENDING:
            waiting = [
                PendingVolume(name=w.name, waits_for=w.waits_for, reason=w.reason)
                for w in env.body.waiting
            ]
            self._pending(env.node, env.body.pod_uid, env.ts, reason_of(waiting))

    def _pending(self, node: str, pod_uid: str, ts: int, reason: str) -> None:
        key = (node, pod_uid)
        was = self.open.get(key)
        if was is None:
            self.open[key] = OpenWait(node, pod_uid, ts, ts, reason)
            return
        self.facts.append(
            PodWait(node, pod_uid, was.reason, was.since_us, was.step_us, ts, REWAITED)
        )
        was.step_us, was.reason = ts, reason

    def end(self, node: str, pod_uid: str, ts: int, outcome: str) -> None:
        """The pod's `PodAdded` (RESOLVED) or `PodRemoved` (DELETED): its wait, if any, ends."""
        was = self.open.pop((node, pod_uid), None)
        if was is not None:
            self.facts.append(
                PodWait(node, pod_uid, was.reason, was.since_us, was.step_us, ts, outcome)
            )

    def drain(self) -> list[PodWait]:
        """The steps that ended since the last drain (and forget them)."""
        facts, self.facts = self.facts, []
        return facts


def wait_row(w: PodWait) -> WaitRow:
    """The values of a `PodWait`, in the waits table's column order."""
    return (w.node, w.pod_uid, w.reason, w.since_us, w.from_us, w.to_us, w.outcome)

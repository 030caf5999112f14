"""What changed between two moments of a log: desired pods, devices, pod-volumes.

`diff_log` folds the log once: up to `from_seq` it only builds the state,
then it takes a snapshot and keeps folding up to `to_seq`, counting each
stream's events and the states each entry passed through. Entries are
compared by stream:

* `added` / `removed`: a device or pod-volume that did not exist at one
  end (a detached device is removed from the ASW);
* `changed`: a different state at the two ends;
* `transient`: a device or pod-volume that appeared and went again in between;
* `touched`: the same state at both ends, but events in between (a
  Mounted -> Uncertain -> Mounted round trip, or failing operations that
  changed nothing).

Desired pods are compared by uid: `added`, `removed`, and for pods that
wait for their claims (`PodPending`, see `projections.pending`):
`pending` (waiting at the end, and either not desired at the start or
waiting for something else since), `resolved` (waiting at the start,
added by the end), `transient` (began waiting and was deleted in between);
`details` say since when and for what.

Imports only `events` (and the story's text helpers).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from events.streams import DEVICE_PREFIX, POD_PREFIX, PODVOL_PREFIX
from events.types import Envelope, OperationFailed, OperationSucceeded, PodAdded, PodPending
from projections.asw import Asw
from projections.pending import (
    DELETED,
    RESOLVED,
    PendingPods,
    PendingSpell,
    ended_wait_text,
)
from projections.textfmt import iso_time, size_text


@dataclass(frozen=True, slots=True)
class EntryView:
    """A device or pod-volume at one moment: what a diff compares."""

    kind: str
    stream: str
    state: str
    size_bytes: int | None = None
    reconstructed: bool = False


@dataclass(slots=True)
class EntryChange:
    """How one device or pod-volume differs between the two moments."""

    change: str
    kind: str
    stream: str
    subject: str
    from_state: str | None
    to_state: str | None
    events: int
    via: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


@dataclass(slots=True)
class PodChange:
    """A pod that entered or left the desired state."""

    change: str
    pod_uid: str
    pod: str
    volumes: list[str]
    details: list[str] = field(default_factory=list)
    """For a pod that waited for its claims: since when, for what, how it ended."""


@dataclass(slots=True)
class SizeChange:
    """A volume whose desired size changed."""

    volume_id: str
    from_bytes: int | None
    to_bytes: int | None


@dataclass(slots=True)
class WorldDiff:
    """Everything that differs between seq `from_seq` and seq `to_seq`."""

    from_seq: int
    from_ts: int
    to_seq: int
    to_ts: int
    events: int
    pods: list[PodChange] = field(default_factory=list)
    devices: list[EntryChange] = field(default_factory=list)
    pod_volumes: list[EntryChange] = field(default_factory=list)
    desired_sizes: list[SizeChange] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """True when nothing differs and nothing happened."""
        return not (self.pods or self.devices or self.pod_volumes or self.desired_sizes)


@dataclass(slots=True)
class _Activity:
    events: int = 0
    states: list[str] = field(default_factory=list)
    failed: int = 0
    succeeded: int = 0


def snapshot(asw: Asw) -> dict[str, EntryView]:
    """Every device and pod-volume of the ASW, by stream."""
    views: dict[str, EntryView] = {}
    for dev in asw.devices.values():
        stream = DEVICE_PREFIX + dev.volume_id
        views[stream] = EntryView("device", stream, dev.state, dev.size_bytes, dev.reconstructed)
    for pv in asw.podvols.values():
        stream = f"{PODVOL_PREFIX}{pv.pod_uid}/{pv.volume_name}"
        views[stream] = EntryView("podvol", stream, pv.state, None, pv.reconstructed)
    return views


def _state_of(asw: Asw, stream: str) -> str | None:
    if stream.startswith(DEVICE_PREFIX):
        dev = asw.devices.get(stream[len(DEVICE_PREFIX) :])
        return dev.state if dev is not None else None
    if stream.startswith(PODVOL_PREFIX):
        uid, _, name = stream[len(PODVOL_PREFIX) :].partition("/")
        pv = asw.podvols.get((uid, name))
        return pv.state if pv is not None else None
    return None


class _DiffFold:
    def __init__(self) -> None:
        self.asw = Asw()
        self.pod_names: dict[str, str] = {}
        self.activity: dict[str, _Activity] = {}
        self.pending = PendingPods()

    def before(self, env: Envelope) -> None:
        body = env.body
        if isinstance(body, PodAdded | PodPending):
            self.pod_names[body.pod_uid] = f"{body.namespace}/{body.name}"
        if env.stream.startswith(POD_PREFIX):
            self.pending.apply(env)
        self.asw.apply(env)

    def during(self, env: Envelope) -> None:
        self.before(env)
        act = self.activity.get(env.stream)
        if act is None:
            act = self.activity[env.stream] = _Activity()
        act.events += 1
        body = env.body
        if isinstance(body, OperationFailed):
            act.failed += 1
        elif isinstance(body, OperationSucceeded):
            act.succeeded += 1
        state = _state_of(self.asw, env.stream)
        if state is not None and (not act.states or act.states[-1] != state):
            act.states.append(state)

    def subject(self, stream: str) -> str:
        if stream.startswith(DEVICE_PREFIX):
            return stream[len(DEVICE_PREFIX) :]
        uid, _, name = stream[len(PODVOL_PREFIX) :].partition("/")
        return f"{self.pod_names.get(uid, uid)}:{name}"


def _details(before: EntryView | None, after: EntryView | None, act: _Activity | None) -> list[str]:
    out = []
    old_size = before.size_bytes if before is not None else None
    new_size = after.size_bytes if after is not None else None
    if after is not None and after.kind == "device" and old_size != new_size:
        if before is None or old_size is None:
            out.append(f"size {size_text(new_size)}")
        else:
            out.append(f"size {size_text(old_size)} -> {size_text(new_size)}")
    if after is not None and after.reconstructed and not (before and before.reconstructed):
        out.append("reconstructed")
    if act is not None and (act.failed or act.succeeded):
        ops = []
        if act.succeeded:
            ops.append(f"{act.succeeded} succeeded")
        if act.failed:
            ops.append(f"{act.failed} failed")
        out.append("operations: " + ", ".join(ops))
    return out


def _entry_change(
    fold: _DiffFold, stream: str, before: EntryView | None, after: EntryView | None
) -> EntryChange | None:
    act = fold.activity.get(stream)
    if before is None and after is None:
        if act is None:
            return None
        change = "transient"
    elif before is None:
        change = "added"
    elif after is None:
        change = "removed"
    elif before.state != after.state:
        change = "changed"
    elif act is not None:
        change = "touched"
    else:
        return None
    kind = "device" if stream.startswith(DEVICE_PREFIX) else "podvol"
    from_state = before.state if before is not None else None
    to_state = after.state if after is not None else None
    if to_state is None and kind == "device":
        to_state = "Detached"
    ends = {from_state, to_state}
    via = [s for s in act.states if s not in ends] if act is not None else []
    return EntryChange(
        change=change,
        kind=kind,
        stream=stream,
        subject=fold.subject(stream),
        from_state=from_state,
        to_state=to_state,
        events=act.events if act is not None else 0,
        via=list(dict.fromkeys(via)),
        details=_details(before, after, act),
    )


PendingMark = dict[str, tuple[PendingSpell, int]]
"""The waits going on at a moment: pod uid -> (its wait, how many steps it had then)."""


def pending_mark(pending: PendingPods) -> PendingMark:
    """The waits going on now, to compare with later."""
    return {uid: (spell, len(spell.steps)) for uid, spell in pending.open.items()}


def _waiting_volumes(spell: PendingSpell) -> list[str]:
    return [f"{w.name} (waiting)" for w in spell.waiting]


def _still_pending(spell: PendingSpell, steps_before: int | None) -> PodChange | None:
    """A wait going on at the end: new, or still going with other reasons (else None)."""
    if steps_before is not None and steps_before == len(spell.steps):
        return None
    verb = "still waiting" if steps_before is not None else "waiting"
    detail = f"{verb} since {iso_time(spell.since_us)}: {spell.steps[-1].text}"
    return PodChange("pending", spell.pod_uid, spell.pod, _waiting_volumes(spell), [detail])


def _pending_changes(fold: _DiffFold, before: PendingMark, from_seq: int) -> list[PodChange]:
    """Pods waiting at an end of the window, or deleted while waiting in it, that the
    comparison of added pods does not cover."""
    out = []
    for spell in fold.pending.spells:
        ended, was = spell.ended_seq, before.get(spell.pod_uid)
        if ended is not None and ended <= from_seq:
            continue
        if was is not None and was[0] is not spell:
            was = None
        if ended is None:
            change = _still_pending(spell, was[1] if was is not None else None)
        elif spell.outcome == DELETED:
            kind = "removed" if was is not None else "transient"
            change = PodChange(kind, spell.pod_uid, spell.pod, _waiting_volumes(spell))
            change.details.append(ended_wait_text(spell))
        elif was is not None and spell.pod_uid not in fold.asw.desired_pods:
            change = PodChange("removed", spell.pod_uid, spell.pod, _waiting_volumes(spell))
            change.details += [ended_wait_text(spell), "then removed"]
        else:
            continue  # resolved and still desired: the added pod's entry tells it
        if change is not None:
            out.append(change)
    return out


def _added_after_waiting(
    fold: _DiffFold, change: PodChange, before: PendingMark, from_seq: int
) -> None:
    """An added pod whose wait for its claims ended in the window: say so (and a pod that
    was waiting at the start is `resolved`)."""
    spell = next(
        (
            s
            for s in reversed(fold.pending.spells)
            if s.pod_uid == change.pod_uid and s.outcome == RESOLVED
        ),
        None,
    )
    if spell is None or spell.ended_seq is None or spell.ended_seq <= from_seq:
        return
    was = before.get(change.pod_uid)
    if was is not None and was[0] is spell:
        change.change = "resolved"
    change.details.append(ended_wait_text(spell))


def _pod_changes(
    fold: _DiffFold, before: dict[str, PodAdded], pending: PendingMark, from_seq: int
) -> list[PodChange]:
    after = fold.asw.desired_pods
    out = []
    for uid in sorted(set(before) | set(after)):
        old, new = before.get(uid), after.get(uid)
        if old is not None and new is not None:
            continue
        pod = new if new is not None else old
        assert pod is not None
        change = PodChange(
            change="added" if new is not None else "removed",
            pod_uid=uid,
            pod=f"{pod.namespace}/{pod.name}",
            volumes=[f"{v.name}={v.volume_id}" for v in pod.volumes],
        )
        if new is not None:
            _added_after_waiting(fold, change, pending, from_seq)
        out.append(change)
    out.extend(_pending_changes(fold, pending, from_seq))
    return sorted(out, key=lambda p: (p.pod, p.pod_uid))


def _size_changes(before: dict[str, int], after: dict[str, int]) -> list[SizeChange]:
    return [
        SizeChange(vid, before.get(vid), after.get(vid))
        for vid in sorted(set(before) | set(after))
        if before.get(vid) != after.get(vid)
    ]


def diff_log(envelopes: Iterable[Envelope], from_seq: int, to_seq: int) -> WorldDiff:
    """The difference between the state after `from_seq` and after `to_seq`.

    `envelopes` must start at the beginning of the log (seq order); reading
    stops after `to_seq`. `from_seq` 0 means the empty state before the log.
    """
    if to_seq < from_seq:
        raise ValueError(f"to_seq {to_seq} is before from_seq {from_seq}")
    fold = _DiffFold()
    views: dict[str, EntryView] | None = None
    pods_before: dict[str, PodAdded] = {}
    pending_before: PendingMark = {}
    sizes_before: dict[str, int] = {}
    from_ts = 0
    for env in envelopes:
        if env.seq > to_seq:
            break
        if env.seq <= from_seq:
            fold.before(env)
            from_ts = env.ts
            continue
        if views is None:
            views = snapshot(fold.asw)
            pods_before = dict(fold.asw.desired_pods)
            pending_before = pending_mark(fold.pending)
            sizes_before = dict(fold.asw.desired_sizes)
        fold.during(env)
    if views is None:
        views = snapshot(fold.asw)
        pods_before = dict(fold.asw.desired_pods)
        pending_before = pending_mark(fold.pending)
        sizes_before = dict(fold.asw.desired_sizes)
    after = snapshot(fold.asw)
    result = WorldDiff(
        from_seq=min(from_seq, fold.asw.last_seq) if from_seq else 0,
        from_ts=from_ts,
        to_seq=fold.asw.last_seq,
        to_ts=fold.asw.last_ts,
        events=max(0, fold.asw.last_seq - from_seq),
        pods=_pod_changes(fold, pods_before, pending_before, from_seq),
        desired_sizes=_size_changes(sizes_before, fold.asw.desired_sizes),
    )
    for stream in sorted(set(views) | set(after) | set(fold.activity)):
        if not stream.startswith((DEVICE_PREFIX, PODVOL_PREFIX)):
            continue
        change = _entry_change(fold, stream, views.get(stream), after.get(stream))
        if change is None:
            continue
        target = result.devices if change.kind == "device" else result.pod_volumes
        target.append(change)
    result.devices.sort(key=lambda c: (c.subject, c.stream))
    result.pod_volumes.sort(key=lambda c: (c.subject, c.stream))
    return result

"""Pods that wait for their claims: each wait, what it waited for, and how it ended.

A pod whose volumes cannot be resolved yet is recorded as `PodPending` on
its pod stream; a later `PodPending` replaces the reasons; a `PodAdded`
of the same uid ends the wait (resolved: every volume resolved) and a
`PodRemoved` ends it too (deleted while pending). `PendingPods` folds
those events into spells, one per wait, each a list of steps (one per
`PodPending`), so `state`, `timeline`, `diff` and `replay` tell a
pending pod the same way: the wording is here, once.

Imports only `events` (and the text helpers).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from events.types import Envelope, PendingVolume, PodAdded, PodPending, PodRemoved
from projections.textfmt import duration_text, iso_time

RESOLVED = "resolved"
"""A wait ended by a `PodAdded`: every volume resolved, the reconciler mounts them."""
DELETED = "deleted"
"""A wait ended by a `PodRemoved`: the pod was deleted while pending (nothing was mounted)."""


def waits_text(waiting: Iterable[PendingVolume]) -> str:
    """'data waits for PersistentVolumeClaim shop/cart-data: not found yet; ...'."""
    return "; ".join(f"{w.name} waits for {w.text}" for w in waiting) or "nothing"


@dataclass(slots=True)
class PendingStep:
    """One `PodPending`: what the pod's volumes waited for from then on."""

    seq: int
    ts_us: int
    waiting: tuple[PendingVolume, ...]

    @property
    def text(self) -> str:
        """What it waited for, in words (`waits_text`)."""
        return waits_text(self.waiting)


@dataclass(slots=True)
class PendingSpell:
    """One wait of a pod: from its first `PodPending` until a `PodAdded` or `PodRemoved`.

    `outcome` is RESOLVED or DELETED once the wait ended ("" while it lasts).
    """

    pod_uid: str
    namespace: str
    name: str
    steps: list[PendingStep] = field(default_factory=list)
    ended_seq: int | None = None
    ended_us: int | None = None
    outcome: str = ""

    @property
    def pod(self) -> str:
        """'namespace/name'."""
        return f"{self.namespace}/{self.name}"

    @property
    def since_us(self) -> int:
        """When the wait began (its first `PodPending`)."""
        return self.steps[0].ts_us

    @property
    def waiting(self) -> tuple[PendingVolume, ...]:
        """What it waits (or last waited) for: the latest `PodPending`'s volumes."""
        return self.steps[-1].waiting

    def duration_us(self, end_us: int) -> int:
        """How long it waited; a wait still going is measured up to `end_us`."""
        stop = self.ended_us if self.ended_us is not None else end_us
        return max(0, stop - self.since_us)

    def step_end_us(self, index: int) -> int | None:
        """When step `index` ended: the next step, or the end of the wait (None: open)."""
        if index + 1 < len(self.steps):
            return self.steps[index + 1].ts_us
        return self.ended_us

    def step_then(self, index: int) -> str:
        """What followed step `index`, in words."""
        if index + 1 < len(self.steps):
            return "waits for something else"
        return end_text(self)

    def open_at(self, seq: int) -> bool:
        """Whether the pod was pending right after `seq`."""
        return self.steps[0].seq <= seq and (self.ended_seq is None or self.ended_seq > seq)


def end_text(spell: PendingSpell) -> str:
    """'resolved (PodAdded, seq 80)', 'deleted while pending (PodRemoved, seq 80)', 'still
    waiting'."""
    if spell.outcome == RESOLVED:
        return f"resolved (PodAdded, seq {spell.ended_seq})"
    if spell.outcome == DELETED:
        return f"deleted while pending (PodRemoved, seq {spell.ended_seq})"
    return "still waiting"


def waited_text(spell: PendingSpell) -> str:
    """'pending 6.000s since 2024-05-01T03:11:33.000Z' (how long a finished wait lasted)."""
    return (
        f"pending {duration_text(spell.duration_us(spell.since_us))} since "
        f"{iso_time(spell.since_us)}"
    )


def ended_wait_text(spell: PendingSpell) -> str:
    """'pending since T, resolved at T2 after 6.000s: data waits for ...' (a finished wait)."""
    how = "resolved" if spell.outcome == RESOLVED else "deleted while pending"
    return (
        f"pending since {iso_time(spell.since_us)}, {how} at {iso_time(spell.ended_us)} "
        f"after {duration_text(spell.duration_us(spell.since_us))}: {spell.steps[-1].text}"
    )


class PendingPods:
    """Every wait of every pod, folded from the desired-state events (in `seq` order)."""

    def __init__(self) -> None:
        self.spells: list[PendingSpell] = []
        """Every wait, in the order they began."""
        self.open: dict[str, PendingSpell] = {}
        """The waits still going, by pod uid."""

    def apply(self, env: Envelope) -> PendingSpell | None:
        """Fold one envelope; the wait it began, changed or ended (None: no wait touched)."""
        body = env.body
        if isinstance(body, PodPending):
            spell = self.open.get(body.pod_uid)
            if spell is None:
                spell = PendingSpell(body.pod_uid, body.namespace, body.name)
                self.open[body.pod_uid] = spell
                self.spells.append(spell)
            spell.steps.append(PendingStep(env.seq, env.ts, body.waiting))
            return spell
        if isinstance(body, PodAdded | PodRemoved):
            spell = self.open.pop(body.pod_uid, None)
            if spell is None:
                return None
            spell.ended_seq, spell.ended_us = env.seq, env.ts
            spell.outcome = RESOLVED if isinstance(body, PodAdded) else DELETED
            return spell
        return None

    def of_pods(self, uids: Iterable[str]) -> list[PendingSpell]:
        """The waits of these pods, in the order they began."""
        wanted = set(uids)
        return [s for s in self.spells if s.pod_uid in wanted]


def pending_json(spell: PendingSpell, end_us: int) -> dict[str, object]:
    """One wait as JSON: pod, since, how it ended, duration (µs), and each step's reasons."""
    return {
        "pod_uid": spell.pod_uid,
        "namespace": spell.namespace,
        "name": spell.name,
        "since_us": spell.since_us,
        "since": iso_time(spell.since_us),
        "outcome": spell.outcome or "pending",
        "ended_seq": spell.ended_seq,
        "ended_us": spell.ended_us,
        "ended": iso_time(spell.ended_us) or None,
        "duration_us": spell.duration_us(end_us),
        "waiting": [_volume_json(w) for w in spell.waiting],
        "steps": [
            {
                "seq": step.seq,
                "ts_us": step.ts_us,
                "time": iso_time(step.ts_us),
                "waiting": [_volume_json(w) for w in step.waiting],
            }
            for step in spell.steps
        ],
    }


def _volume_json(w: PendingVolume) -> dict[str, object]:
    return {
        "name": w.name,
        "waits_for": w.waits_for,
        "reason": w.reason,
        "needs": list(w.needs),
        "text": w.text,
    }

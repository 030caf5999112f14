"""The device and pod-volume FSMs, built with `transitions` from `events.tables`.

One `transitions.Machine` per table is shared by every aggregate: models are
never added to it (that would bind a method per trigger to each of thousands
of objects). A decision runs the shared machine on a throw-away probe that
holds only the state, so an aggregate costs one small slotted object.
"""

from __future__ import annotations

from typing import Any

from transitions import Machine, MachineError

from events.tables import DEVICE_FSM, PODVOL_FSM, FsmTable
from volfsm.errors import IllegalTransitionError


class FsmModel:
    """The state of one aggregate (a device or a pod-volume) and its stream version."""

    __slots__ = ("state", "stream", "version")

    def __init__(self, stream: str, state: str, version: int = 0) -> None:
        self.stream = stream
        self.state = state
        self.version = version

    def __repr__(self) -> str:
        return f"FsmModel({self.stream!r}, {self.state!r}, v{self.version})"


class _Probe:
    __slots__ = ("state",)

    def __init__(self, state: str) -> None:
        self.state = state


class Fsm:
    """A state machine definition shared by every model of one kind."""

    def __init__(self, table: FsmTable) -> None:
        self.table = table
        self.machine = Machine(
            model=None,
            states=list(table.states),
            transitions=[self._row(t.trigger, t.sources, t.dest) for t in table.transitions],
            initial=table.initial,
            auto_transitions=False,
            ignore_invalid_triggers=False,
        )
        self._event_of = {t.trigger: t.event for t in table.transitions}
        self._decided: dict[tuple[str, str], str] = {}
        """(state, trigger) -> the state the machine moved a probe to: it has no conditions
        or callbacks, so a legal transition's outcome never changes."""

    @staticmethod
    def _row(trigger: str, sources: tuple[str, ...], dest: str | None) -> dict[str, Any]:
        return {"trigger": trigger, "source": list(sources), "dest": dest}

    def new_model(self, stream: str) -> FsmModel:
        """A model in the table's initial state."""
        return FsmModel(stream, self.table.initial)

    def event_for(self, trigger: str) -> str:
        """The event type a trigger is recorded as."""
        return self._event_of[trigger]

    def decide(self, model: FsmModel, trigger: str, event_type: str) -> str:
        """The state `model` would move to on `trigger`; raises if illegal.

        The model itself is not changed: the caller commits the new state
        only after the event is durably appended.
        """
        expected = self._event_of.get(trigger)
        if expected is None:
            raise IllegalTransitionError(model.stream, model.state, trigger, "unknown trigger")
        if expected != event_type:
            raise IllegalTransitionError(
                model.stream, model.state, trigger, f"records {expected}, not {event_type}"
            )
        decided = self._decided.get((model.state, trigger))
        if decided is not None:
            return decided
        probe = _Probe(model.state)
        try:
            self.machine.events[trigger].trigger(probe)
        except MachineError:
            raise IllegalTransitionError(model.stream, model.state, trigger) from None
        self._decided[model.state, trigger] = probe.state
        return probe.state

    def can(self, state: str, trigger: str) -> bool:
        """Whether `trigger` is legal in `state`."""
        return trigger in self.table.triggers_from(state)


DEVICE = Fsm(DEVICE_FSM)
PODVOL = Fsm(PODVOL_FSM)
FSMS: dict[str, Fsm] = {"device": DEVICE, "podvol": PODVOL}

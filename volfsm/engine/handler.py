"""The one command handler: the only code that writes events to the log.

For a transition it loads the aggregate (from its cache, or by reading the
stream), lets the shared FSM decide, and appends the event with the version
it loaded as the expected version. A concurrent writer that got there first
makes the append fail with a conflict; the handler then reloads and decides
again, so a trigger that has become illegal is refused, never half-applied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from events.errors import ConflictError
from events.log import ANY_VERSION, EventLog
from events.streams import stream_kind
from events.tables import FsmTable
from events.types import Body, Envelope
from volfsm.fsm import FSMS, Fsm, FsmModel

Listener = Callable[[list[Envelope]], None]

_MAX_CONFLICT_RETRIES = 8


class CommandHandler:
    """Decides transitions with the FSMs and appends them; notifies listeners."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self._models: dict[str, FsmModel] = {}
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        """Call `listener` with every batch of envelopes this handler appended."""
        self._listeners.append(listener)

    def _fsm(self, stream: str) -> Fsm:
        fsm = FSMS.get(stream_kind(stream))
        if fsm is None:
            raise ValueError(f"stream {stream!r} has no state machine")
        return fsm

    def load(self, stream: str) -> FsmModel:
        """The aggregate's current state and version (cached after the first load)."""
        model = self._models.get(stream)
        if model is None:
            model = self._reload(stream)
        return model

    def _reload(self, stream: str) -> FsmModel:
        table: FsmTable = self._fsm(stream).table
        model = FsmModel(stream, table.initial)
        for env in self.log.read_stream(stream):
            nxt = table.next_state(model.state, env.type)
            if nxt is not None:
                model.state = nxt
            model.version = env.version
        self._models[stream] = model
        return model

    def prime(self, stream: str, state: str, version: int) -> None:
        """Seed the cache from a fold of the log (recovery), avoiding a read per stream."""
        self._models[stream] = FsmModel(stream, state, version)

    def _commit(self, model: FsmModel, new_state: str, envs: list[Envelope]) -> list[Envelope]:
        model.state = new_state
        model.version = envs[-1].version
        for listener in self._listeners:
            listener(envs)
        return envs

    def fire(self, stream: str, trigger: str, body: Body) -> list[Envelope]:
        """Apply `trigger` to the aggregate `stream`, recorded as `body`. Durable on return."""
        fsm = self._fsm(stream)
        model = self.load(stream)
        for _ in range(_MAX_CONFLICT_RETRIES):
            new_state = fsm.decide(model, trigger, type(body).__name__)
            try:
                envs = self.log.append(stream, model.version, [body])
            except ConflictError:
                model = self._reload(stream)
                continue
            return self._commit(model, new_state, envs)
        raise ConflictError(stream, model.version, self.log.stream_version(stream))

    async def fire_async(
        self, stream: str, trigger: str, body: Body, then: Sequence[Body] = ()
    ) -> list[Envelope]:
        """`fire` for asyncio callers.

        `then`: records (not transitions) appended right after `body`, in the same
        append (one transaction): an operation's outcome after its last transition.
        """
        fsm = self._fsm(stream)
        model = self.load(stream)
        if then:
            self._check_not_transition(stream, then)
        bodies = [body, *then]
        for _ in range(_MAX_CONFLICT_RETRIES):
            new_state = fsm.decide(model, trigger, type(body).__name__)
            try:
                envs = await self.log.append_async(stream, model.version, bodies)
            except ConflictError:
                model = self._reload(stream)
                continue
            return self._commit(model, new_state, envs)
        raise ConflictError(stream, model.version, self.log.stream_version(stream))

    def _after_record(self, stream: str, envs: list[Envelope]) -> list[Envelope]:
        model = self._models.get(stream)
        if model is not None:
            model.version = envs[-1].version
        for listener in self._listeners:
            listener(envs)
        return envs

    def record(self, stream: str, bodies: Sequence[Body]) -> list[Envelope]:
        """Append non-transition events (operation records, desired state)."""
        self._check_not_transition(stream, bodies)
        return self._after_record(stream, self.log.append(stream, ANY_VERSION, bodies))

    async def record_async(self, stream: str, bodies: Sequence[Body]) -> list[Envelope]:
        """`record` for asyncio callers."""
        self._check_not_transition(stream, bodies)
        envs = await self.log.append_async(stream, ANY_VERSION, bodies)
        return self._after_record(stream, envs)

    def _check_not_transition(self, stream: str, bodies: Sequence[Body]) -> None:
        fsm = FSMS.get(stream_kind(stream))
        if fsm is None:
            return
        transitions = fsm.table.event_types()
        for b in bodies:
            if type(b).__name__ in transitions:
                raise ValueError(
                    f"{type(b).__name__} is a transition of {fsm.table.name}: use fire()"
                )

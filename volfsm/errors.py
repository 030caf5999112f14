"""Domain errors of the volfsm service layer."""

from __future__ import annotations


class VolfsmError(Exception):
    """Base of every volfsm service error."""


class IllegalTransitionError(VolfsmError):
    """A trigger is not legal in the aggregate's current state; nothing was appended."""

    def __init__(self, stream: str, state: str, trigger: str, detail: str = "") -> None:
        msg = f"stream {stream!r}: trigger {trigger!r} is not legal in state {state!r}"
        super().__init__(msg + (f" ({detail})" if detail else ""))
        self.stream = stream
        self.state = state
        self.trigger = trigger

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


class InvalidObjectError(VolfsmError):
    """An object was rejected; nothing was recorded.

    `obj` names the object ("Pod default/web", or "objects[3]" when it has no
    usable name), `path` the field inside it ("spec.volumes[1].name"),
    `field` both together, and `str(err)` is ``f"{field}: {message}"``.
    """

    def __init__(self, path: str, message: str, obj: str = "") -> None:
        self.obj = obj
        self.path = path
        self.message = message
        if obj and path:
            self.field = f"{obj}: {path}"
        else:
            self.field = obj or path
        super().__init__(f"{self.field}: {message}")

    def within(self, obj: str) -> InvalidObjectError:
        """The same error attributed to `obj` (unless it already names an object)."""
        if self.obj:
            return self
        return InvalidObjectError(self.path, self.message, obj)

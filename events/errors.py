"""Typed errors of the events layer."""

from __future__ import annotations


class VolfsmEventsError(Exception):
    """Base of every error raised by the events package."""


class ConflictError(VolfsmEventsError):
    """An append named a stale expected version; nothing was written."""

    def __init__(self, stream: str, expected: int, actual: int) -> None:
        super().__init__(
            f"stream {stream!r}: expected version {expected} but the log is at {actual}"
        )
        self.stream = stream
        self.expected = expected
        self.actual = actual


class UnknownEventError(VolfsmEventsError):
    """A stored event has a type or schema version this build cannot read."""


class LogOpenError(VolfsmEventsError):
    """The log file cannot be opened as asked (see the subclasses)."""


class NotAVolfsmLogError(LogOpenError):
    """The file exists but is not a volfsm event log. It was not modified."""


class NewerSchemaError(LogOpenError):
    """The log was written by a newer volfsm (higher log schema). It was not modified."""


class LogLockedError(LogOpenError):
    """Another process holds the log open for writing."""


class LogMissingError(LogOpenError):
    """No log exists at the given path (and creating one was not asked for)."""


class LogClosedError(VolfsmEventsError):
    """The log was closed; no more appends are accepted."""


class RestoreError(VolfsmEventsError):
    """Events given to `EventLog.restore` do not continue the log (seq, version, node, time)."""

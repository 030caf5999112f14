"""Text for people: times, durations, sizes, and the TIME arguments every command takes.

One home for how volfsm writes a time or a size and reads a TIME argument,
so `state`, `get`, `replay`, `explain`, the analytics report and the
dashboard say the same thing the same way. Imports only the ASW's operation record.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the CLI's start-up imports this, not the fold
    from projections.asw import OperationRecord

TIME_HELP = (
    "ISO 8601 time, e.g. 2024-05-01T03:10:00Z or 2024-05-01T05:10:00+02:00 (no offset: UTC), "
    "'now', or relative to now: -90s, -5m, -2h, -1d."
)
"""The TIME forms `parse_time` accepts, for help texts and errors."""

_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time(text: str, now_us: int | None = None) -> int:
    """A TIME argument as UTC µs; ValueError naming the accepted forms if it is none of them."""
    now = now_us if now_us is not None else time.time_ns() // 1000
    value = text.strip()
    if value == "now":
        return now
    rel = _RELATIVE.match(value)
    if rel is not None:
        return now - round(float(rel.group(1)) * _UNIT_S[rel.group(2)] * 1_000_000)
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{text!r} is not a time. Use an {TIME_HELP}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def iso_time(ts_us: int | None) -> str:
    """A UTC µs timestamp as ISO 8601 with milliseconds and `Z` ('' for None)."""
    if ts_us is None:
        return ""
    sec, us = divmod(ts_us, 1_000_000)
    return f"{datetime.fromtimestamp(sec, tz=UTC):%Y-%m-%dT%H:%M:%S}.{us // 1000:03d}Z"


class IsoClock:
    """`iso_time` that remembers what it formatted last (replays ask in time order)."""

    __slots__ = ("_last", "_prefix", "_sec", "_text")

    def __init__(self) -> None:
        self._last = -1
        self._text = ""
        self._sec = -1
        self._prefix = ""

    def __call__(self, ts_us: int) -> str:
        if ts_us == self._last:
            return self._text
        sec, us = divmod(ts_us, 1_000_000)
        if sec != self._sec:
            self._sec = sec
            self._prefix = f"{datetime.fromtimestamp(sec, tz=UTC):%Y-%m-%dT%H:%M:%S}"
        self._last = ts_us
        self._text = f"{self._prefix}.{us // 1000:03d}Z"
        return self._text


def duration_text(us: int) -> str:
    """A duration in µs for humans: '0.450s', '2m03.500s', '1h02m03s'."""
    seconds = us / 1_000_000
    if seconds < 60:
        return f"{seconds:.3f}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{int(minutes)}m{secs:06.3f}s"
    hours, mins = divmod(int(minutes), 60)
    return f"{hours}h{mins:02d}m{int(secs):02d}s"


def relative_text(target_us: int, at_us: int) -> str:
    """'in 2.500s', '1.000s ago' or 'now': `target_us` seen from `at_us`."""
    if target_us > at_us:
        return f"in {duration_text(target_us - at_us)}"
    if target_us < at_us:
        return f"{duration_text(at_us - target_us)} ago"
    return "now"


def size_text(n: int | None) -> str:
    """A size in bytes with a binary unit ('?' for None)."""
    if n is None:
        return "?"
    value = float(n)
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"


def seconds_text(seconds: float) -> str:
    """A float number of seconds as written in the log: '0.5s', '122s'."""
    return f"{seconds:g}s"


# ------------------------------------------------------------------ operations

ERROR_MESSAGE_LIMIT = 120
"""Listings cut an error message to this many characters (`explain` and `replay` do not)."""


def operation_text(
    operation: str, status: str, *, took_us: int | None = None, since_us: int | None = None
) -> str:
    """'volume_mount succeeded in 0.012s', 'volume_mount running since <time>'."""
    if took_us is not None:
        return f"{operation} {status} in {duration_text(took_us)}"
    if since_us is not None:
        return f"{operation} {status} since {iso_time(since_us)}"
    return f"{operation} {status}"


def error_kind(final: bool | None, backoff_s: float) -> str:
    """'final, backoff 4s', 'non-final, backoff 0.5s', 'final': what follows a failure."""
    kind = "final" if final else "non-final"
    return f"{kind}, backoff {backoff_s:g}s" if backoff_s else kind


def error_text(
    operation: str,
    code: str,
    message: str,
    final: bool | None,
    backoff_s: float,
    *,
    limit: int | None = ERROR_MESSAGE_LIMIT,
) -> str:
    """'volume_mount: DeadlineExceeded: <message> (non-final, backoff 0.5s)'."""
    if limit is not None and len(message) > limit:
        message = message[: limit - 3] + "..."
    return f"{operation}: {code}: {message} ({error_kind(final, backoff_s)})"


def describe_operation(op: OperationRecord | None) -> str:
    """An entry's last operation, as every command words it ('' for None)."""
    if op is None:
        return ""
    if op.ended_us is None:
        return operation_text(op.operation, op.status, since_us=op.started_us)
    return operation_text(op.operation, op.status, took_us=op.ended_us - op.started_us)


def describe_error(op: OperationRecord | None) -> str:
    """An entry's last error, as every command words it ('' for None)."""
    if op is None:
        return ""
    return error_text(op.operation, op.code, op.message, op.final, op.backoff_s)


def attempt_text(
    operation: str,
    status: str,
    took_us: int | None,
    failure: tuple[str, str, bool | None, float] | None,
    *,
    limit: int | None = None,
) -> str:
    """One attempt in one line: 'volume_mount failed in 0.5s: Internal: <message> (final)'.

    `failure` is (code, message, final, backoff_s) for a failed attempt.
    """
    text = operation_text(operation, status, took_us=took_us)
    if failure is None:
        return text
    code, message, final, backoff_s = failure
    return text + error_text("", code, message, final, backoff_s, limit=limit)


def describe_attempt(op: OperationRecord | None, *, limit: int | None = None) -> str:
    """`attempt_text` of an entry's last operation ('' for None)."""
    if op is None:
        return ""
    if op.ended_us is None:
        return operation_text(op.operation, op.status, since_us=op.started_us)
    failed = op.status == "failed"
    failure = (op.code, op.message, op.final, op.backoff_s) if failed else None
    return attempt_text(op.operation, op.status, op.ended_us - op.started_us, failure, limit=limit)

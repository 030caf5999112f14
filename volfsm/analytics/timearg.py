"""TIME arguments of the analytics commands and endpoints, as UTC µs.

The same forms as the other `volfsm` commands take: ISO 8601 (with `Z`,
an offset, or none for UTC), `now`, or relative to now (`-90s`, `-5m`,
`-2h`, `-1d`). Kept here so the analytics package does not import the main
CLI (which will import it).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

TIME_HELP = (
    "ISO 8601 time, e.g. 2024-05-01T03:10:00Z (no offset: UTC), 'now', "
    "or relative to now: -90s, -5m, -2h, -1d."
)

_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time(text: str, now_us: int | None = None) -> int:
    """`text` as UTC µs; ValueError naming the accepted forms if it is none of them."""
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

"""Crash testing as a feature: SIGKILL this process at a named point.

Off by default. Armed by the environment variable `VOLFSM_FAULT_POINT`
(or `configure()`, which `volfsm serve --fault-point` calls) with a spec
`POINT[/QUALIFIER][@N]`: the process kills itself with SIGKILL the N-th
time (default: first) code reaches `hit(POINT, QUALIFIER...)`. A
qualifier narrows the point, e.g. `driver.before/mount_device` fires only
before a MountDevice call; without one any qualifier matches.

SIGKILL, not an exception: nothing gets to clean up, flush or append, which
is exactly what a power cut or an OOM kill does to a node service.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

ENV_VAR = "VOLFSM_FAULT_POINT"

FAULT_POINTS: tuple[str, ...] = (
    "driver.before",  # an operation is about to call its plugin
    "driver.during",  # the plugin call is in flight
    "driver.after",  # the plugin returned; its outcome is not yet appended
    "append.after",  # the outcome is durable; the relay has not published it
    "relay.before_cursor",  # JetStream acked; the relay cursor is not yet advanced
    "reconstruct.start",  # reconstruction began; nothing marked yet
    "reconstruct.mid",  # reconstruction appended some of its marks
)
"""Every point the code calls `hit` with (a spec naming another is refused)."""


class FaultSpecError(ValueError):
    """A fault-point spec that names no known point or has a bad count."""


@dataclass
class _Armed:
    point: str
    qualifier: str
    remaining: int


_armed: _Armed | None = None


def parse(spec: str) -> _Armed:
    """Parse `POINT[/QUALIFIER][@N]`, naming what is wrong."""
    text, _, count = spec.strip().partition("@")
    point, _, qualifier = text.partition("/")
    if point not in FAULT_POINTS:
        raise FaultSpecError(
            f"unknown fault point {point!r} in {spec!r}; known: {', '.join(FAULT_POINTS)}"
        )
    n = 1
    if count:
        try:
            n = int(count)
        except ValueError:
            msg = f"fault point count {count!r} in {spec!r} is not a number"
            raise FaultSpecError(msg) from None
        if n < 1:
            raise FaultSpecError(f"fault point count in {spec!r} must be 1 or more")
    return _Armed(point, qualifier, n)


def configure(spec: str | None) -> None:
    """Arm one fault point (None or "" disarms)."""
    global _armed
    _armed = parse(spec) if spec else None


def armed() -> str | None:
    """The armed point, or None."""
    return None if _armed is None else _armed.point


def hit(point: str, *qualifiers: str) -> None:
    """Code reached `point`: SIGKILL the process if that is the armed one and its turn."""
    a = _armed
    if a is None or a.point != point:
        return
    if a.qualifier and a.qualifier not in qualifiers:
        return
    a.remaining -= 1
    if a.remaining > 0:
        return
    sys.stderr.write(f"volfsm: fault point {point} {'/'.join(qualifiers)}: SIGKILL\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


configure(os.environ.get(ENV_VAR))

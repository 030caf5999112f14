"""Crash testing as a feature: SIGKILL this process at a named point.

Off by default. Armed by the environment variable `VOLFSM_FAULT_POINT`,
`volfsm serve --fault-point` or `configure()` with a spec `POINT[/QUALIFIER...][@N][+SECONDS]`: the
process kills itself with SIGKILL the N-th time (default: the first) code
reaches `hit(POINT, ...)` with every QUALIFIER matching.

Qualifiers narrow a point. A hit matches a qualifier when it names one of

* what the hit passes: the plugin call (`MountDevice`, `SetUp`,
  `TearDown`, `UnmountDevice`, `SetUpDevice`, `MapPodDevice`,
  `UnmapPodDevice`, `TearDownDevice`, `DeviceOpened`, `WaitForAttach`,
  `NodeExpandVolume`) for the `driver.*` points, the event type just
  appended (`OperationStarted`, `DeviceMounted`, `VolumeUnmounted`, ...)
  for `append.after` and `relay.before_publish`;
* the operation running the code (`volume_mount`, `map_volume`,
  `volume_unmount`, `unmap_volume`, `unmount_device`, `unmap_device`,
  `volume_fs_resize`, `mark_detached`) and each part of its plugin
  (`csi`, `csi.volfsm.dev`, `empty-dir`): see `operation()`.

Case, `_` and `-` do not matter: `driver.before/mount_device` fires before
a MountDevice call, `append.after/volume_unmount/OperationSucceeded` right
after a pod unmount recorded its success, `driver.during/empty-dir/set_up`
while an emptyDir SetUp is in flight.

`+SECONDS` (only for `driver.during`, default 0.2) is how long the call may
be in flight before the kill; a call that returns sooner is killed as it
returns, before its result is used. Give the CSI driver a delay on that RPC
and the driver really holds the request when the process dies.

SIGKILL, not an exception: nothing gets to clean up, flush or append, which
is exactly what a power cut or an OOM kill does to a node service. Just
before it the process writes one line to stderr:
`volfsm: fault point <point> <qualifiers> [pod=<uid> volume=<id>]: SIGKILL`
(the bracket only for hits inside an operation).

Disarmed, `hit` is one global read and a comparison; `operation` and
`in_flight` return at once.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import NoReturn, TypeVar

T = TypeVar("T")

ENV_VAR = "VOLFSM_FAULT_POINT"

FAULT_POINTS: tuple[str, ...] = (
    "driver.before",  # an operation is about to call its plugin
    "driver.during",  # the plugin call is in flight
    "driver.after",  # the plugin returned (or raised); its outcome is not yet appended
    "append.after",  # an event is durable in the log; nothing after it has run
    "relay.before_publish",  # the relay is about to publish an event to JetStream
    "relay.before_cursor",  # JetStream acked; the relay cursor is not yet advanced
    "reconstruct.start",  # reconstruction began; nothing marked yet
    "reconstruct.mid",  # reconstruction appended some of its marks
)
"""Every point the code calls `hit` with (a spec naming another is refused)."""

DURING_POINTS = frozenset({"driver.during"})
"""Points armed through `in_flight`, where `+SECONDS` applies."""

DEFAULT_IN_FLIGHT_S = 0.2

_SPEC = re.compile(
    r"^(?P<point>[A-Za-z_.]+)(?P<quals>(?:/[^/@+]+)*)(?:@(?P<n>[^+]*))?(?:\+(?P<s>.*))?$"
)


class FaultSpecError(ValueError):
    """A fault-point spec that names no known point or has a bad count or delay."""


@dataclass
class Armed:
    """The armed point: what must match, and how many matching hits are left."""

    point: str
    qualifiers: tuple[str, ...]
    """Normalised (see `_norm`); every one must match."""
    remaining: int
    in_flight_s: float = DEFAULT_IN_FLIGHT_S


_armed: Armed | None = None
_operation: ContextVar[tuple[str, ...]] = ContextVar("volfsm_fault_operation", default=())
_target: ContextVar[str] = ContextVar("volfsm_fault_target", default="")


def _norm(text: str) -> str:
    return text.lower().replace("_", "").replace("-", "")


def parse(spec: str) -> Armed:
    """Parse `POINT[/QUALIFIER...][@N][+SECONDS]`, naming what is wrong."""
    text = spec.strip()
    m = _SPEC.match(text)
    if m is None:
        raise FaultSpecError(f"fault point spec {spec!r} is not POINT[/QUALIFIER...][@N][+SECONDS]")
    point = m["point"]
    if point not in FAULT_POINTS:
        raise FaultSpecError(
            f"unknown fault point {point!r} in {spec!r}; known: {', '.join(FAULT_POINTS)}"
        )
    qualifiers = tuple(_norm(q) for q in m["quals"].split("/") if q)
    n = 1
    if m["n"] is not None:
        try:
            n = int(m["n"])
        except ValueError:
            msg = f"fault point count {m['n']!r} in {spec!r} is not a number"
            raise FaultSpecError(msg) from None
        if n < 1:
            raise FaultSpecError(f"fault point count in {spec!r} must be 1 or more")
    delay = DEFAULT_IN_FLIGHT_S
    if m["s"] is not None:
        if point not in DURING_POINTS:
            raise FaultSpecError(
                f"+SECONDS in {spec!r} applies only to {', '.join(sorted(DURING_POINTS))}"
            )
        try:
            delay = float(m["s"])
        except ValueError:
            raise FaultSpecError(f"delay {m['s']!r} in {spec!r} is not a number") from None
        if not 0 <= delay < 3600:
            raise FaultSpecError(f"delay in {spec!r} must be 0 or more seconds")
    return Armed(point, qualifiers, n, delay)


def configure(spec: str | None) -> None:
    """Arm one fault point (None or "" disarms); FaultSpecError for a bad spec."""
    global _armed
    _armed = parse(spec) if spec else None


def armed() -> str | None:
    """The armed point, or None."""
    return None if _armed is None else _armed.point


def operation(name: str, plugin: str = "", pod_uid: str = "", volume_id: str = "") -> None:
    """Name the operation the current asyncio task runs (its hits match it and its plugin).

    The executor calls this at the start of each operation's task; the
    context variables are the task's own, so concurrent operations do not
    mix. The pod and volume only go into the kill line (`[pod=... volume=...]`),
    so that a test knows whose operation died.
    """
    if _armed is None:
        return
    parts = tuple(p for p in re.split(r"[/:]", plugin) if p)
    _operation.set((name, *parts))
    _target.set(f" [pod={pod_uid or '-'} volume={volume_id or '-'}]")


def _due(a: Armed, qualifiers: tuple[str, ...]) -> bool:
    """Whether this matching hit is the armed one's turn (counts it)."""
    if a.qualifiers:
        have = {_norm(q) for q in (*qualifiers, *_operation.get())}
        if not all(q in have for q in a.qualifiers):
            return False
    a.remaining -= 1
    return a.remaining <= 0


def _kill(point: str, qualifiers: tuple[str, ...], how: str = "") -> NoReturn:
    where = "/".join((*_operation.get(), *qualifiers))
    sys.stderr.write(f"volfsm: fault point {point} {where}{how}{_target.get()}: SIGKILL\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(137)  # not reached: SIGKILL cannot be caught


def hit(point: str, *qualifiers: str) -> None:
    """Code reached `point`: SIGKILL the process if that is the armed one and its turn."""
    a = _armed
    if a is None or a.point != point:
        return
    if _due(a, qualifiers):
        _kill(point, qualifiers)


def in_flight(point: str, call: Callable[[], Awaitable[T]], *qualifiers: str) -> Awaitable[T]:
    """`call()`, or - when `point` is armed and due - `call()` killed while it is in flight.

    Armed, the call starts as a task; the process is SIGKILLed after the
    spec's `+SECONDS`, or as soon as the call returns if that is sooner
    (before anyone sees its result).
    """
    a = _armed
    if a is None or a.point != point or not _due(a, qualifiers):
        return call()
    return _kill_in_flight(call(), point, qualifiers, a.in_flight_s)


async def _kill_in_flight(
    work: Awaitable[T], point: str, qualifiers: tuple[str, ...], delay: float
) -> NoReturn:
    task = asyncio.ensure_future(work)
    await asyncio.wait({task}, timeout=delay)
    _kill(point, qualifiers, " (call returned)" if task.done() else " (call in flight)")


def _configure_from_env() -> str:
    """Arm from `VOLFSM_FAULT_POINT`; a bad spec leaves it disarmed and is returned.

    Not raised at import: `volfsm serve` reads the same variable as its
    `--fault-point` option and refuses a bad spec with a one-line error.
    """
    try:
        configure(os.environ.get(ENV_VAR))
    except FaultSpecError as exc:
        return str(exc)
    return ""


ENV_ERROR = _configure_from_env()
"""Why `VOLFSM_FAULT_POINT` was refused at import ("" if it was not)."""

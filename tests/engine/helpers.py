"""Small helpers for engine scenarios: reading the log back, waiting for conditions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from events.log import EventLog
from events.streams import device_stream, podvol_stream
from events.types import Envelope, OperationFailed, OperationStarted
from volfsm.engine import VolumeEngine


def envelopes(log: EventLog, stream: str | None = None) -> list[Envelope]:
    """The whole log, or one stream of it."""
    if stream is None:
        return list(log.read_after(0))
    return log.read_stream(stream)


def types_of(log: EventLog, stream: str) -> list[str]:
    """Event types of one stream, in order."""
    return [env.type for env in log.read_stream(stream)]


def transitions_of(log: EventLog, stream: str) -> list[str]:
    """Transition event types of one stream (operation records left out)."""
    return [t for t in types_of(log, stream) if not t.startswith("Operation")]


def device_transitions(log: EventLog, volume_id: str) -> list[str]:
    """The device FSM's events of a volume."""
    return transitions_of(log, device_stream(volume_id))


def podvol_transitions(log: EventLog, uid: str, name: str) -> list[str]:
    """The pod-volume FSM's events of one pod's volume."""
    return transitions_of(log, podvol_stream(uid, name))


def operations(log: EventLog) -> list[tuple[str, str]]:
    """(operation name, stream) of every OperationStarted, in order."""
    return [
        (env.body.operation, env.stream)
        for env in log.read_after(0)
        if isinstance(env.body, OperationStarted)
    ]


def failures(log: EventLog, operation: str | None = None) -> list[OperationFailed]:
    """Every OperationFailed (of one operation name), in order."""
    return [
        env.body
        for env in log.read_after(0)
        if isinstance(env.body, OperationFailed)
        and (operation is None or env.body.operation == operation)
    ]


def device_state(engine: VolumeEngine, volume_id: str) -> str:
    """The live device state ("Detached" when the ASW has no record)."""
    dev = engine.asw.devices.get(volume_id)
    return dev.state if dev is not None else "Detached"


def podvol_state(engine: VolumeEngine, uid: str, name: str) -> str:
    """The live pod-volume state ("Unmounted" when the ASW has no record)."""
    pv = engine.asw.podvols.get((uid, name))
    return pv.state if pv is not None else "Unmounted"


async def eventually(
    predicate: Callable[[], bool], what: str = "condition", timeout: float = 10.0
) -> None:
    """Poll `predicate` until it holds; fail after `timeout` seconds (an upper bound only)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)

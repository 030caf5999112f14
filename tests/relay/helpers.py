"""Shared helpers: events to append, and the stream read back through a JetStream consumer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import nats
from nats.js.api import DeliverPolicy

from events.codec import envelope_to_json
from events.log import ANY_VERSION, EventLog
from events.subjects import events_subject, msg_id, msg_key, node_events_filter
from events.types import Body, DeviceAttached, DeviceMounted, OperationStarted, VolumeResized
from volfsm.bus.relay import Relay

NODE = "n1"
STREAM = "VOLFSM"


@dataclass(frozen=True)
class StreamedEvent:
    """One message as the stream holds it, or as the relay should have published it."""

    subject: str
    msg_id: str
    data: bytes


def bodies(n: int, start: int = 0) -> list[Body]:
    """`n` bodies of a few different event types (so several subjects are used)."""
    out: list[Body] = []
    for i in range(start, start + n):
        vol = f"vol-{i % 7}"
        kind = i % 4
        if kind == 0:
            out.append(OperationStarted(op_id=f"op-{i}", operation="MountDevice", volume_id=vol))
        elif kind == 1:
            out.append(DeviceAttached(volume_id=vol, plugin="csi/x", device_path=f"/dev/x{i}"))
        elif kind == 2:
            out.append(DeviceMounted(volume_id=vol, device_mount_path=f"/m/{i}"))
        else:
            out.append(VolumeResized(volume_id=vol, size_bytes=i * 4096))
    return out


async def append_events(
    log: EventLog, n: int, *, batch: int = 25, relay: Relay | None = None
) -> int:
    """Append `n` events in batches (waking `relay` after each); returns the last seq."""
    done = 0
    last = log.last_seq()
    while done < n:
        size = min(batch, n - done)
        envs = await log.append_async(f"device/vol-{done % 5}", ANY_VERSION, bodies(size, done))
        last = envs[-1].seq
        done += size
        if relay is not None:
            relay.notify()
    return last


def expected_from_log(log: EventLog, node: str = NODE) -> list[StreamedEvent]:
    """What the stream must hold for `node`: every logged event, once, in seq order."""
    key = msg_key(log.log_id)
    return [
        StreamedEvent(
            events_subject(node, env.type), msg_id(node, env.seq, key), envelope_to_json(env)
        )
        for env in log.read_after(0)
    ]


async def read_stream(
    url: str, *, stream: str = STREAM, node: str = NODE, **connect: Any
) -> list[StreamedEvent]:
    """Every message of `node` in `stream`, in stream order, read with an ordered consumer."""
    nc = await nats.connect(url, **connect)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream, subjects_filter=node_events_filter(node))
        total = sum((info.state.subjects or {}).values())
        sub = await js.subscribe(
            node_events_filter(node),
            stream=stream,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )
        out: list[StreamedEvent] = []
        try:
            while len(out) < total:
                msg = await sub.next_msg(timeout=10)
                headers = msg.headers or {}
                out.append(StreamedEvent(msg.subject, headers.get("Nats-Msg-Id", ""), msg.data))
        finally:
            await sub.unsubscribe()
        return out
    finally:
        await nc.close()


async def wait_until(predicate: Any, *, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll `predicate()` until true; fail with `what` after `timeout` (a safety net only)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def assert_stream_matches_log(relay: Relay, log: EventLog, url: str, **connect: Any) -> None:
    """Flush the relay, then check the stream holds exactly the log: once each, in order."""
    assert await relay.flush(60), f"relay did not catch up: lag {relay.lag()}, {relay.last_error}"
    got = await read_stream(url, **connect)
    want = expected_from_log(log)
    assert len(got) == len(want), f"stream has {len(got)} events, log has {len(want)}"
    dupes = len(got) - len({e.msg_id for e in got})
    assert dupes == 0, f"{dupes} duplicated events in the stream"
    assert got == want

"""A pull fetch for the aggregator: nats-py's requests, without a task per message.

`PullSubscription.fetch` waits for each message of a batch with
`next_msg(timeout)`, an `asyncio.wait_for` (a task and a timer) per
message: at fleet rates that is most of what consuming costs. `fetch`
sends the same pull requests (a no-wait request, then a lingering one if
nothing came) and takes the messages from the subscription's queue as
they are there, under one deadline for the whole batch. It reads the
subscription's queue and request subject, which nats-py keeps private;
`tests/analytics/test_fetch.py` holds it to `PullSubscription.fetch`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

_END = frozenset({api.StatusCode.NO_MESSAGES, api.StatusCode.REQUEST_TIMEOUT})
_SKIP = frozenset({api.StatusCode.CONTROL_MESSAGE})
_TEMPORARY = frozenset({api.StatusCode.CONFLICT})


async def fetch(psub: JetStreamContext.PullSubscription, batch: int, timeout: float) -> list[Msg]:
    """Up to `batch` messages of a pull consumer, waiting at most about `timeout` s ([] if none).

    Raises `nats.js.errors.APIError` for a status that is no temporary one
    (the consumer or stream went away), as `PullSubscription.fetch` does.
    """
    sub: Any = psub._sub
    start = time.monotonic()
    msgs = _leftovers(sub, batch)
    if len(msgs) >= batch:
        return msgs
    first: dict[str, Any] = {"batch": batch - len(msgs), "no_wait": True}
    if not msgs:
        first["expires"] = int(timeout * 1e9) - 100_000
    await _request(psub, first)
    await _collect(sub, msgs, batch, timeout)
    if msgs:
        return msgs
    remaining = timeout - (time.monotonic() - start)
    if remaining <= 0.001:
        return msgs
    await _request(psub, {"batch": batch, "expires": int(remaining * 1e9) - 100_000})
    await _collect(sub, msgs, batch, remaining)
    return msgs


async def _request(psub: JetStreamContext.PullSubscription, request: dict[str, Any]) -> None:
    p: Any = psub
    await p._nc.publish(p._nms, json.dumps(request).encode(), p._deliver)


def _leftovers(sub: Any, batch: int) -> list[Msg]:
    """Messages already queued (statuses of earlier requests dropped)."""
    queue: asyncio.Queue[Msg] = sub._pending_queue
    msgs: list[Msg] = []
    while len(msgs) < batch and not queue.empty():
        msg = queue.get_nowait()
        sub._pending_size -= len(msg.data)
        if not (msg.headers and msg.headers.get(api.Header.STATUS)):
            msgs.append(msg)
    return msgs


async def _collect(sub: Any, msgs: list[Msg], batch: int, timeout: float) -> None:
    """Take messages into `msgs` until the batch is full, the request ends, or the deadline."""
    queue: asyncio.Queue[Msg] = sub._pending_queue
    try:
        async with asyncio.timeout(timeout):
            while len(msgs) < batch:
                msg = await queue.get()
                sub._pending_size -= len(msg.data)
                status = msg.headers.get(api.Header.STATUS) if msg.headers else None
                if not status:
                    msgs.append(msg)
                elif status in _END or status in _TEMPORARY:
                    return
                elif status not in _SKIP:
                    raise nats.js.errors.APIError.from_msg(msg)
    except TimeoutError:
        return

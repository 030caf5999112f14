"""Reading a node's events from JetStream for `volfsm events` (nats-py, an ordered consumer)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec
import nats.errors
import nats.js.errors
from nats.js.api import DeliverPolicy

from events.codec import envelope_from_json
from events.subjects import command_subject, events_subject, node_events_filter
from volfsm.bus.connect import connect_once
from volfsm.bus.errors import NatsAuthError
from volfsm.bus.roles import CLIENT_INBOX_PREFIX
from volfsm.service.target import AUTH_HINT, RUNNING_HINT, Target

LOOKUP_TIMEOUT_S = 2.0


class TailError(Exception):
    """Reading the stream failed; `usage`: the caller's mistake (exit 2), else exit 1."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


class Filter(Protocol):
    """What `tail` asks of the filter (`volfsm.cli.events.EventFilter`)."""

    pod: Any
    pod_uids: set[str]
    types: frozenset[str]

    def learn(self, env: Any) -> None:
        """See an event before filtering (pod names)."""

    def keeps(self, env: Any) -> bool:
        """Whether to show it."""


Show = Callable[[Any, bytes], None]


def tail(
    target: Target,
    stream: str,
    flt: Filter,
    show: Show,
    *,
    since_us: int | None,
    follow: bool,
    idle_s: float,
) -> None:
    """Print the node's events (see `volfsm.cli.events`); Ctrl-C and SIGTERM end it cleanly."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(target, stream, flt, show, since_us, follow, idle_s))


CLOSE_TIMEOUT_S = 2.0
"""How long a stopping tail waits for its NATS connection to close."""
STOP_GRACE_S = 5.0
"""After SIGTERM, how long the tail may take to end before it exits regardless."""


def _leave_now() -> None:
    """Exit 0 at once, what was printed flushed (a stop that did not finish in time)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(0)


async def _main(
    target: Target,
    stream: str,
    flt: Filter,
    show: Show,
    since_us: int | None,
    follow: bool,
    idle_s: float,
) -> None:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    def stop() -> None:
        task.cancel()
        # A tail that is stopped must end: if closing the NATS connection or the
        # event loop's shutdown hangs, leave anyway after a few seconds.
        loop.call_later(STOP_GRACE_S, _leave_now)

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGTERM, stop)
    nc = await _connect(target)
    try:
        await _learn_pods(nc, target, flt)
        sub = await _subscribe(nc, target, stream, flt, since_us, follow)
        await _read(sub, flt, show, follow, idle_s)
    except asyncio.CancelledError:
        return
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), CLOSE_TIMEOUT_S)  # a stop must not hang


async def _connect(target: Target) -> Any:
    async def ignore(*_: object) -> None:
        return None

    try:
        return await connect_once(
            target.url,
            connect_timeout_s=5.0,
            error_cb=ignore,
            disconnected_cb=ignore,
            closed_cb=ignore,
            name="volfsm-events",
            **{"inbox_prefix": CLIENT_INBOX_PREFIX, **target.options},
        )
    except NatsAuthError as exc:
        raise TailError(f"{exc} ({AUTH_HINT})") from None
    except (ConnectionError, nats.errors.Error, OSError) as exc:
        raise TailError(f"{exc}: {RUNNING_HINT}") from None


async def _learn_pods(nc: Any, target: Target, flt: Filter) -> None:
    """The uids the node has now for the pod asked for by name (nothing if it does not answer)."""
    if flt.pod is None:
        return
    subject = command_subject(target.node, "get")
    try:
        msg = await nc.request(subject, b'{"what":"pods"}', timeout=LOOKUP_TIMEOUT_S)
        reply = msgspec.json.decode(msg.data)
    except (nats.errors.Error, msgspec.DecodeError):
        return
    ref = flt.pod
    for pod in reply.get("items", []) if isinstance(reply, dict) else []:
        if (pod.get("namespace"), pod.get("name")) == (ref.namespace, ref.name):
            flt.pod_uids.add(str(pod.get("uid")))


async def _subscribe(
    nc: Any, target: Target, stream: str, flt: Filter, since_us: int | None, follow: bool
) -> Any:
    subject = node_events_filter(target.node)
    if len(flt.types) == 1 and flt.pod is None:  # a pod by name needs its PodAdded events
        subject = events_subject(target.node, next(iter(flt.types)))
    kwargs: dict[str, Any] = {"deliver_policy": DeliverPolicy.NEW if follow else DeliverPolicy.ALL}
    if since_us is not None:
        when = datetime.fromtimestamp(since_us / 1e6, UTC).isoformat().replace("+00:00", "Z")
        kwargs = {"deliver_policy": DeliverPolicy.BY_START_TIME, "opt_start_time": when}
    js = nc.jetstream()
    try:
        return await js.subscribe(subject, stream=stream, ordered_consumer=True, **kwargs)
    except nats.js.errors.NotFoundError:
        raise TailError(f"no stream {stream} on {target.url} (--stream)", usage=True) from None
    except (nats.errors.Error, nats.js.errors.Error) as exc:
        raise TailError(
            f"cannot read stream {stream} on {target.url}: {exc or type(exc).__name__} (reading "
            "it takes a credential that may create a consumer: the admin role)"
        ) from None


async def _read(sub: Any, flt: Filter, show: Show, follow: bool, idle_s: float) -> None:
    if not follow and await _nothing_to_read(sub):
        return
    while True:
        try:
            msg = await sub.next_msg(timeout=3600.0 if follow else idle_s)
        except nats.errors.TimeoutError:
            if follow:
                continue
            return
        env = envelope_from_json(msg.data)
        flt.learn(env)
        if flt.keeps(env):
            show(env, bytes(msg.data))
            sys.stdout.flush()
        if not follow and msg.metadata.num_pending == 0:
            return


async def _nothing_to_read(sub: Any) -> bool:
    """Whether the consumer has no message for us at all (an empty window): do not wait."""
    if sub.pending_msgs:
        return False
    try:
        info = await sub.consumer_info()
    except (nats.errors.Error, nats.js.errors.Error):
        return False
    return int(info.num_pending or 0) == 0 and int(info.delivered.stream_seq or 0) == 0

"""Reading a node's events from JetStream for `volfsm events`: an ephemeral pull consumer.

Its name is the first free one of `volfsm.bus.roles.events_consumers()`
(the create request's action `create` never takes over a consumer that
exists), so the `client` role may read with it; it is deleted on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec
import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from events.codec import envelope_from_json
from events.subjects import command_subject, events_subject, node_events_filter
from volfsm.bus.connect import connect_once
from volfsm.bus.errors import NatsAuthError
from volfsm.bus.roles import CLIENT_INBOX_PREFIX, JS_API, events_consumers
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
        reader = await _subscribe(nc, target, stream, flt, since_us, follow)
        try:
            await _read(reader, flt, show, follow, idle_s)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(_delete(nc, stream, reader), CLOSE_TIMEOUT_S)
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


CONSUMER_EXISTS = 10148
"""JetStream's error code: a consumer of that name exists (another `volfsm events`)."""
STREAM_NOT_FOUND = 10059
FETCH_BATCH = 256
FOLLOW_WAIT_S = 5.0
"""With --follow: how long one pull waits for a new event before it asks again."""
INACTIVE_S = 30.0
"""The server removes a consumer this long after its last pull (a tail that was killed)."""


@dataclass
class Reader:
    """The pull consumer one `volfsm events` reads through."""

    sub: Any
    name: str
    pending: int
    """The events the consumer had for us when it was made."""


async def _subscribe(
    nc: Any, target: Target, stream: str, flt: Filter, since_us: int | None, follow: bool
) -> Reader:
    """Make an ephemeral pull consumer under the first free `volfsm_events_<k>` name."""
    subject = node_events_filter(target.node)
    if len(flt.types) == 1 and flt.pod is None:  # a pod by name needs its PodAdded events
        subject = events_subject(target.node, next(iter(flt.types)))
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.NEW if follow else DeliverPolicy.ALL,
        ack_policy=AckPolicy.NONE,
        filter_subject=subject,
        inactive_threshold=INACTIVE_S,
        num_replicas=1,
        mem_storage=True,
        description=f"volfsm events {uuid.uuid4().hex}",  # unique: two alike never share one
    )
    if since_us is not None:
        config.deliver_policy = DeliverPolicy.BY_START_TIME
        config.opt_start_time = datetime.fromtimestamp(since_us / 1e6, UTC)
    for name in events_consumers():
        config.name = name
        made = await _create(nc, target, stream, config)
        error = made.get("error")
        if error is None:
            sub = await nc.jetstream().pull_subscribe_bind(name, stream=stream)
            return Reader(sub, name, int(made.get("num_pending") or 0))
        if error.get("err_code") == STREAM_NOT_FOUND:
            raise TailError(f"no stream {stream} on {target.url} (--stream)", usage=True)
        if error.get("err_code") != CONSUMER_EXISTS:
            raise TailError(f"cannot read stream {stream} on {target.url}: {error}")
    raise TailError(
        f"{len(events_consumers())} `volfsm events` are reading stream {stream} already (every"
        " consumer name it may use is taken); try again when one ends"
    )


async def _create(nc: Any, target: Target, stream: str, config: ConsumerConfig) -> Any:
    """The filtered create request, action `create` (it never changes an existing consumer)."""
    subject = f"{JS_API}.CONSUMER.CREATE.{stream}.{config.name}.{config.filter_subject}"
    body = {"stream_name": stream, "config": config.as_dict(), "action": "create"}
    try:
        reply = await nc.request(subject, json.dumps(body).encode(), timeout=LOOKUP_TIMEOUT_S)
        return json.loads(reply.data)
    except (nats.errors.Error, ValueError) as exc:
        raise TailError(
            f"cannot read stream {stream} on {target.url}: {exc or type(exc).__name__} (with"
            " the bus roles, reading takes the client role's rights on this stream's"
            " volfsm_events_<k> consumers)"
        ) from None


async def _read(reader: Reader, flt: Filter, show: Show, follow: bool, idle_s: float) -> None:
    pending = reader.pending
    if not follow and pending == 0:
        return
    while True:
        # A pull for as many as are pending returns at once; one for 1 returns on the next event.
        batch = min(FETCH_BATCH, max(1, pending))
        try:
            msgs = await reader.sub.fetch(batch, timeout=FOLLOW_WAIT_S if follow else idle_s)
        except nats.errors.TimeoutError:
            if follow:
                continue
            return
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise TailError(f"stopped reading the stream: {exc or type(exc).__name__}") from None
        for msg in msgs:
            env = envelope_from_json(msg.data)
            flt.learn(env)
            if flt.keeps(env):
                show(env, bytes(msg.data))
                sys.stdout.flush()
            pending = int(msg.metadata.num_pending)
        if not follow and pending == 0:
            return


async def _delete(nc: Any, stream: str, reader: Reader) -> None:
    """Remove the consumer (the server would after `INACTIVE_S`); a stop must not hang."""
    with contextlib.suppress(Exception):
        await reader.sub.unsubscribe()
        await nc.jetstream().delete_consumer(stream, reader.name)

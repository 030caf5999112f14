"""Read one node's events back out of the JetStream stream, oldest first.

Used to put back a node's lost log (`volfsm.service.restore`). An
ephemeral pull consumer filtered on `volfsm.<node>.events.>` delivers
every stored event of the node in stream order, which is the node's log
order (the relay publishes in seq order and never skips).

The consumer has the one name the `node` role may use
(`volfsm_history_<node>`) and is created with the filtered form of the
create request, `$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`: the
server refuses a request whose filter differs from the one in its subject,
so NATS can let a node create that consumer on its own subjects only. A
consumer of that name left behind (a restore that crashed) is deleted
first, so the history is always read from its start.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from events.codec import envelope_from_json
from events.errors import VolfsmEventsError
from events.subjects import node_events_filter
from events.types import Envelope
from volfsm.bus.errors import StreamConfigError
from volfsm.bus.roles import history_consumer
from volfsm.bus.stream import last_node_seq

FETCH_BATCH = 2048
FETCH_TIMEOUT_S = 5.0
"""How long one fetch may wait for messages the stream says it holds."""
INACTIVE_S = 60.0
"""The server removes the ephemeral consumer after this long without a fetch."""


async def node_history(
    js: JetStreamContext, stream: str, node: str, *, batch: int = FETCH_BATCH
) -> AsyncIterator[list[Envelope]]:
    """Every event of `node` stored in `stream`, in batches, up to its newest when called.

    Raises `StreamConfigError` if a message is not a volfsm event of this
    node, or if the stream stops delivering before that newest event.
    """
    last = await last_node_seq(js, stream, node)
    if last == 0:
        return
    subject = node_events_filter(node)
    name = history_consumer(node)
    config = ConsumerConfig(
        name=name,
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.NONE,
        filter_subject=subject,
        inactive_threshold=INACTIVE_S,
        num_replicas=1,
        mem_storage=True,
    )
    await _delete_consumer(js, stream, name)
    await js.add_consumer(stream, config)  # nats-py sends the filtered create (name + filter)
    sub = await js.pull_subscribe_bind(name, stream=stream)
    try:
        seq = 0
        while seq < last:
            try:
                msgs = await sub.fetch(batch, timeout=FETCH_TIMEOUT_S)
            except nats.errors.TimeoutError:
                raise StreamConfigError(
                    f"stream {stream} stopped delivering {subject} after seq {seq}; its newest"
                    f" event of node {node} is seq {last}"
                ) from None
            envelopes = []
            for msg in msgs:
                try:
                    env = envelope_from_json(msg.data)
                except (msgspec.DecodeError, VolfsmEventsError) as exc:
                    raise StreamConfigError(
                        f"stream {stream} message {msg.metadata.sequence.stream} on {msg.subject}"
                        f" is not a volfsm event: {exc}"
                    ) from None
                if env.node != node:
                    raise StreamConfigError(
                        f"stream {stream} holds an event of node {env.node!r} (seq {env.seq})"
                        f" on {msg.subject}"
                    )
                envelopes.append(env)
            if envelopes:
                seq = max(seq, envelopes[-1].seq)
                yield envelopes
    finally:
        await sub.unsubscribe()
        with contextlib.suppress(nats.errors.Error):
            await _delete_consumer(js, stream, name)


async def _delete_consumer(js: JetStreamContext, stream: str, name: str) -> None:
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_consumer(stream, name)

"""Read one node's events back out of the JetStream stream, oldest first.

Used to put back a node's lost log (`volfsm.service.restore`). An
ephemeral pull consumer filtered on `volfsm.<node>.events.>` delivers
every stored event of the node in stream order, which is the node's log
order (the relay publishes in seq order and never skips).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import nats.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from events.codec import envelope_from_json
from events.errors import VolfsmEventsError
from events.subjects import node_events_filter
from events.types import Envelope
from volfsm.bus.errors import StreamConfigError
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
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.NONE,
        filter_subject=subject,
        inactive_threshold=INACTIVE_S,
    )
    sub = await js.pull_subscribe(subject, stream=stream, config=config)
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

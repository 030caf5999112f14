"""The bus side: the outbox relay to JetStream and the NATS helpers the service and tests share.

`relay`: publish the log to the event stream, exactly once, in order;
`server`: run a real nats-server; `connect`: one connection attempt without
nats-py's reconnect; `stream`: create/check the event stream and read a
node's position in it; `history`: read a node's events back; `roles`: what
each side (node, client, aggregator, admin) may do on NATS; `errors`: setup
errors that need an operator.
"""

from volfsm.bus.connect import connect_once, is_refusal
from volfsm.bus.errors import NatsAuthError, NatsSetupError, StreamConfigError
from volfsm.bus.server import NatsServer, NatsServerError, find_nats_server, free_port
from volfsm.bus.stream import (
    StreamSetup,
    ensure_event_stream,
    event_stream_config,
    last_node_seq,
    may_drop_messages,
)

__all__ = [
    "NatsAuthError",
    "NatsServer",
    "NatsServerError",
    "NatsSetupError",
    "StreamConfigError",
    "StreamSetup",
    "connect_once",
    "ensure_event_stream",
    "event_stream_config",
    "find_nats_server",
    "free_port",
    "is_refusal",
    "last_node_seq",
    "may_drop_messages",
]

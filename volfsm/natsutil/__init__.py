"""NATS helpers shared by the relay, the service and the tests.

`server`: run a real nats-server; `connect`: one connection attempt without
nats-py's reconnect; `stream`: create/check the event stream and read a
node's position in it; `errors`: setup errors that need an operator.
"""

from volfsm.natsutil.connect import connect_once, is_refusal
from volfsm.natsutil.errors import NatsAuthError, NatsSetupError, StreamConfigError
from volfsm.natsutil.server import NatsServer, NatsServerError, find_nats_server, free_port
from volfsm.natsutil.stream import (
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

"""The bus side: the outbox relay to JetStream and the NATS helpers the service and tests share.

`relay`: publish the log to the event stream, exactly once, in order;
`server`: run a real nats-server; `connect`: one connection attempt without
nats-py's reconnect; `stream`: create/check the event stream and read a
node's position in it; `history`: read a node's events back; `roles`: what
each side (node, client, aggregator, admin) may do on NATS; `errors`: setup
errors that need an operator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOME = {
    "connect_once": "connect",
    "is_refusal": "connect",
    "NatsAuthError": "errors",
    "NatsSetupError": "errors",
    "StreamConfigError": "errors",
    "NatsServer": "server",
    "NatsServerError": "server",
    "find_nats_server": "server",
    "free_port": "server",
    "StreamSetup": "stream",
    "ensure_event_stream": "stream",
    "event_stream_config": "stream",
    "last_node_seq": "stream",
    "may_drop_messages": "stream",
}
"""Where each name lives: imported on first use, so a client that needs only `connect`
does not load the server runner and the stream setup (CLI start-up)."""


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'volfsm.bus' has no attribute {name!r}")
    return getattr(importlib.import_module(f"volfsm.bus.{home}"), name)


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

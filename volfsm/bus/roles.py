"""Who may do what on the bus: the four roles and the NATS permissions each one needs.

* `node` (one per node): publish its own events `volfsm.<node>.events.>`,
  receive its own commands `volfsm.<node>.cmd.>` and answer them, and the
  few JetStream API calls the relay and `--restore-from-stream` make, each
  scoped to this node by its subject: stream info, direct get of the last
  message on its own subjects, and one pull consumer of its own (a fixed
  name, filtered on its own subjects) to read its history back.
* `client` (`volfsm apply/get/delete/wait/events`): send commands to chosen
  nodes, and read their events back (`volfsm events`): create, with the
  filtered create request, a pull consumer under one of a few fixed names
  (`volfsm_events_<k>`) filtered on those nodes' events, pull from it and
  delete it.
  No other consumer name, no stream or message API: it cannot touch the
  aggregator's or a node's consumer, purge, or delete.
* `aggregator` (`volfsm analytics serve`): its own durable consumer over
  every node's events, read-only: no purge, no message or stream delete.
* `admin` (`volfsm stream create|check`): the JetStream API, the only role
  that may create, update, purge or delete the stream.

Replies come back on inboxes: every volfsm connection uses an inbox prefix
of its role (`_INBOX.node.<node>`, `_INBOX.client`, `_INBOX.aggregator`),
so a role may subscribe to its own replies only; a node cannot read the
replies (events included) meant for another node or for the aggregator.

The lists here are the ones `deploy/nats/roles/` ships (users and nsc), and
the tests run the service, the relay and the aggregator with nothing more.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from events.subjects import PREFIX, check_token, command_wildcard, node_events_filter
from volfsm.analytics.defaults import DEFAULT_DURABLE

DEFAULT_STREAM = "VOLFSM"
"""The JetStream stream of every node's events."""
JS_API = "$JS.API"
NODE_INBOX_ROOT = "_INBOX.node"
CLIENT_INBOX_PREFIX = "_INBOX.client"
AGGREGATOR_INBOX_PREFIX = "_INBOX.aggregator"
ALL_INBOXES = "_INBOX.>"
HISTORY_CONSUMER_PREFIX = "volfsm_history_"
EVENTS_CONSUMER_PREFIX = "volfsm_events_"
EVENTS_CONSUMER_SLOTS = 8
"""How many `volfsm events` may read one stream at once: each holds one consumer name."""


def node_inbox_prefix(node: str) -> str:
    """The inbox prefix of every connection of `node`'s service: `_INBOX.node.<node>`."""
    return f"{NODE_INBOX_ROOT}.{check_token(node, 'node')}"


def history_consumer(node: str) -> str:
    """The one consumer name `node` may create: it reads its history back through it."""
    return HISTORY_CONSUMER_PREFIX + check_token(node, "node")


@dataclass(frozen=True)
class Permissions:
    """What one NATS user may publish and subscribe to."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False
    """May publish one reply to the reply subject of each request it receives."""


def node_permissions(node: str, stream: str = DEFAULT_STREAM) -> Permissions:
    """The `node` role: its own events and commands, and JetStream calls scoped to them."""
    own = node_events_filter(node)
    consumer = history_consumer(node)
    return Permissions(
        publish=(
            own,
            f"{JS_API}.STREAM.INFO.{stream}",
            f"{JS_API}.DIRECT.GET.{stream}.{own}",
            f"{JS_API}.CONSUMER.CREATE.{stream}.{consumer}.{own}",
            f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
            f"{JS_API}.CONSUMER.DELETE.{stream}.{consumer}",
        ),
        subscribe=(command_wildcard(node), f"{node_inbox_prefix(node)}.>"),
        allow_responses=True,
    )


def events_consumers() -> tuple[str, ...]:
    """The consumer names `volfsm events` (the `client` role) may create: `volfsm_events_<k>`."""
    return tuple(f"{EVENTS_CONSUMER_PREFIX}{k}" for k in range(EVENTS_CONSUMER_SLOTS))


def client_permissions(nodes: Sequence[str] = (), stream: str = DEFAULT_STREAM) -> Permissions:
    """The `client` role: commands to `nodes` (every node if none are named), and their events.

    Events: per consumer name of `events_consumers()`, the filtered create
    request on those nodes' events (the server refuses a body whose filter
    differs from the subject's), pulls from it, and its delete (on exit).
    """
    targets = [command_wildcard(n) for n in nodes] or [f"{PREFIX}.*.cmd.>"]
    filters = [node_events_filter(n) for n in nodes] or [f"{PREFIX}.*.events.>"]
    reads: list[str] = []
    for name in events_consumers():
        reads += [f"{JS_API}.CONSUMER.CREATE.{stream}.{name}.{f}" for f in filters]
        reads.append(f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{name}")
        reads.append(f"{JS_API}.CONSUMER.DELETE.{stream}.{name}")
    return Permissions(publish=(*targets, *reads), subscribe=(f"{CLIENT_INBOX_PREFIX}.>",))


def aggregator_permissions(
    stream: str = DEFAULT_STREAM, durable: str = DEFAULT_DURABLE
) -> Permissions:
    """The `aggregator` role: find the stream, run its own durable consumer, ack; nothing else.

    It may delete and re-create its own consumer (that is its position in
    the stream, not data); it may not purge, delete messages or streams, or
    touch another consumer.
    """
    check_token(durable, "durable consumer name")
    return Permissions(
        publish=(
            f"{JS_API}.STREAM.NAMES",
            f"{JS_API}.CONSUMER.INFO.{stream}.{durable}",
            f"{JS_API}.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
            f"{JS_API}.CONSUMER.DELETE.{stream}.{durable}",
            f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{durable}",
            f"$JS.ACK.{stream}.{durable}.>",
        ),
        subscribe=(f"{AGGREGATOR_INBOX_PREFIX}.>",),
    )


def admin_permissions() -> Permissions:
    """The `admin` role: the whole JetStream API (create, size, purge, delete the stream)."""
    return Permissions(publish=(f"{JS_API}.>",), subscribe=(ALL_INBOXES,))


USER_PREFIX = "volfsm-"


def node_user(node: str) -> str:
    """The NATS user of `node` in the shipped configs: `volfsm-node-<node>`."""
    return f"{USER_PREFIX}node-{check_token(node, 'node')}"


def password_variable(user: str) -> str:
    """The variable holding `user`'s password: `volfsm-node-n1` -> `VOLFSM_NODE_N1_PASSWORD`."""
    name = re.sub(r"[^A-Za-z0-9]", "_", user.removeprefix(USER_PREFIX)).upper()
    return f"VOLFSM_{name}_PASSWORD"


def _allow(direction: str, subjects: Sequence[str]) -> list[str]:
    quoted = ",\n".join(f'        "{s}"' for s in subjects)
    return [f"      {direction}: {{allow: [", quoted, "      ]}"]


def user_entry(user: str, perms: Permissions) -> str:
    """One `authorization.users` entry; the password is the variable `password_variable(user)`."""
    lines = [
        f'    {{user: "{user}", password: ${password_variable(user)}, permissions: {{',
        *_allow("publish", perms.publish),
        *_allow("subscribe", perms.subscribe),
    ]
    if perms.allow_responses:
        lines.append("      allow_responses: true")
    lines.append("    }}")
    return "\n".join(lines)


def role_users(
    nodes: Sequence[str], stream: str = DEFAULT_STREAM, durable: str = DEFAULT_DURABLE
) -> dict[str, Permissions]:
    """User -> permissions: `volfsm-admin`, `volfsm-aggregator`, `volfsm-client`, one per node."""
    users = {
        f"{USER_PREFIX}admin": admin_permissions(),
        f"{USER_PREFIX}aggregator": aggregator_permissions(stream, durable),
        f"{USER_PREFIX}client": client_permissions(stream=stream),
    }
    for node in nodes:
        users[node_user(node)] = node_permissions(node, stream)
    return users


def authorization_block(
    nodes: Sequence[str], stream: str = DEFAULT_STREAM, durable: str = DEFAULT_DURABLE
) -> str:
    """An `authorization { users = [...] }` block with every role (one user per node)."""
    entries = "\n".join(
        user_entry(user, perms) for user, perms in role_users(nodes, stream, durable).items()
    )
    return "authorization {\n  users = [\n" + entries + "\n  ]\n}\n"

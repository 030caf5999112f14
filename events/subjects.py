"""NATS subject names and message ids: the bus's public vocabulary (no NATS import).

* `volfsm.<node>.events.<EventType>`: every logged event, e.g.
  `volfsm.n1.events.DeviceMounted`.
* `volfsm.<node>.cmd.<verb>`: request/reply commands to one node.
* `Nats-Msg-Id` of an event: `<node>:<seq>/<key>`, the key secret to the node's log.
"""

from __future__ import annotations

import hashlib
import re

PREFIX = "volfsm"
EVENTS_WILDCARD = "volfsm.*.events.>"
"""Every node's events: the subjects the JetStream event stream captures."""

_BAD_TOKEN = re.compile(r"[.*>\s]")
_MSG_KEY = re.compile(r"[0-9a-f]{16}")


class SubjectError(ValueError):
    """A name that cannot be used as one NATS subject token."""


def check_token(value: str, what: str = "name") -> str:
    """Return `value` if it is a single NATS subject token, else raise `SubjectError`."""
    if not value:
        raise SubjectError(f"{what} must not be empty")
    if _BAD_TOKEN.search(value):
        raise SubjectError(
            f"{what} {value!r} is not a valid NATS subject token "
            "(no '.', '*', '>' or whitespace allowed)"
        )
    return value


def events_subject(node: str, event_type: str) -> str:
    """Subject of one event of type `event_type` (the type name) from `node`."""
    return f"{PREFIX}.{check_token(node, 'node')}.events.{check_token(event_type, 'event type')}"


def node_events_filter(node: str) -> str:
    """Every event subject of one node: `volfsm.<node>.events.>`."""
    return f"{PREFIX}.{check_token(node, 'node')}.events.>"


def event_subject_node(subject: str) -> str | None:
    """The node an event subject `volfsm.<node>.events.<Type>` belongs to (None: not one)."""
    tokens = subject.split(".")
    if len(tokens) < 4 or tokens[0] != PREFIX or tokens[2] != "events" or not tokens[1]:
        return None
    return tokens[1]


def command_subject(node: str, verb: str) -> str:
    """Request subject of command `verb` on `node`."""
    return f"{PREFIX}.{check_token(node, 'node')}.cmd.{check_token(verb, 'command verb')}"


def command_wildcard(node: str) -> str:
    """Every command subject of one node: `volfsm.<node>.cmd.>`."""
    return f"{PREFIX}.{check_token(node, 'node')}.cmd.>"


def msg_key(log_id: str) -> str:
    """The secret part of a log's msg ids: 16 hex digits derived from the log's random id.

    JetStream dedupes by `Nats-Msg-Id` alone, across subjects: with ids that
    are only `<node>:<seq>`, any publisher could send another node's next id
    first and have the real event dropped as a duplicate. Other nodes never
    see this log's id, so they cannot make its key.
    """
    if not log_id:
        return ""
    return hashlib.sha256(f"volfsm msg id\0{log_id}".encode()).hexdigest()[:16]


def msg_id(node: str, seq: int, key: str = "") -> str:
    """The `Nats-Msg-Id` of the event with log `seq` from `node`: `<node>:<seq>/<key>`.

    The same log always gives the same id for a seq (a republish is a
    duplicate); `key` is `msg_key(log_id)`. Without a key, the form volfsm
    used before keys, `<node>:<seq>`, which `parse_msg_id` still reads.
    """
    return f"{node}:{seq}/{key}" if key else f"{node}:{seq}"


def parse_msg_id(value: str) -> tuple[str, int]:
    """Split a `Nats-Msg-Id` made by `msg_id` into (node, seq); ValueError if it is not one."""
    head, slash, key = value.rpartition("/")
    if slash and _MSG_KEY.fullmatch(key):
        value = head
    node, sep, seq = value.rpartition(":")
    if not sep or not node or not seq.isdigit():
        raise ValueError(f"not a volfsm message id: {value!r}")
    return node, int(seq)


def subject_covers(outer: str, inner: str) -> bool:
    """True if every subject matched by pattern `inner` is matched by pattern `outer`."""
    outer_tokens = outer.split(".")
    inner_tokens = inner.split(".")
    for i, tok in enumerate(outer_tokens):
        if tok == ">":
            return len(inner_tokens) > i
        if i >= len(inner_tokens):
            return False
        other = inner_tokens[i]
        if other == ">":
            return False
        if tok == "*":
            continue
        if tok != other:
            return False
    return len(outer_tokens) == len(inner_tokens)

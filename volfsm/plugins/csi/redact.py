"""Render CSI messages for logs and events with every `csi_secret` field removed."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from volfsm.csi.v1 import csi_pb2

REDACTED = "***stripped***"


def _is_secret(field: Any) -> bool:
    return bool(field.GetOptions().Extensions[csi_pb2.csi_secret])


def redacted(msg: Message) -> dict[str, Any]:
    """A plain dict of `msg` in which every field marked `csi_secret` is replaced.

    Works on any message of the stubs, recursing into nested messages, so a
    secret can never reach a log line or an event through this path.
    """
    out: dict[str, Any] = {}
    for field, value in msg.ListFields():
        if _is_secret(field):
            out[field.name] = REDACTED
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            out[field.name] = dict(value)
        elif field.message_type is not None:
            if field.is_repeated:
                out[field.name] = [redacted(v) for v in value]
            else:
                out[field.name] = redacted(value)
        elif field.is_repeated:
            out[field.name] = list(value)
        else:
            out[field.name] = value
    return out

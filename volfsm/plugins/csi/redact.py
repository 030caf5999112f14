"""Render CSI messages for logs and events with every `csi_secret` field removed."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from volfsm.csi.v1 import csi_pb2

REDACTED = "***stripped***"


def _is_secret(field: Any) -> bool:
    return bool(field.GetOptions().Extensions[csi_pb2.csi_secret])


def _scalar(field: Any, value: Any) -> Any:
    """Enum values by name (SINGLE_NODE_WRITER, not 1); other scalars as they are."""
    if field.enum_type is not None:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    return value


def redacted(msg: Message) -> dict[str, Any]:
    """A plain dict of `msg` in which every field marked `csi_secret` is replaced.

    Works on any message of the stubs, recursing into nested messages, so a
    secret can never reach a log line or an event through this path. A
    secret field that is set shows as `REDACTED`, whatever its type.
    """
    out: dict[str, Any] = {}
    for field, value in msg.ListFields():
        if _is_secret(field):
            out[field.name] = REDACTED
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            if value_field.message_type is not None:
                out[field.name] = {k: redacted(v) for k, v in value.items()}
            else:
                out[field.name] = dict(value)
        elif field.message_type is not None:
            if field.is_repeated:
                out[field.name] = [redacted(v) for v in value]
            else:
                out[field.name] = redacted(value)
        elif field.is_repeated:
            out[field.name] = [_scalar(field, v) for v in value]
        else:
            out[field.name] = _scalar(field, value)
    return out

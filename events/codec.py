"""Encoding and decoding of event bodies and envelopes.

Bodies are stored as msgpack in the log and sent as JSON on NATS. Decoding
takes the (type, schema) recorded beside the body: the current schema goes
through one tagged-union decoder; older schemas through `events.upcast`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from events.errors import UnknownEventError
from events.types import EVENT_TYPES, Body, Envelope, Event
from events.upcast import LEGACY

_mp_encoder = msgspec.msgpack.Encoder()
_mp_union = msgspec.msgpack.Decoder(Event)
_json_encoder = msgspec.json.Encoder()
_json_envelope = msgspec.json.Decoder(Envelope)


class _RawEnvelope(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    stream: str
    version: int
    type: str
    schema: int
    ts: int
    node: str
    body: msgspec.Raw


_json_raw_envelope = msgspec.json.Decoder(_RawEnvelope)
_legacy_mp: dict[tuple[str, int], msgspec.msgpack.Decoder[Any]] = {
    key: msgspec.msgpack.Decoder(up.old_type) for key, up in LEGACY.items()
}
_legacy_json: dict[tuple[str, int], msgspec.json.Decoder[Any]] = {
    key: msgspec.json.Decoder(up.old_type) for key, up in LEGACY.items()
}


CURRENT_SCHEMAS: dict[str, int] = {name: cls.SCHEMA for name, cls in EVENT_TYPES.items()}
"""Type name -> the schema this build writes (and decodes without an upcaster)."""

TYPE_INFO: dict[type, tuple[str, int]] = {
    cls: (name, cls.SCHEMA) for name, cls in EVENT_TYPES.items()
}
"""Event body class -> (type name, schema) it is logged with."""

decode_current_body: Callable[[bytes], Event] = _mp_union.decode
"""Decode a msgpack body already known to be of a current (type, schema)."""


def encode_body(body: Body) -> bytes:
    """msgpack bytes of a body, as stored in the log."""
    return _mp_encoder.encode(body)


def body_type_info(body: Body) -> tuple[str, int]:
    """(type name, schema) a body is logged with; TypeError for a non-event."""
    info = TYPE_INFO.get(type(body))
    if info is None:
        raise TypeError(
            f"{type(body).__name__} is not an event type of events.types.Event; cannot log it"
        )
    return info


def _check_current(type_name: str, schema: int) -> None:
    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        raise UnknownEventError(f"unknown event type {type_name!r}")
    if schema != cls.SCHEMA:
        raise UnknownEventError(
            f"{type_name} schema {schema} is not readable by this build "
            f"(current schema {cls.SCHEMA}, no upcaster)"
        )


def decode_body(type_name: str, schema: int, data: bytes) -> Event:
    """Decode a stored msgpack body, upcasting older schemas to the current type."""
    if CURRENT_SCHEMAS.get(type_name) == schema:
        return _mp_union.decode(data)
    key = (type_name, schema)
    dec = _legacy_mp.get(key)
    if dec is None:
        _check_current(type_name, schema)
    assert dec is not None
    return LEGACY[key].lift(dec.decode(data))  # type: ignore[return-value]


def envelope_to_json(env: Envelope) -> bytes:
    """The public JSON form of an envelope (NATS body, ndjson export)."""
    return _json_encoder.encode(env)


def envelope_from_json(data: bytes | str) -> Envelope:
    """Decode a JSON envelope, upcasting an older body schema."""
    raw = _json_raw_envelope.decode(data)
    cls = EVENT_TYPES.get(raw.type)
    if cls is not None and raw.schema == cls.SCHEMA:
        return _json_envelope.decode(data)
    key = (raw.type, raw.schema)
    dec = _legacy_json.get(key)
    if dec is None:
        _check_current(raw.type, raw.schema)
    assert dec is not None
    old = dec.decode(raw.body)
    body = LEGACY[key].lift(old)
    return Envelope(
        seq=raw.seq,
        stream=raw.stream,
        version=raw.version,
        type=raw.type,
        schema=type(body).SCHEMA,
        ts=raw.ts,
        node=raw.node,
        body=body,  # type: ignore[arg-type]
    )

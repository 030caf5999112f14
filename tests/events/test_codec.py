"""Codec round trips for every event type, with hypothesis-generated bodies.

Strategies are derived from each Struct's own field types (msgspec.inspect),
so a field added to an event type is covered without touching this file.
"""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.codec import (
    body_type_info,
    decode_body,
    encode_body,
    envelope_from_json,
    envelope_to_json,
)
from events.errors import UnknownEventError
from events.types import EVENT_TYPES, Body, Envelope, OperationFailed

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=20)


def strategy_for(t: mi.Type) -> st.SearchStrategy[Any]:
    """A hypothesis strategy for one msgspec type description."""
    if isinstance(t, mi.StrType):
        return TEXT
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.IntType):
        return INT64
    if isinstance(t, mi.FloatType):
        return FLOATS
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.UnionType):
        return st.one_of(*(strategy_for(u) for u in t.types))
    if isinstance(t, mi.VarTupleType):
        return st.lists(strategy_for(t.item_type), max_size=3).map(tuple)
    if isinstance(t, mi.DictType):
        return st.dictionaries(strategy_for(t.key_type), strategy_for(t.value_type), max_size=3)
    if isinstance(t, mi.StructType):
        return struct_strategy(t)
    raise NotImplementedError(f"no strategy for {t!r}: extend tests/events/test_codec.py")


def struct_strategy(info: mi.StructType) -> st.SearchStrategy[Any]:
    fields = {f.name: strategy_for(f.type) for f in info.fields}
    return st.fixed_dictionaries(fields).map(lambda kw: info.cls(**kw))


def body_strategy(cls: type[Body]) -> st.SearchStrategy[Body]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return struct_strategy(info)


ANY_BODY = st.one_of(*(body_strategy(cls) for cls in EVENT_TYPES.values()))


def envelopes(body: st.SearchStrategy[Body]) -> st.SearchStrategy[Envelope]:
    return st.builds(
        lambda b, seq, version, ts, stream, node: Envelope(
            seq=seq,
            stream=stream,
            version=version,
            type=type(b).__name__,
            schema=type(b).SCHEMA,
            ts=ts,
            node=node,
            body=b,
        ),
        body,
        st.integers(min_value=1, max_value=2**62),
        st.integers(min_value=1, max_value=2**31),
        st.integers(min_value=0, max_value=2**62),
        TEXT,
        TEXT,
    )


@pytest.mark.parametrize("cls", list(EVENT_TYPES.values()), ids=list(EVENT_TYPES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_body_msgpack_round_trip(cls: type[Body], data: st.DataObject) -> None:
    body = data.draw(body_strategy(cls))
    type_name, schema = body_type_info(body)
    assert (type_name, schema) == (cls.__name__, cls.SCHEMA)
    decoded = decode_body(type_name, schema, encode_body(body))
    assert type(decoded) is cls
    assert decoded == body


@pytest.mark.parametrize("cls", list(EVENT_TYPES.values()), ids=list(EVENT_TYPES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_envelope_json_round_trip(cls: type[Body], data: st.DataObject) -> None:
    env = data.draw(envelopes(body_strategy(cls)))
    text = envelope_to_json(env)
    back = envelope_from_json(text)
    assert back == env
    assert envelope_from_json(text.decode()) == env  # str input too
    assert msgspec.json.decode(text)["body"]["type"] == cls.__name__


@settings(max_examples=200, deadline=None)
@given(env=envelopes(ANY_BODY))
def test_any_envelope_round_trips_both_ways(env: Envelope) -> None:
    assert envelope_from_json(envelope_to_json(env)) == env
    assert decode_body(env.type, env.schema, encode_body(env.body)) == env.body


def test_unknown_type_or_schema_is_a_typed_error() -> None:
    data = encode_body(OperationFailed(op_id="o", operation="x", code="c", message="m", final=True))
    with pytest.raises(UnknownEventError, match="unknown event type 'Bogus'"):
        decode_body("Bogus", 1, data)
    with pytest.raises(UnknownEventError, match="schema 7 is not readable"):
        decode_body("OperationFailed", 7, data)
    text = (
        b'{"seq":1,"stream":"s","version":1,"type":"OperationFailed","schema":3,'
        b'"ts":0,"node":"","body":{}}'
    )
    with pytest.raises(UnknownEventError, match="current schema 2, no upcaster"):
        envelope_from_json(text)

"""Older schema versions of event bodies and the upcasters that lift them.

An upcaster turns a body decoded with an old schema into the current type,
so every reader (projections, replay, analytics) only ever sees current
types. Register one per (type name, old schema) in `LEGACY`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from events.types import Body, OperationFailed


class OperationFailedV1(msgspec.Struct, frozen=True, kw_only=True):
    """OperationFailed as written by schema 1.

    v1 packed the gRPC code and message into one `error` string ("CODE: msg"),
    said `retriable` where v2 says the opposite (`final`), and gave the
    backoff in milliseconds.
    """

    op_id: str
    operation: str
    error: str
    retriable: bool
    retry_after_ms: int = 0


def _operation_failed_v1_to_v2(old: OperationFailedV1) -> OperationFailed:
    code, sep, message = old.error.partition(": ")
    if not sep or not code or " " in code:
        code, message = "Unknown", old.error
    return OperationFailed(
        op_id=old.op_id,
        operation=old.operation,
        code=code,
        message=message,
        final=not old.retriable,
        backoff_s=old.retry_after_ms / 1000.0,
    )


@dataclass(frozen=True)
class Upcaster:
    """Decodes one (type, schema) shape and lifts it to the current body."""

    old_type: type[msgspec.Struct]
    lift: Callable[[msgspec.Struct], Body]


def _lift_operation_failed(old: msgspec.Struct) -> Body:
    assert isinstance(old, OperationFailedV1)
    return _operation_failed_v1_to_v2(old)


LEGACY: dict[tuple[str, int], Upcaster] = {
    ("OperationFailed", 1): Upcaster(OperationFailedV1, _lift_operation_failed),
}

"""How CSI call failures map to volfsm's error classes (kubelet's isFinalError)."""

from __future__ import annotations

from typing import Any

import grpc

from volfsm.plugins.base import ErrorClass, PluginError

#: gRPC codes after which the call may still be running on the driver (kubelet: non-final).
NON_FINAL_CODES = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)

NON_GRPC_CODE = "unknown-non-grpc"
MAX_MESSAGE_CHARS = 1000


#: Where Go's codes.Code.String() differs from CamelCasing Python's enum name.
_GO_SPELLING = {"CANCELLED": "Canceled", "OK": "OK"}


def code_name(code: Any) -> str:
    """The gRPC code name as the kubelet (Go) spells it: DeadlineExceeded, Canceled, ..."""
    name = str(getattr(code, "name", code))
    if name in _GO_SPELLING:
        return _GO_SPELLING[name]
    return "".join(part.capitalize() for part in name.split("_"))


def classify(exc: BaseException, rpc: str) -> PluginError:
    """Turn any failure of one CSI call into a PluginError with the kubelet's classification.

    Non-final gRPC codes and every non-gRPC error are UNCERTAIN (the call may
    still be in progress); every other gRPC code is FINAL.
    """
    if isinstance(exc, PluginError):
        return exc
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        code = exc.code()
        details = str(exc.details() or "") if hasattr(exc, "details") else ""
        klass = ErrorClass.UNCERTAIN if code in NON_FINAL_CODES else ErrorClass.FINAL
        return PluginError(code_name(code), f"{rpc}: {_cut(details) or code_name(code)}", klass)
    text = _cut(f"{type(exc).__name__}: {exc}")
    return PluginError(NON_GRPC_CODE, f"{rpc}: {text}", ErrorClass.UNCERTAIN)


def _cut(text: str) -> str:
    """At most MAX_MESSAGE_CHARS of a driver's message (a hostile driver may send megabytes)."""
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return f"{text[:MAX_MESSAGE_CHARS]}... ({len(text)} chars)"

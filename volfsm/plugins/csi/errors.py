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


def code_name(code: Any) -> str:
    """CamelCase gRPC code name as kubelet's metrics spell it (e.g. DeadlineExceeded)."""
    name = str(getattr(code, "name", code))
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
        details = exc.details() if hasattr(exc, "details") else ""
        klass = ErrorClass.UNCERTAIN if code in NON_FINAL_CODES else ErrorClass.FINAL
        return PluginError(code_name(code), f"{rpc}: {details or code_name(code)}", klass)
    return PluginError(NON_GRPC_CODE, f"{rpc}: {type(exc).__name__}: {exc}", ErrorClass.UNCERTAIN)

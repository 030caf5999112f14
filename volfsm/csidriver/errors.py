"""The one exception type the driver's services raise: a gRPC code and message."""

from __future__ import annotations

import grpc


class CsiError(Exception):
    """A failure to report to the caller as a gRPC status (code + readable message)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


def invalid_argument(message: str) -> CsiError:
    """A required field is missing, or a field is invalid or unsupported."""
    return CsiError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> CsiError:
    """The volume (or the volume at the given path) does not exist."""
    return CsiError(grpc.StatusCode.NOT_FOUND, message)


def already_exists(message: str) -> CsiError:
    """The thing exists already, with incompatible arguments."""
    return CsiError(grpc.StatusCode.ALREADY_EXISTS, message)


def failed_precondition(message: str) -> CsiError:
    """The system is not in the state the call needs."""
    return CsiError(grpc.StatusCode.FAILED_PRECONDITION, message)


def out_of_range(message: str) -> CsiError:
    """The requested capacity is not allowed."""
    return CsiError(grpc.StatusCode.OUT_OF_RANGE, message)


def internal(message: str) -> CsiError:
    """Something on the node failed (a command, the state files)."""
    return CsiError(grpc.StatusCode.INTERNAL, message)

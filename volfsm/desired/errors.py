"""Errors raised while reading and validating desired-state objects."""

from __future__ import annotations

from volfsm.errors import InvalidObjectError, VolfsmError

__all__ = ["InvalidObjectError", "LoadError"]


class LoadError(VolfsmError):
    """A file, directory or stdin could not be read or parsed into objects."""

    def __init__(self, origin: str, message: str, document: int | None = None) -> None:
        self.origin = origin
        self.document = document
        self.message = message
        where = origin if document is None else f"{origin}: document {document}"
        super().__init__(f"{where}: {message}")

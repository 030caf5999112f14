"""Errors of NATS setup that retrying as-is will not fix."""

from __future__ import annotations


class NatsSetupError(RuntimeError):
    """Connecting or preparing JetStream failed in a way that needs an operator."""


class NatsAuthError(NatsSetupError):
    """The server refused the connection: credentials, permissions to connect, or TLS."""


class StreamConfigError(NatsSetupError):
    """A JetStream stream cannot be created, or exists with settings that cannot be used."""


class NatsDeniedError(NatsSetupError):
    """The server denied one of our requests (a permissions violation); `text` is its error."""

    def __init__(self, text: str) -> None:
        super().__init__(f"NATS denied a request: {text}")
        self.text = text

"""Talking to a running `volfsm serve` over NATS request/reply (what the CLI uses).

Where the service is comes from `volfsm.service.target` (`find_target`).
`ServiceClient.request` sends one command and returns the reply's fields,
raising `CommandFailedError` for an `{"ok": false}` reply and
`ServiceUnreachableError` (with what to check) when nobody answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import msgspec
import nats
import nats.errors
from nats.aio.client import Client as NATS

from events.subjects import command_subject
from volfsm.bus.connect import connect_once
from volfsm.bus.errors import NatsAuthError
from volfsm.bus.roles import CLIENT_INBOX_PREFIX
from volfsm.service.target import (
    AUTH_HINT,
    DEFAULT_TIMEOUT_S,
    NATS_ENV,
    NODE_ENV,
    RUNNING_HINT,
    CommandFailedError,
    ServiceUnreachableError,
    Target,
    auth_options,
    find_target,
    no_answer,
    no_responders,
    reply_fields,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "NATS_ENV",
    "NODE_ENV",
    "CommandFailedError",
    "ServiceClient",
    "ServiceUnreachableError",
    "Target",
    "auth_options",
    "find_target",
]


class ServiceClient:
    """One NATS connection to send commands to one node. Use as `async with`."""

    def __init__(self, target: Target, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.target = target
        self.timeout = timeout
        self._nc: NATS | None = None

    async def connect(self) -> None:
        """Connect once (no reconnects), trying each server of the URL list in turn.

        ServiceUnreachableError if no server can be reached or the one reached refuses us.
        """
        if self._nc is not None:
            return
        url = self.target.url

        async def ignore(*_: object) -> None:
            return None

        try:
            self._nc = await connect_once(
                url,
                connect_timeout_s=min(self.timeout, 5.0),
                error_cb=ignore,
                disconnected_cb=ignore,
                closed_cb=ignore,
                name="volfsm-cli",
                **{"inbox_prefix": CLIENT_INBOX_PREFIX, **self.target.options},
            )
        except NatsAuthError as exc:
            raise ServiceUnreachableError(f"{exc} ({AUTH_HINT})") from None
        except (ConnectionError, nats.errors.Error, OSError) as exc:
            raise ServiceUnreachableError(f"{exc or type(exc).__name__}: {RUNNING_HINT}") from None

    @property
    def max_payload(self) -> int:
        """The largest message the connected server takes (its max_payload); 0 before connect."""
        return int(self._nc.max_payload) if self._nc is not None else 0

    async def close(self) -> None:
        """Close the connection."""
        nc, self._nc = self._nc, None
        if nc is not None:
            try:
                await nc.close()
            except Exception:  # closing a broken connection: nothing to do
                return

    async def __aenter__(self) -> ServiceClient:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def request_raw(self, verb: str, payload: bytes) -> bytes:
        """Send `payload` to `volfsm.<node>.cmd.<verb>`; the reply's bytes."""
        if self._nc is None:
            await self.connect()
        assert self._nc is not None
        node = self.target.node
        subject = command_subject(node, verb)
        try:
            msg = await self._nc.request(subject, payload, timeout=self.timeout)
        except nats.errors.NoRespondersError:
            raise ServiceUnreachableError(no_responders(self.target)) from None
        except nats.errors.TimeoutError:
            raise ServiceUnreachableError(no_answer(self.target, verb, self.timeout)) from None
        except nats.errors.MaxPayloadError as exc:
            raise CommandFailedError(
                "PayloadTooLarge", f"NATS refused the request: {exc}"
            ) from None
        return bytes(msg.data)

    async def apply(
        self, objects: Sequence[Mapping[str, Any]], *, complete: bool = False
    ) -> dict[str, Any]:
        """`apply` the objects; with `complete` they are the node's whole desired state
        (pods not named are deleted, then unmounts may start)."""
        body: dict[str, Any] = {"objects": list(objects)}
        if complete:
            body["complete"] = True
        return await self.request("apply", body)

    async def request(self, verb: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Send one command; the reply's fields (CommandFailedError if it is not ok)."""
        return reply_fields(await self.request_raw(verb, msgspec.json.encode(body)))

"""`ServiceClient`'s interface over `volfsm.bus.lite`: the CLI's fast path (no nats-py).

Used when the connection needs nothing the plain socket client lacks
(`lite.supported`); every request is one short connection. Errors are the
ones `ServiceClient` raises, with the same words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import msgspec

from events.subjects import command_subject
from volfsm.bus import lite
from volfsm.bus.roles import CLIENT_INBOX_PREFIX
from volfsm.service.target import (
    AUTH_HINT,
    DEFAULT_TIMEOUT_S,
    RUNNING_HINT,
    CommandFailedError,
    ServiceUnreachableError,
    Target,
    no_answer,
    no_responders,
    reply_fields,
)


class NeedsFullClient(Exception):
    """The server wants what the plain client does not do (TLS, nkeys); nothing was sent."""


def usable(target: Target) -> bool:
    """Whether the plain client can talk to this target."""
    return lite.supported(target.url, target.options)


class LiteServiceClient:
    """One node's commands over short plain NATS connections. Use as `async with`."""

    def __init__(self, target: Target, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.target = target
        self.timeout = timeout
        self._max_payload = 0

    async def __aenter__(self) -> LiteServiceClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    async def connect(self) -> None:
        """Learn the server's max_payload (its INFO line)."""
        if self._max_payload:
            return
        try:
            info = lite.server_info(self.target.url, timeout=self.timeout)
        except (lite.LiteError, OSError) as exc:
            raise ServiceUnreachableError(f"{exc}: {RUNNING_HINT}") from None
        if info.get("tls_required") or info.get("nonce"):
            raise NeedsFullClient(self.target.url)
        self._max_payload = int(info.get("max_payload") or 0)

    @property
    def max_payload(self) -> int:
        """The largest message the server takes (0 before the first request)."""
        return self._max_payload

    async def request_raw(self, verb: str, payload: bytes) -> bytes:
        """Send `payload` to `volfsm.<node>.cmd.<verb>`; the reply's bytes."""
        target = self.target
        if self._max_payload and len(payload) > self._max_payload:
            raise CommandFailedError(
                "PayloadTooLarge", f"NATS refused the request: maximum payload {self._max_payload}"
            )
        options = {"inbox_prefix": CLIENT_INBOX_PREFIX, **target.options}
        try:
            raw, self._max_payload = lite.request(
                target.url,
                command_subject(target.node, verb),
                payload,
                timeout=self.timeout,
                options=options,
            )
        except lite.Unsupported:
            raise NeedsFullClient(target.url) from None
        except lite.NoResponders:
            raise ServiceUnreachableError(no_responders(target)) from None
        except lite.RequestTimeout:
            raise ServiceUnreachableError(no_answer(target, verb, self.timeout)) from None
        except lite.Refused as exc:
            raise ServiceUnreachableError(
                f"NATS at {target.url} refused the connection: {exc} ({AUTH_HINT})"
            ) from None
        except lite.Unreachable as exc:
            raise ServiceUnreachableError(f"{exc}: {RUNNING_HINT}") from None
        except (lite.LiteError, OSError) as exc:
            raise ServiceUnreachableError(f"NATS at {target.url}: {exc}: {RUNNING_HINT}") from None
        return raw

    async def request(self, verb: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Send one command; the reply's fields (CommandFailedError if it is not ok)."""
        return reply_fields(await self.request_raw(verb, msgspec.json.encode(body)))

    async def apply(
        self, objects: Sequence[Mapping[str, Any]], *, complete: bool = False
    ) -> dict[str, Any]:
        """`apply` the objects (see `ServiceClient.apply`)."""
        body: dict[str, Any] = {"objects": list(objects)}
        if complete:
            body["complete"] = True
        return await self.request("apply", body)

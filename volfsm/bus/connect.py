"""One NATS connection attempt, without nats-py's automatic reconnect.

Callers that must know exactly what reached the server (the relay) own
their reconnect loop: nats-py's reconnect replays buffered publishes after
the new connection is up, out of order with anything lost in the old socket.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats
import nats.errors
from nats.aio.client import Client as NATS

from volfsm.bus.errors import NatsAuthError, NatsDeniedError
from volfsm.bus.urls import URL_SCHEMES, split_servers

__all__ = ["URL_SCHEMES", "connect_once", "split_servers"]

T = TypeVar("T")

OWNED_OPTIONS = frozenset(
    {
        "servers",
        "allow_reconnect",
        "max_reconnect_attempts",
        "reconnect_time_wait",
        "connect_timeout",
        "error_cb",
        "disconnected_cb",
        "closed_cb",
        "reconnected_cb",
    }
)
"""`nats.connect` options `connect_once` sets itself."""


def is_refusal(exc: BaseException) -> bool:
    """True for errors that mean "you may not connect like this" rather than "try later"."""
    if isinstance(
        exc,
        nats.errors.AuthorizationError
        | nats.errors.SecureConnRequiredError
        | nats.errors.SecureConnWantedError
        | ssl.SSLError,
    ):
        return True
    text = str(exc).lower()
    return "authorization violation" in text or "authentication" in text


async def connect_once(
    url: str,
    *,
    connect_timeout_s: float,
    error_cb: Callable[[Exception], Awaitable[None]],
    disconnected_cb: Callable[[], Awaitable[None]],
    closed_cb: Callable[[], Awaitable[None]],
    **options: Any,
) -> NATS:
    """Connect to `url` once (nats-py makes two quick tries); the connection never reconnects.

    `options` go to `nats.connect` unchanged (user/password, token,
    user_credentials, nkeys_seed, tls, tls_hostname, name, inbox_prefix...).
    Raises `NatsAuthError` when the server refuses us (credentials, TLS) and
    `ConnectionError` when it cannot be reached.
    """
    owned = OWNED_OPTIONS & options.keys()
    if owned:
        raise ValueError(f"connect_once sets {sorted(owned)} itself")
    servers = split_servers(url)
    last: ConnectionError | None = None
    for server in servers:  # nats-py stops at the first dead server when reconnect is off
        try:
            return await _connect_one(
                server,
                connect_timeout_s=connect_timeout_s,
                error_cb=error_cb,
                disconnected_cb=disconnected_cb,
                closed_cb=closed_cb,
                **options,
            )
        except ConnectionError as exc:
            last = exc
    assert last is not None
    if len(servers) > 1:
        raise ConnectionError(f"cannot reach any of {len(servers)} NATS servers: {last}") from last
    raise last


async def _connect_one(
    url: str,
    *,
    connect_timeout_s: float,
    error_cb: Callable[[Exception], Awaitable[None]],
    disconnected_cb: Callable[[], Awaitable[None]],
    closed_cb: Callable[[], Awaitable[None]],
    **options: Any,
) -> NATS:
    seen: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        seen.append(exc)
        await error_cb(exc)

    try:
        return await nats.connect(
            servers=[url],
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=0.05,
            connect_timeout=connect_timeout_s,
            error_cb=on_error,
            disconnected_cb=disconnected_cb,
            closed_cb=closed_cb,
            **options,
        )
    except nats.errors.NoServersError as exc:
        cause: BaseException = seen[-1] if seen else exc
        if is_refusal(cause):
            raise refused(url, cause) from exc
        raise ConnectionError(f"cannot reach NATS at {url}: {cause}") from exc
    except (nats.errors.Error, ssl.SSLError) as exc:
        if is_refusal(exc):
            raise refused(url, exc) from exc
        raise
    except OSError as exc:
        raise ConnectionError(f"cannot reach NATS at {url}: {exc}") from exc


def refused(url: str, exc: BaseException) -> NatsAuthError:
    """The error to raise when `url` refused us with `exc`."""
    return NatsAuthError(
        f"NATS at {url} refused the connection ({exc or type(exc).__name__}): check the "
        "user/password, token, creds file or TLS settings"
    )


class Denials:
    """Permission violations the server reports on one connection.

    A request the server denies gets no reply, only an asynchronous error
    (to the connection's `error_cb`): the request would wait for its
    timeout and look like an outage. Feed `note` from the `error_cb`, and
    run the requests under `guard`, which fails as soon as one is denied.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.text = ""

    def note(self, exc: BaseException) -> bool:
        """Record `exc` if it is a permissions violation; whether it was."""
        text = str(exc) or type(exc).__name__
        if "permissions violation" not in text.lower():
            return False
        self.text = text
        self._event.set()
        return True

    @property
    def denied(self) -> bool:
        """Whether a violation was noted since the last `clear`."""
        return self._event.is_set()

    def clear(self) -> None:
        """Forget what was noted (a new connection or a new step)."""
        self._event.clear()
        self.text = ""

    async def guard(self, work: Awaitable[T]) -> T:
        """Await `work`; `NatsDeniedError` as soon as a violation is noted (`work` cancelled)."""
        task = asyncio.ensure_future(work)
        waiter = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if not task.done():
                task.cancel()
            await asyncio.gather(task, waiter, return_exceptions=True)
        if self.denied and (task.cancelled() or task.exception() is not None):
            raise NatsDeniedError(self.text)
        return task.result()

"""One NATS connection attempt, without nats-py's automatic reconnect.

Callers that must know exactly what reached the server (the relay) own
their reconnect loop: nats-py's reconnect replays buffered publishes after
the new connection is up, out of order with anything lost in the old socket.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NATS

from volfsm.bus.errors import NatsAuthError

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


URL_SCHEMES = ("nats://", "tls://", "ws://", "wss://")
"""Schemes a NATS server URL may have."""


def split_servers(urls: str) -> list[str]:
    """The server URLs of a comma-separated list (`nats://a:4222,nats://b:4222`).

    Raises ValueError naming the first entry that is empty or has no NATS scheme.
    """
    servers = [u.strip() for u in urls.split(",")]
    for url in servers:
        if not url.startswith(URL_SCHEMES):
            raise ValueError(
                f"NATS URL {url!r} in {urls!r} must start with one of {', '.join(URL_SCHEMES)}"
            )
    return servers


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

"""Talking to a running `volfsm serve` over NATS request/reply (what the CLI uses).

`find_target` works out where the service is: the NATS URL from `--nats`,
`$VOLFSM_NATS` or `<data-dir>/nats.url` (written by the service), and the
node from `--node`, `$VOLFSM_NODE`, `<data-dir>/node` or the host name.
`ServiceClient.request` sends one command and returns the reply's fields,
raising `CommandFailedError` for an `{"ok": false}` reply and
`ServiceUnreachableError` (with what to check) when nobody answers.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import msgspec
import nats
import nats.errors
from nats.aio.client import Client as NATS

from events.subjects import SubjectError, check_token, command_subject
from volfsm.bus.connect import connect_once
from volfsm.bus.errors import NatsAuthError
from volfsm.bus.roles import CLIENT_INBOX_PREFIX
from volfsm.errors import VolfsmError
from volfsm.paths import data_dir as default_data_dir
from volfsm.service.config import (
    NATS_URL_FILENAME,
    Layered,
    ServeConfig,
    nats_options,
    saved_nats_url,
    saved_node,
)

NATS_ENV = "VOLFSM_NATS"
NODE_ENV = "VOLFSM_NODE"
DEFAULT_TIMEOUT_S = 10.0


class ServiceUnreachableError(VolfsmError):
    """No service could be found or reached; the message says what to check."""


class CommandFailedError(VolfsmError):
    """The service answered `{"ok": false, "error": {code, message}}`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Target:
    """Where a service is: NATS URL, node name, connect options."""

    url: str
    node: str
    options: dict[str, Any] = field(default_factory=dict)


def auth_options(
    *,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    creds: str | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> dict[str, Any]:
    """`nats.connect` options for these credentials (ConfigError when they do not fit)."""
    cfg = ServeConfig(
        nats_user=user or "",
        nats_password=password or "",
        nats_token=token or "",
        nats_creds=creds or "",
        nats_tls_ca=tls_ca or "",
        nats_tls_cert=tls_cert or "",
        nats_tls_key=tls_key or "",
    )
    return nats_options(Layered(cfg, {}))


def find_target(
    *,
    nats_url: str | None = None,
    node: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    options: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Target:
    """The service to talk to; ServiceUnreachableError if no URL can be found."""
    env = os.environ if environ is None else environ
    directory = Path(data_dir) if data_dir is not None else default_data_dir()
    url = nats_url or env.get(NATS_ENV) or saved_nats_url(directory)
    if not url:
        raise ServiceUnreachableError(
            f"no NATS URL: pass --nats URL (or set {NATS_ENV}), or --data-dir of a running "
            f"`volfsm serve` ({directory / NATS_URL_FILENAME} does not exist; is it running?)"
        )
    name = node or env.get(NODE_ENV) or saved_node(directory) or socket.gethostname().split(".")[0]
    try:
        check_token(name, "node")
    except SubjectError as exc:
        raise ServiceUnreachableError(f"--node: {exc}") from None
    return Target(url=url, node=name, options=dict(options or {}))


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
            raise ServiceUnreachableError(
                f"{exc} (--nats-user/--nats-password, --nats-token, --nats-creds, --nats-tls-*)"
            ) from None
        except (ConnectionError, nats.errors.Error, OSError) as exc:
            raise ServiceUnreachableError(
                f"{exc or type(exc).__name__}: is `volfsm serve` running, and is this its"
                " --nats URL?"
            ) from None

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
            raise ServiceUnreachableError(
                f"no volfsm service for node {node!r} answers on {self.target.url} "
                f"(is `volfsm serve --node {node}` running and connected to this NATS?)"
            ) from None
        except nats.errors.TimeoutError:
            raise ServiceUnreachableError(
                f"node {node!r} did not answer {verb} within {self.timeout:g}s on {self.target.url}"
            ) from None
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
        raw = await self.request_raw(verb, msgspec.json.encode(body))
        try:
            reply = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            raise CommandFailedError("BadReply", f"not JSON: {raw[:200]!r}") from None
        if not isinstance(reply, dict) or "ok" not in reply:
            raise CommandFailedError("BadReply", f"not a volfsm reply: {raw[:200]!r}")
        if reply["ok"] is not True:
            error = reply.get("error") or {}
            raise CommandFailedError(
                str(error.get("code", "Unknown")), str(error.get("message", raw[:200]))
            )
        return reply

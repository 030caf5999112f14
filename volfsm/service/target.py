"""Where a running `volfsm serve` is, and the errors of talking to it (no NATS client here).

`find_target` works out where the service is: the NATS URL from `--nats`,
`$VOLFSM_NATS` or `<data-dir>/nats.url` (written by the service), and the
node from `--node`, `$VOLFSM_NODE`, `<data-dir>/node` or the host name.
Kept apart from `volfsm.service.client` (nats-py) so that the CLI can find
the service, and refuse a bad URL, before it loads a NATS client.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from events.subjects import SubjectError, check_token
from volfsm.bus.urls import split_servers
from volfsm.errors import VolfsmError
from volfsm.paths import data_dir as default_data_dir
from volfsm.service.datadir import NATS_URL_FILENAME, ConfigError, saved_nats_url, saved_node

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
    if not any((user, password, token, creds, tls_ca, tls_cert, tls_key)):
        return {}
    import msgspec

    from volfsm.service.config import Layered, ServeConfig, nats_options  # TOML, TLS: only now

    given = {
        "nats_user": user,
        "nats_password": password,
        "nats_token": token,
        "nats_creds": creds,
        "nats_tls_ca": tls_ca,
        "nats_tls_cert": tls_cert,
        "nats_tls_key": tls_key,
    }
    cfg = msgspec.structs.replace(ServeConfig(), **{k: v or "" for k, v in given.items()})
    origins = {key: f"the option or VOLFSM_{key.upper()}" for key, value in given.items() if value}
    return nats_options(Layered(cfg, origins))


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
    if url:
        where = (
            f"--nats (or {NATS_ENV})"
            if nats_url or env.get(NATS_ENV)
            else str(directory / NATS_URL_FILENAME)
        )
        try:
            split_servers(url)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
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


AUTH_HINT = "--nats-user/--nats-password, --nats-token, --nats-creds, --nats-tls-*"
RUNNING_HINT = "is `volfsm serve` running, and is this its --nats URL?"


def no_responders(target: Target) -> str:
    """Why a request found nobody to answer it."""
    node = target.node
    return (
        f"no volfsm service for node {node!r} answers on {target.url} "
        f"(is `volfsm serve --node {node}` running and connected to this NATS?)"
    )


def no_answer(target: Target, verb: str, timeout: float) -> str:
    """Why a request timed out."""
    return f"node {target.node!r} did not answer {verb} within {timeout:g}s on {target.url}"


def reply_fields(raw: bytes) -> dict[str, Any]:
    """A command's reply as its fields; CommandFailedError for `{"ok": false}` or junk."""
    import msgspec

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


class CommandClient(Protocol):
    """What the CLI needs of a client (`ServiceClient`, or `LiteServiceClient`)."""

    @property
    def target(self) -> Target:
        """Where the service is."""

    @property
    def max_payload(self) -> int:
        """The largest message the server takes (after `connect`)."""

    async def connect(self) -> None:
        """Get ready to send (learn max_payload)."""

    async def request(self, verb: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Send one command; the reply's fields."""

    async def apply(
        self, objects: Sequence[Mapping[str, Any]], *, complete: bool = False
    ) -> dict[str, Any]:
        """Apply objects."""

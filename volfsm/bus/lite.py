"""One NATS request/reply over a plain socket: the CLI's fast path, without nats-py.

`volfsm get` and its kin send one request and read one reply. Loading
nats-py (its JetStream API, asyncio) costs more than the whole rest of the
command, so for the common case, a `nats://` server without TLS and with
no credentials or a user/password or token, `request` speaks the few
lines of the NATS protocol this needs: INFO, CONNECT (headers and no
responders on), PING/PONG, SUB on an inbox of the caller's prefix, PUB,
then MSG or HMSG. Anything else (TLS, a .creds file, a server that wants
TLS or another auth) raises `Unsupported` before anything was sent, and
the caller uses nats-py (`volfsm.service.client`).
"""

from __future__ import annotations

import json
import secrets
import socket
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from volfsm.bus.urls import split_servers

DEFAULT_PORT = 4222
LINE_LIMIT = 64 * 1024
"""Longest protocol line read (INFO is the longest, a few KB)."""
_SID = "1"


class LiteError(Exception):
    """A NATS request through the plain socket failed."""


class Unsupported(LiteError):
    """This connection needs what the plain client does not do (TLS, .creds): use nats-py."""


class Refused(LiteError):
    """The server refused us (authorization): the message says why."""


class Unreachable(LiteError):
    """No server of the list could be reached."""


class NoResponders(LiteError):
    """Nobody subscribes to the subject (NATS 503)."""


class RequestTimeout(LiteError):
    """No reply in time."""


_SIMPLE_OPTIONS = frozenset({"user", "password", "token", "name", "inbox_prefix"})


def supported(url: str, options: Mapping[str, Any]) -> bool:
    """Whether `request` can serve this URL list and these connect options."""
    if any(key not in _SIMPLE_OPTIONS for key in options):
        return False
    return all(server.startswith("nats://") for server in split_servers(url))


def request(
    url: str,
    subject: str,
    payload: bytes,
    *,
    timeout: float,
    options: Mapping[str, Any],
) -> tuple[bytes, int]:
    """Send `payload` to `subject` and return (the reply, the server's max_payload).

    Servers of the list are tried in order until one accepts the connection.
    """
    if not supported(url, options):
        raise Unsupported(url)
    server, sock = _first_server(url, timeout)
    with sock:
        return _Session(sock, time.monotonic() + timeout).request(server, subject, payload, options)


def server_info(url: str, *, timeout: float) -> dict[str, Any]:
    """The INFO of the first server of the list that answers (max_payload, ...)."""
    _, sock = _first_server(url, timeout)
    with sock:
        return _Session(sock, time.monotonic() + timeout)._info()


def _first_server(url: str, timeout: float) -> tuple[str, socket.socket]:
    """(server, its open socket) of the first server of the list that accepts a connection."""
    last: Exception | None = None
    for server in split_servers(url):
        try:
            return server, _open(server, timeout)
        except OSError as exc:
            last = exc
    raise Unreachable(f"cannot reach NATS at {url}: {last}")


def _open(server: str, timeout: float) -> socket.socket:
    parts = urlsplit(server)
    host = parts.hostname or "127.0.0.1"
    return socket.create_connection((host, parts.port or DEFAULT_PORT), timeout=min(timeout, 5.0))


class _Session:
    """One connection, one request."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = b""

    def request(
        self, server: str, subject: str, payload: bytes, options: Mapping[str, Any]
    ) -> tuple[bytes, int]:
        info = self._info()
        if info.get("tls_required"):
            raise Unsupported(f"{server} requires TLS")
        self._send(b"CONNECT " + _connect(server, options, info) + b"\r\nPING\r\n")
        self._handshake()
        prefix = str(options.get("inbox_prefix") or "_INBOX")
        inbox = f"{prefix}.{secrets.token_hex(11)}"
        self._send(
            f"SUB {inbox} {_SID}\r\nPUB {subject} {inbox} {len(payload)}\r\n".encode()
            + payload
            + b"\r\n"
        )
        return self._reply(), int(info.get("max_payload") or 0)

    # ----------------------------------------------------------- reading

    def _fill(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RequestTimeout("no reply in time")
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise RequestTimeout("no reply in time") from None
        if not chunk:
            raise LiteError("the server closed the connection")
        self.buf += chunk

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > LINE_LIMIT:
                raise LiteError("protocol line too long")
            self._fill()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _take(self, size: int) -> bytes:
        while len(self.buf) < size + 2:
            self._fill()
        data, self.buf = self.buf[:size], self.buf[size + 2 :]
        return data

    def _send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _info(self) -> dict[str, Any]:
        line = self._line()
        if not line.startswith(b"INFO "):
            raise LiteError(f"not a NATS server (it said {line[:40]!r})")
        info = json.loads(line[5:])
        return info if isinstance(info, dict) else {}

    def _handshake(self) -> None:
        while True:
            line = self._line()
            if line == b"PONG":
                return
            if line.startswith(b"-ERR"):
                raise Refused(line[5:].decode(errors="replace").strip(" '"))
            if line == b"PING":
                self._send(b"PONG\r\n")

    def _reply(self) -> bytes:
        while True:
            line = self._line()
            if line == b"PING":
                self._send(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                raise Refused(line[5:].decode(errors="replace").strip(" '"))
            elif line.startswith(b"MSG "):
                return self._take(int(line.split()[-1]))
            elif line.startswith(b"HMSG "):
                fields = line.split()
                head, total = int(fields[-2]), int(fields[-1])
                data = self._take(total)
                status = data[:head].split(b"\r\n", 1)[0].split()
                if len(status) >= 2 and status[1] == b"503":
                    raise NoResponders("no responders")
                return data[head:]


def _connect(server: str, options: Mapping[str, Any], info: Mapping[str, Any]) -> bytes:
    """The CONNECT JSON: credentials from the options, else from the URL."""
    parts = urlsplit(server)
    body: dict[str, Any] = {
        "verbose": False,
        "pedantic": False,
        "lang": "python-volfsm-lite",
        "version": "1",
        "protocol": 1,
        "headers": True,
        "no_responders": True,
        "name": str(options.get("name") or "volfsm-cli"),
    }
    user = options.get("user") or (unquote(parts.username) if parts.username else None)
    password = options.get("password") or (unquote(parts.password) if parts.password else None)
    token = options.get("token")
    if user and password is None and token is None:
        token, user = user, None  # nats://TOKEN@host
    if user:
        body["user"], body["pass"] = user, password or ""
    if token:
        body["auth_token"] = token
    if info.get("nonce") and not (user or token):
        raise Unsupported("the server wants a signed nonce (nkeys)")
    return json.dumps(body, separators=(",", ":")).encode()

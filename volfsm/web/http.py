"""A small HTTP/1.1 server for read-only routes: health, readiness, metrics, the dashboard.

Why not a framework: every route volfsm serves is a GET of a fixed path
(`/metrics`, `/healthz`, `/readyz`, the dashboard page, its script and
`/api/report`). That is `asyncio.start_server`, one request per connection
(`Connection: close`), GET and HEAD only, a bounded request head and a read
timeout, so a slow or hostile client costs one short-lived task. aiohttp
would bring its own dependency tree (yarl, multidict, frozenlist,
aiosignal, ...) for none of its features, and `prometheus_client`'s own
server serves `/metrics` only.

Answers: 404 for an unknown path (the body lists the routes), 405 with
`Allow: GET, HEAD` for another method, 400 for a malformed request line,
408 when the head does not arrive in time, 431 when it is too large, 500
when a route raises (the server keeps serving).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from loguru import logger

MAX_HEAD_BYTES = 8192
READ_TIMEOUT_S = 5.0
TEXT = "text/plain; charset=utf-8"

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class Response:
    """What a route answers: a status, a body (text is sent as UTF-8) and its content type."""

    status: int
    body: str | bytes
    content_type: str = TEXT


@dataclass(frozen=True)
class Request:
    """One request as a route sees it."""

    method: str
    path: str
    query: Mapping[str, list[str]] = field(default_factory=dict)

    def param(self, name: str) -> str:
        """The first value of a query parameter ('' when absent)."""
        return self.query.get(name, [""])[0]


Handler = Callable[[Request], Response | Awaitable[Response]]
"""A route: sync, or async when it has to wait (a worker thread, I/O)."""


def static_file(path: Path, content_type: str) -> Handler:
    """A route answering a file's current contents."""

    def handler(_request: Request) -> Response:
        return Response(200, path.read_bytes(), content_type)

    return handler


def encode(resp: Response, head_only: bool, extra: Mapping[str, str] | None = None) -> bytes:
    """The response on the wire: status line, headers, and the body unless `head_only`."""
    body = resp.body.encode() if isinstance(resp.body, str) else resp.body
    headers = {
        "Content-Type": resp.content_type,
        "Content-Length": str(len(body)),
        "Connection": "close",
        "Cache-Control": "no-store",
        **(extra or {}),
    }
    head = f"HTTP/1.1 {resp.status} {_REASONS.get(resp.status, 'Unknown')}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return head.encode("latin-1") + (b"" if head_only else body)


class HttpServer:
    """Serves fixed routes (path -> handler) on host:port; port 0 picks a free one."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: Mapping[str, Handler],
        *,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.port = port
        self.routes = dict(routes)
        self.read_timeout_s = read_timeout_s
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        """The base URL (with the bound port once started)."""
        return f"http://{self.host}:{self.port}/"

    async def start(self) -> None:
        """Bind and start serving; `port` then holds the bound port."""
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=MAX_HEAD_BYTES
        )
        sockets = self._server.sockets
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        logger.info("HTTP on {}:{} ({})", self.host, self.port, ", ".join(self.routes))

    async def stop(self) -> None:
        """Stop listening and close open connections."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            data = await self._answer(reader)
            writer.write(data)
            await writer.drain()
        except Exception as exc:  # a client going away is not our problem
            logger.debug("HTTP connection ended: {}", exc)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> bytes:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.read_timeout_s)
        except TimeoutError:
            return encode(Response(408, "request timeout\n"), False)
        except asyncio.LimitOverrunError:
            return encode(Response(431, "request head too large\n"), False)
        except asyncio.IncompleteReadError:
            return b""
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return encode(Response(400, "bad request line\n"), False)
        method, target, _version = parts
        url = urlsplit(target)
        handler = self.routes.get(url.path)
        if handler is None:
            return encode(Response(404, f"no such path; try {', '.join(self.routes)}\n"), False)
        if method not in ("GET", "HEAD"):
            return encode(Response(405, "only GET and HEAD\n"), False, {"Allow": "GET, HEAD"})
        resp = await self._call(handler, Request(method, url.path, parse_qs(url.query)))
        return encode(resp, method == "HEAD")

    @staticmethod
    async def _call(handler: Handler, request: Request) -> Response:
        try:
            answer = handler(request)
            return answer if isinstance(answer, Response) else await answer
        except Exception as exc:
            logger.exception("HTTP {} failed", request.path)
            return Response(500, f"{type(exc).__name__}: {exc}\n")

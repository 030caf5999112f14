"""A tiny HTTP/1.1 server for `/metrics`, `/healthz` and `/readyz`.

Three read-only endpoints need no web framework: this is
`asyncio.start_server`, one request per connection (`Connection: close`),
GET and HEAD only, a bounded request head and a read timeout, so a slow or
hostile client costs one short-lived task. (aiohttp is not a dependency;
`prometheus_client`'s server would serve `/metrics` only.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from loguru import logger

MAX_HEAD_BYTES = 8192
READ_TIMEOUT_S = 5.0

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
    """What a route answers."""

    status: int
    body: str
    content_type: str = "text/plain; charset=utf-8"


Route = Callable[[], Response]


def _encode(resp: Response, head_only: bool, extra: Mapping[str, str] | None = None) -> bytes:
    body = resp.body.encode()
    headers = {
        "Content-Type": resp.content_type,
        "Content-Length": str(len(body)),
        "Connection": "close",
        "Cache-Control": "no-store",
        **(extra or {}),
    }
    head = f"HTTP/1.1 {resp.status} {_REASONS.get(resp.status, 'Unknown')}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return head.encode() + (b"" if head_only else body)


class HttpServer:
    """Serves fixed routes (path -> callable) on host:port; port 0 picks a free one."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: Mapping[str, Route],
        *,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.port = port
        self.routes = dict(routes)
        self.read_timeout_s = read_timeout_s
        self._server: asyncio.Server | None = None

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
            return _encode(Response(408, "request timeout\n"), False)
        except asyncio.LimitOverrunError:
            return _encode(Response(431, "request head too large\n"), False)
        except asyncio.IncompleteReadError:
            return b""
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _encode(Response(400, "bad request line\n"), False)
        method, target, _version = parts
        path = target.split("?", 1)[0]
        route = self.routes.get(path)
        if route is None:
            return _encode(Response(404, f"no such path; try {', '.join(self.routes)}\n"), False)
        if method not in ("GET", "HEAD"):
            return _encode(Response(405, "only GET and HEAD\n"), False, {"Allow": "GET, HEAD"})
        try:
            resp = route()
        except Exception as exc:
            logger.exception("HTTP {} failed", path)
            resp = Response(500, f"{type(exc).__name__}: {exc}\n")
        return _encode(resp, method == "HEAD")

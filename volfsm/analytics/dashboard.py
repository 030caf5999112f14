"""The aggregator's HTTP side: the dashboard page, `/api/report`, `/metrics`, `/healthz`.

A small asyncio HTTP/1.1 server (GET only, one request per connection)
serving a static page whose own JavaScript draws inline SVG plots from
`/api/report`; nothing is fetched from anywhere else. Reports are built in
a worker thread from a read-only connection to the store, one at a time.

Routes: `/` (the page), `/dashboard.js`, `/api/report[?since=TIME]` (JSON,
TIME as for `--since`), `/metrics` (Prometheus text), `/healthz`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import msgspec

from projections.analytics import Report
from volfsm.analytics.metrics import CONTENT_TYPE as METRICS_TYPE
from volfsm.analytics.metrics import render_metrics
from volfsm.analytics.report import ReportOptions, report_document, store_report
from volfsm.analytics.store import AnalyticsStore, IngestCounters, StoreError
from volfsm.analytics.timearg import parse_time

STATIC_DIR = Path(__file__).resolve().parent / "static"
_STATIC = {
    "/": ("dashboard.html", "text/html; charset=utf-8"),
    "/index.html": ("dashboard.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
}
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}

ReportSource = Callable[[int | None], tuple[Report, IngestCounters | None]]
"""since_us -> (report, the aggregator's counters)."""


class StoreReportSource:
    """Builds reports from an analytics store file, one at a time, on a read-only connection."""

    def __init__(
        self,
        path: Path,
        options: ReportOptions | None = None,
        *,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.path = path
        self.options = options or ReportOptions()
        self.clock = clock
        """UTC µs the reports are computed as of (None: now)."""
        self._lock = threading.Lock()

    def __call__(self, since_us: int | None) -> tuple[Report, IngestCounters | None]:
        options = ReportOptions(
            since_us=since_us,
            lag_threshold_s=self.options.lag_threshold_s,
            stuck_threshold_s=self.options.stuck_threshold_s,
            buckets=self.options.buckets,
        )
        with self._lock, AnalyticsStore(self.path, read_only=True) as store:
            now = self.clock() if self.clock is not None else None
            return store_report(store, options, now_us=now), store.counters()


@dataclass(slots=True)
class Response:
    """One HTTP response."""

    status: int
    content_type: str
    body: bytes


class DashboardServer:
    """Serves the dashboard, the JSON report and the metrics on HOST:PORT."""

    def __init__(self, source: ReportSource, host: str = "127.0.0.1", port: int = 0) -> None:
        self.source = source
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> tuple[str, int]:
        """Start listening; the address actually bound (port 0 picks a free one)."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        sock = self._server.sockets[0].getsockname()
        self.host, self.port = str(sock[0]), int(sock[1])
        return self.host, self.port

    @property
    def url(self) -> str:
        """The base URL."""
        return f"http://{self.host}:{self.port}/"

    async def close(self) -> None:
        """Stop listening and wait for the server to close."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            method, target = _request_line(head)
            response = await self.respond(method, target)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            response = Response(400, "text/plain; charset=utf-8", b"bad request\n")
        try:
            writer.write(_encode(response))
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def respond(self, method: str, target: str) -> Response:
        """The response to one request (also used directly by tests)."""
        if method != "GET":
            return Response(405, "text/plain; charset=utf-8", b"only GET\n")
        url = urlsplit(target)
        path = url.path
        if path in _STATIC:
            name, ctype = _STATIC[path]
            return Response(200, ctype, (STATIC_DIR / name).read_bytes())
        if path == "/healthz":
            return Response(200, "text/plain; charset=utf-8", b"ok\n")
        if path == "/api/report":
            return await self._report(parse_qs(url.query).get("since", [""])[0])
        if path == "/metrics":
            return await self._metrics()
        return Response(404, "text/plain; charset=utf-8", b"not found\n")

    async def _report(self, since: str) -> Response:
        try:
            since_us = parse_time(since) if since else None
        except ValueError as exc:
            return Response(400, "text/plain; charset=utf-8", f"{exc}\n".encode())
        try:
            report, ingest = await asyncio.to_thread(self.source, since_us)
        except StoreError as exc:
            return Response(503, "text/plain; charset=utf-8", f"{exc}\n".encode())
        body = msgspec.json.encode(report_document(report, ingest))
        return Response(200, "application/json", body)

    async def _metrics(self) -> Response:
        try:
            report, ingest = await asyncio.to_thread(self.source, None)
        except StoreError as exc:
            return Response(503, "text/plain; charset=utf-8", f"{exc}\n".encode())
        return Response(200, METRICS_TYPE, render_metrics(report, ingest).encode())


def _request_line(head: bytes) -> tuple[str, str]:
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError(f"bad request line {line!r}")
    return parts[0], parts[1]


def _encode(response: Response) -> bytes:
    reason = _REASONS.get(response.status, "")
    head = (
        f"HTTP/1.1 {response.status} {reason}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + response.body

"""The aggregator's HTTP side: the dashboard page, `/api/report`, `/metrics`, `/healthz`.

Routes on the shared server of `volfsm.web.http`: a static page whose own
JavaScript draws inline SVG plots from `/api/report`; nothing is fetched
from anywhere else. Reports are built in a worker thread from a read-only
connection to the store, one at a time; `/metrics` builds one the same way
when scraped (`ReportCollector`).

Routes: `/` (the page), `/dashboard.js`, `/api/report[?since=TIME&until=TIME]`
(JSON, TIME as for `--since`), `/metrics` (Prometheus text), `/healthz`.
The store may hold several ingest partitions: the report covers them all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path

import msgspec

from projections.analytics import Report
from projections.textfmt import parse_time
from volfsm.analytics.metrics import ReportCollector
from volfsm.analytics.report import ReportOptions, report_and_counters, report_document
from volfsm.analytics.store import AnalyticsStore, IngestCounters, StoreError
from volfsm.web.exposition import metrics_response, registry_of
from volfsm.web.http import Handler, HttpServer, Request, Response, static_file

STATIC_DIR = Path(__file__).resolve().parent / "static"
HTML = "text/html; charset=utf-8"
JAVASCRIPT = "text/javascript; charset=utf-8"

ReportSource = Callable[[int | None, int | None], tuple[Report, IngestCounters | None]]
"""(since_us, until_us) -> (report, the aggregators' counters)."""


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

    def __call__(
        self, since_us: int | None, until_us: int | None = None
    ) -> tuple[Report, IngestCounters | None]:
        options = dataclasses.replace(self.options, since_us=since_us, until_us=until_us)
        now = self.clock() if self.clock is not None else None
        with self._lock, AnalyticsStore(self.path, read_only=True) as store:
            return report_and_counters(store, options, now_us=now)


async def _in_worker(build: Callable[[], Response]) -> Response:
    """`build()` in a worker thread (it reads the store); 503 when the store cannot be read."""
    try:
        return await asyncio.to_thread(build)
    except StoreError as exc:
        return Response(503, f"{exc}\n")


def dashboard_routes(source: ReportSource) -> dict[str, Handler]:
    """The dashboard's routes: the page, its script, the JSON report, metrics, health."""
    registry = registry_of(ReportCollector(lambda: source(None, None)))

    def report(since_us: int | None, until_us: int | None) -> Response:
        doc, ingest = source(since_us, until_us)
        return Response(200, msgspec.json.encode(report_document(doc, ingest)), "application/json")

    async def api_report(request: Request) -> Response:
        since, until = request.param("since"), request.param("until")
        try:
            since_us = parse_time(since) if since else None
            until_us = parse_time(until) if until else None
        except ValueError as exc:
            return Response(400, f"{exc}\n")
        return await _in_worker(lambda: report(since_us, until_us))

    async def metrics(_request: Request) -> Response:
        return await _in_worker(lambda: metrics_response(registry))

    return {
        "/": static_file(STATIC_DIR / "dashboard.html", HTML),
        "/index.html": static_file(STATIC_DIR / "dashboard.html", HTML),
        "/dashboard.js": static_file(STATIC_DIR / "dashboard.js", JAVASCRIPT),
        "/api/report": api_report,
        "/metrics": metrics,
        "/healthz": lambda _request: Response(200, "ok\n"),
    }


def dashboard_server(source: ReportSource, host: str = "127.0.0.1", port: int = 0) -> HttpServer:
    """The dashboard's server on HOST:PORT (port 0 picks a free one); `start()` it."""
    return HttpServer(host, port, dashboard_routes(source))

"""`volfsm analytics serve`'s loop: connect to NATS, consume into the store, serve HTTP.

Kept apart from the CLI so that the other commands (and `volfsm --help`)
do not import NATS, the aggregator and the dashboard.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import nats
from loguru import logger
from nats.aio.client import Client

from volfsm.analytics.aggregator import Aggregator, AggregatorConfig
from volfsm.analytics.dashboard import StoreReportSource, dashboard_server
from volfsm.analytics.report import ReportOptions
from volfsm.analytics.store import AnalyticsStore
from volfsm.bus.roles import AGGREGATOR_INBOX_PREFIX
from volfsm.web.http import HttpServer

CLOSE_TIMEOUT_S = 5.0


async def _connect(url: str, stop: asyncio.Event, options: Mapping[str, Any]) -> Client | None:
    """Connect (retrying until NATS answers, reconnecting forever after); None if stopped first.

    `options` (credentials, TLS) go to nats.connect; replies come on the
    aggregator role's inbox prefix.
    """

    async def log_error(exc: Exception) -> None:
        logger.warning("NATS {}: {}", url, exc or type(exc).__name__)

    connecting = asyncio.ensure_future(
        nats.connect(
            servers=url.split(","),
            max_reconnect_attempts=-1,
            reconnect_time_wait=2.0,
            connect_timeout=5.0,
            error_cb=log_error,
            **{"name": "volfsm-analytics", "inbox_prefix": AGGREGATOR_INBOX_PREFIX, **options},
        )
    )
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([connecting, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not connecting.done():
        connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
        return None
    return connecting.result()


async def serve(
    url: str,
    db: Path,
    config: AggregatorConfig,
    address: tuple[str, int] | None,
    options: ReportOptions,
    connect_options: Mapping[str, Any] | None = None,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    store = AnalyticsStore(db, partition=config.partition or 0, partitions=config.partitions)
    server: HttpServer | None = None
    nc: Client | None = None
    try:
        if address is not None:
            server = dashboard_server(StoreReportSource(db, options), *address)
            await server.start()
            print(f"volfsm analytics: dashboard on {server.url}", file=sys.stderr, flush=True)
        nc = await _connect(url, stop, connect_options or {})
        if nc is not None:
            await Aggregator(store, nc.jetstream(), config).run(stop)
    finally:
        if server is not None:
            await server.stop()
        if nc is not None:
            await _close(nc, url)
        store.close()


async def _close(nc: Client, url: str) -> None:
    """Close the connection; if NATS went away, say so in one line instead of a traceback."""
    connected = nc.is_connected
    with contextlib.suppress(Exception):  # a dead transport fails its drain: nothing to flush
        await asyncio.wait_for(nc.close(), CLOSE_TIMEOUT_S)
    if not connected:
        print(
            f"volfsm analytics: stopped while NATS at {url} was unreachable "
            "(the store holds everything consumed before)",
            file=sys.stderr,
            flush=True,
        )

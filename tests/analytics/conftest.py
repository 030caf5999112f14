"""Fixtures: a real nats-server with the event stream, a JetStream client; all cleaned up."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from tests.analytics.sim import STREAM
from volfsm.bus import NatsServer, ensure_event_stream


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """One JetStream server on a free loopback port, stopped after the test."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[Client]:
    """A client connection to the server, with the event stream created."""
    client = await nats.connect(nats_server.url)
    await ensure_event_stream(client.jetstream(), STREAM, replicas=1, duplicate_window_s=120.0)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def js(nc: Client) -> JetStreamContext:
    """JetStream on the test connection."""
    return nc.jetstream(publish_async_max_pending=4000)

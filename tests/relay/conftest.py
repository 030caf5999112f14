"""Fixtures: real nats-server processes on free loopback ports, logs, and relays; all cleaned up."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from events.log import EventLog
from tests.relay.helpers import NODE
from volfsm.bus import NatsServer
from volfsm.bus.relay import Relay, RelayConfig

_servers: list[NatsServer] = []

MakeServer = Callable[..., NatsServer]
MakeRelay = Callable[..., Relay]


@pytest.fixture(scope="session", autouse=True)
def _no_server_left() -> Iterator[None]:
    """At the end of the session no nats-server started here may still run."""
    yield
    alive = [s.pid for s in _servers if s.running]
    for srv in _servers:
        srv.kill()
    assert not alive, f"nats-server processes left running: {alive}"


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[MakeServer]:
    """Start nats-servers under tmp_path; every one is stopped after the test, pass or fail."""
    mine: list[NatsServer] = []

    def make(name: str = "nats", **kwargs: Any) -> NatsServer:
        srv = NatsServer(tmp_path / name, **kwargs)
        mine.append(srv)
        _servers.append(srv)
        return srv.start()

    yield make
    for srv in mine:
        srv.stop()


@pytest.fixture
def nats_server(make_server: MakeServer) -> NatsServer:
    """One plain JetStream server."""
    return make_server()


@pytest.fixture
def event_log(tmp_path: Path) -> Iterator[EventLog]:
    """An empty event log of node n1."""
    log = EventLog(tmp_path / "events.db", node=NODE)
    yield log
    log.close()


def relay_config(**options: Any) -> RelayConfig:
    """A RelayConfig from keyword options: its own fields, the rest NATS connect options."""
    own = {f.name for f in dataclasses.fields(RelayConfig)}
    connect = {k: v for k, v in options.items() if k not in own}
    return RelayConfig(**{k: v for k, v in options.items() if k in own}, connect_options=connect)


@pytest.fixture
async def make_relay(event_log: EventLog) -> AsyncIterator[MakeRelay]:
    """Build relays (not started) on `event_log` with test-friendly timings; all stopped after."""
    made: list[Relay] = []

    def make(url: str, *, log: EventLog | None = None, **kwargs: Any) -> Relay:
        opts: dict[str, Any] = {
            "backoff_initial_s": 0.05,
            "backoff_max_s": 0.3,
            "poll_interval_s": 0.05,
            "connect_timeout_s": 1.0,
        }
        opts.update(kwargs)
        relay = Relay(log or event_log, url, NODE, relay_config(**opts))
        made.append(relay)
        return relay

    yield make
    for relay in made:
        await relay.stop(flush_timeout=0)

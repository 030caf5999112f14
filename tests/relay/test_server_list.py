"""A comma-separated NATS URL list: the relay, intake and CLI use whichever server answers."""

from __future__ import annotations

from typing import Any

import pytest

from volfsm.bus.connect import connect_once, split_servers
from volfsm.bus.server import NatsServer, free_port
from volfsm.service.config import ConfigError, settings_from


async def _noop() -> None:
    return None


async def _noop_error(exc: Exception) -> None:
    return None


def test_split_servers_names_the_bad_entry() -> None:
    assert split_servers("nats://a:1, tls://b:2") == ["nats://a:1", "tls://b:2"]
    with pytest.raises(ValueError, match=r"'http://b:2'"):
        split_servers("nats://a:1,http://b:2")
    with pytest.raises(ValueError, match=r"''"):
        split_servers("nats://a:1,")


def test_serve_refuses_a_bad_server_list(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match="--nats"):
        settings_from({"data_dir": str(tmp_path), "nats": "nats://a:1,b:2"}, environ={})


async def test_connect_once_skips_a_dead_server(nats_server: NatsServer) -> None:
    dead = f"nats://127.0.0.1:{free_port()}"
    nc = await connect_once(
        f"{dead},{nats_server.url}",
        connect_timeout_s=1.0,
        error_cb=_noop_error,
        disconnected_cb=_noop,
        closed_cb=_noop,
    )
    try:
        assert nc.is_connected
        assert nc.connected_url is not None
        assert nc.connected_url.port == int(nats_server.url.rsplit(":", 1)[1])
    finally:
        await nc.close()


async def test_connect_once_names_every_dead_server() -> None:
    urls = ",".join(f"nats://127.0.0.1:{free_port()}" for _ in range(2))
    with pytest.raises(ConnectionError, match="any of 2 NATS servers"):
        await connect_once(
            urls,
            connect_timeout_s=0.5,
            error_cb=_noop_error,
            disconnected_cb=_noop,
            closed_cb=_noop,
        )


async def test_the_cli_client_skips_a_dead_server_and_names_all_when_none_answers(
    nats_server: NatsServer,
) -> None:
    import nats as nats_py

    from volfsm.service.client import ServiceClient, ServiceUnreachableError, Target

    # Arrange: something answering node n1's get on the live server
    responder = await nats_py.connect(nats_server.url)

    async def answer(msg: Any) -> None:
        await msg.respond(b'{"ok": true, "result": {"what": "pods", "items": []}}')

    await responder.subscribe("volfsm.n1.cmd.get", cb=answer)
    await responder.flush()
    dead = f"nats://127.0.0.1:{free_port()}"
    try:
        # Act / Assert: the first server is dead; the client goes on to the next
        async with ServiceClient(Target(f"{dead},{nats_server.url}", "n1"), timeout=5) as client:
            reply = await client.request_raw("get", b'{"what": "pods"}')
        assert b'"items": []' in reply
        # Act / Assert: none answers: one error naming how many were tried
        with pytest.raises(ServiceUnreachableError, match="cannot reach any of 2 NATS servers"):
            async with ServiceClient(Target(f"{dead},{dead}", "n1"), timeout=2):
                pass
    finally:
        await responder.close()

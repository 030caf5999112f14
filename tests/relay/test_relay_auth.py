"""Credentials: a user that may publish only its node's subjects and the JetStream API calls
the relay needs gets every event through; connections without the right credentials are
refused with a clear error. Token and TLS options pass through to nats.connect."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from pathlib import Path

import nats
import nats.errors
import pytest

from events.log import EventLog
from tests.relay.conftest import MakeRelay, MakeServer
from tests.relay.helpers import NODE, STREAM, append_events, assert_stream_matches_log, wait_until
from volfsm.bus import NatsAuthError, NatsServer
from volfsm.bus.relay import Relay, RelayConfig

RELAY_API = [
    "$JS.API.INFO",
    f"$JS.API.STREAM.INFO.{STREAM}",
    f"$JS.API.STREAM.CREATE.{STREAM}",
    f"$JS.API.STREAM.UPDATE.{STREAM}",
    f"$JS.API.DIRECT.GET.{STREAM}.>",
]
"""A relay that manages its stream; its direct gets are not limited to its own node here,
so that publishing as another node gets as far as the publish (the `node` role's own
limits: tests/relay/test_roles_refused.py)."""


def users_config(node: str = NODE) -> str:
    allow = ", ".join(f'"{s}"' for s in [f"volfsm.{node}.>", *RELAY_API])
    return f"""
authorization {{
  users = [
    {{
      user: "relay-{node}", password: "relay-secret",
      permissions: {{ publish: {{ allow: [{allow}] }}, subscribe: {{ allow: ["_INBOX.>"] }} }}
    }},
    {{ user: "reader", password: "reader-secret" }}
  ]
}}
"""


@pytest.fixture
def auth_server(make_server: MakeServer) -> NatsServer:
    return make_server("nats-auth", config_text=users_config())


READER = {"user": "reader", "password": "reader-secret"}


async def test_restricted_user_publishes_every_event(
    auth_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    relay = make_relay(auth_server.url, user=f"relay-{NODE}", password="relay-secret")
    await relay.start()
    await append_events(event_log, 300, relay=relay)
    await assert_stream_matches_log(relay, event_log, auth_server.url, **READER)
    assert relay.counters.timeouts == 0


async def test_the_permissions_recommended_before_the_roles_still_work(
    make_server: MakeServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    """The service's old list (`$JS.API.>`, `_INBOX.>`): the relay creates the stream, publishes."""
    conf = """
authorization {
  users = [
    {user: volfsm, password: s, permissions: {
      publish: {allow: ["volfsm.n1.events.>", "$JS.API.>", "_INBOX.>"]},
      subscribe: {allow: ["volfsm.n1.cmd.>", "_INBOX.>"]}}},
    {user: reader, password: reader-secret}
  ]
}
"""
    server = make_server("nats-old-list", config_text=conf)
    relay = make_relay(server.url, user="volfsm", password="s")
    await relay.start()
    await append_events(event_log, 30, relay=relay)
    await assert_stream_matches_log(relay, event_log, server.url, **READER)


async def test_relay_without_credentials_is_refused_clearly(
    auth_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    relay = make_relay(auth_server.url)
    with pytest.raises(NatsAuthError, match=r"refused the connection.*Authorization Violation"):
        await relay.start()
    assert not relay.connected


async def test_relay_with_a_wrong_password_is_refused(
    auth_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    relay = make_relay(auth_server.url, user=f"relay-{NODE}", password="wrong")
    with pytest.raises(NatsAuthError, match="check the user/password"):
        await relay.start()


async def test_plain_connection_without_credentials_is_refused(auth_server: NatsServer) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(auth_server.url, allow_reconnect=False, max_reconnect_attempts=1)


async def test_user_may_not_publish_another_nodes_events(
    auth_server: NatsServer, tmp_path: Path
) -> None:
    """relay-n1 publishing as node n2: the server denies it, the relay says why, nothing lands."""
    log = EventLog(tmp_path / "n2.db", node="n2")
    relay = Relay(
        log,
        auth_server.url,
        "n2",
        RelayConfig(
            publish_timeout_s=0.3,
            backoff_max_s=0.2,
            connect_options={"user": f"relay-{NODE}", "password": "relay-secret"},
        ),
    )
    try:
        await relay.start()
        await append_events(log, 5, relay=relay)
        await wait_until(
            lambda: "permissions violation" in (relay.last_error or "").lower(),
            what="the relay reporting the denied publish",
        )
        assert "volfsm.n2.events." in (relay.last_error or "")
        assert relay.counters.acked == 0
        assert relay.lag() == 5
    finally:
        await relay.stop(flush_timeout=0)
        log.close()


async def test_token_auth(
    make_server: MakeServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    server = make_server("nats-token", config_text='authorization { token: "t0ken" }')
    with pytest.raises(NatsAuthError):
        await make_relay(server.url, token="nope").start()
    relay = make_relay(server.url, token="t0ken")
    await relay.start()
    await append_events(event_log, 20, relay=relay)
    await assert_stream_matches_log(relay, event_log, server.url, token="t0ken")


def _self_signed(dirpath: Path) -> tuple[Path, Path]:
    cert, key = dirpath / "cert.pem", dirpath / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_tls(
    make_server: MakeServer, event_log: EventLog, make_relay: MakeRelay, tmp_path: Path
) -> None:
    cert, key = await asyncio.to_thread(_self_signed, tmp_path)
    server = make_server(
        "nats-tls", config_text=f'tls {{ cert_file: "{cert}"\n key_file: "{key}" }}'
    )
    untrusting = make_relay(server.url)  # default CA store does not know our cert
    with pytest.raises(NatsAuthError, match="TLS"):
        await untrusting.start()
    trusted = ssl.create_default_context(cafile=str(cert))
    relay = make_relay(server.url, tls=trusted)
    await relay.start()
    await append_events(event_log, 20, relay=relay)
    await assert_stream_matches_log(relay, event_log, server.url, tls=trusted)

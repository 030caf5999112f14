"""NATS with users and permissions: volfsm connects with its credentials, clients with theirs.

The `client` user may only publish commands to `volfsm.n1.cmd.>` (and read
its replies); the `volfsm` user may do what the service needs: take
commands, answer them, publish events and use the JetStream API.
"""

from __future__ import annotations

import asyncio
import json

import nats
import pytest
from typer.testing import CliRunner

from tests.service.conftest import MakeServe, MakeServer
from tests.service.helpers import EXAMPLES, NODE, expected_stream, read_stream
from volfsm.bus import NatsServer
from volfsm.cli import app

SERVER_CONF = """
authorization {
  users = [
    {user: volfsm, password: "volfsm-secret", permissions: {
      publish: {allow: ["volfsm.n1.events.>", "$JS.API.>", "_INBOX.>"]},
      subscribe: {allow: ["volfsm.n1.cmd.>", "_INBOX.>"]}
    }},
    {user: client, password: "client-secret", permissions: {
      publish: {allow: ["volfsm.n1.cmd.>"]},
      subscribe: {allow: ["_INBOX.>"]}
    }}
  ]
}
"""
SERVICE_AUTH = ["--nats-user", "volfsm", "--nats-password", "volfsm-secret"]
CLIENT_AUTH = ["--nats-user", "client", "--nats-password", "client-secret"]


@pytest.fixture
def secured(make_server: MakeServer) -> NatsServer:
    """A JetStream server that admits only the two users."""
    return make_server("nats-auth", config_text=SERVER_CONF)


def test_service_and_client_with_credentials_work_and_stream_equals_log(
    runner: CliRunner, secured: NatsServer, make_serve: MakeServe
) -> None:
    svc = make_serve(nats_url=secured.url, args=SERVICE_AUTH).start()
    where = ["--nats", secured.url, "--node", NODE, *CLIENT_AUTH]

    result = runner.invoke(app, ["apply", "-f", str(EXAMPLES / "emptydir-pod.yaml"), *where])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        app, ["wait", "pod", "default/scratch", "--for", "mounted", "--timeout", "60", *where]
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["get", "pods", "-o", "json", *where])
    assert json.loads(result.stdout)["items"][0]["phase"] == "Mounted"

    assert svc.stop() == 0
    log = svc.open_log()
    try:
        want = expected_stream(log)
    finally:
        log.close()
    assert read_stream(secured.url, user="volfsm", password="volfsm-secret") == want


def test_a_client_without_credentials_is_refused(
    runner: CliRunner, secured: NatsServer, make_serve: MakeServe
) -> None:
    make_serve(nats_url=secured.url, args=SERVICE_AUTH).start()

    result = runner.invoke(app, ["get", "pods", "--nats", secured.url, "--node", NODE])
    assert result.exit_code == 1
    assert "refused the connection" in result.stderr

    async def bare_connect() -> None:
        nc = await nats.connect(secured.url, allow_reconnect=False, max_reconnect_attempts=1)
        await nc.close()

    with pytest.raises(Exception, match=r"[Aa]uthorization"):
        asyncio.run(bare_connect())


def test_the_client_user_may_send_commands_but_not_pose_as_the_service(
    secured: NatsServer, make_serve: MakeServe
) -> None:
    make_serve(nats_url=secured.url, args=SERVICE_AUTH).start()

    async def misbehave() -> list[str]:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(
            secured.url, user="client", password="client-secret", error_cb=on_error
        )
        try:
            await nc.subscribe("volfsm.n1.cmd.>")
            await nc.publish("volfsm.n1.events.PodAdded", b"{}")
            await nc.flush()
            await asyncio.sleep(0.3)
            reply = await nc.request("volfsm.n1.cmd.get", b'{"what": "pods"}', timeout=10)
            assert json.loads(reply.data)["ok"] is True
        finally:
            await nc.close()
        return errors

    errors = asyncio.run(misbehave())
    assert any("subscription to" in e.lower() and "volfsm.n1.cmd" in e for e in errors), errors
    assert any("publish to" in e.lower() and "volfsm.n1.events" in e for e in errors), errors


def test_the_service_without_credentials_does_not_start(
    secured: NatsServer, make_serve: MakeServe
) -> None:
    svc = make_serve(nats_url=secured.url).start(wait_ready=False)
    assert svc.proc is not None
    code = svc.proc.wait(60)
    assert code == 1
    assert "refused the connection" in svc.stderr_text()

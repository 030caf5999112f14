"""NATS in operator (JWT) mode: the roles as user JWTs and .creds files, as nsc makes them.

The server trusts one operator; its account has JetStream. The users get
the permission lists of `volfsm.bus.roles` (the ones
deploy/nats/roles/nsc-roles.sh gives them): the admin makes the stream with
`volfsm stream create`, node n1 serves in the `node` role, the client may
only send commands and read its replies. A connection without credentials,
or with credentials of an account the operator did not sign, is refused.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
import nkeys
import pytest
from typer.testing import CliRunner

from tests.service.conftest import MakeServe, MakeServer
from tests.service.helpers import EXAMPLES, NODE, expected_stream, read_stream
from tests.service.natsjwt import JwtAuth, new_key, role_creds
from volfsm.bus import NatsServer
from volfsm.bus.roles import (
    CLIENT_INBOX_PREFIX,
    admin_permissions,
    client_permissions,
    node_permissions,
)
from volfsm.cli import app


class Secured:
    """A JetStream server in operator mode and the creds files of its users."""

    def __init__(self, auth: JwtAuth, server: NatsServer) -> None:
        self.server = server
        self.url = server.url
        self.admin = role_creds(auth, "volfsm-admin", admin_permissions())
        self.node = role_creds(auth, f"volfsm-node-{NODE}", node_permissions(NODE))
        self.client = role_creds(auth, "volfsm-client", client_permissions([NODE]))
        stranger_account = new_key(nkeys.PREFIX_BYTE_ACCOUNT)  # not signed by the operator
        self.stranger = auth.user_creds("stranger", account=stranger_account)


@pytest.fixture
def secured(tmp_path: Path, make_server: MakeServer) -> Secured:
    auth = JwtAuth(tmp_path / "auth")
    return Secured(auth, make_server("nats-jwt", config_text=auth.server_config()))


def test_the_roles_with_creds_files_work_and_stream_equals_log(
    runner: CliRunner, secured: Secured, make_serve: MakeServe
) -> None:
    made = runner.invoke(
        app, ["stream", "create", "--nats", secured.url, "--nats-creds", str(secured.admin)]
    )
    assert made.exit_code == 0, made.output
    node_args = ["--nats-creds", str(secured.node), "--stream-setup", "check"]
    svc = make_serve(nats_url=secured.url, args=node_args).start()
    where = ["--nats", secured.url, "--node", NODE, "--nats-creds", str(secured.client)]

    result = runner.invoke(app, ["apply", "-f", str(EXAMPLES / "emptydir-pod.yaml"), *where])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        app, ["wait", "pod", "default/scratch", "--for", "mounted", "--timeout", "60", *where]
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["get", "pods", "-o", "json", *where])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["items"][0]["phase"] == "Mounted"
    errors = [e.lower() for e in asyncio.run(client_misbehaves(secured))]

    assert svc.stop() == 0
    log = svc.open_log()
    try:
        want = expected_stream(log)
    finally:
        log.close()
    assert want
    assert read_stream(secured.url, user_credentials=str(secured.admin)) == want
    assert any("publish to" in e and f"volfsm.{NODE}.events" in e for e in errors), errors
    assert any("publish to" in e and "$js.api.stream.delete" in e for e in errors), errors
    assert any("subscription to" in e and f"volfsm.{NODE}.cmd" in e for e in errors), errors


async def client_misbehaves(secured: Secured) -> list[str]:
    """The client publishes events, deletes the stream, takes commands: the server's errors."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(
        secured.url,
        user_credentials=str(secured.client),
        error_cb=on_error,
        inbox_prefix=CLIENT_INBOX_PREFIX,
    )
    try:
        await nc.publish(f"volfsm.{NODE}.events.PodAdded", b"{}")
        await nc.publish("$JS.API.STREAM.DELETE.VOLFSM", b"")
        await nc.subscribe(f"volfsm.{NODE}.cmd.>")
        await nc.flush()
        await asyncio.sleep(0.3)
        reply = await nc.request(f"volfsm.{NODE}.cmd.get", b'{"what": "pods"}', timeout=10)
        assert json.loads(reply.data)["ok"] is True
    finally:
        await nc.close()
    return errors


def test_connections_without_valid_creds_are_refused(runner: CliRunner, secured: Secured) -> None:
    where = ["--nats", secured.url, "--node", NODE]

    result = runner.invoke(app, ["get", "pods", *where])
    assert result.exit_code == 1
    assert "refused the connection" in result.stderr
    result = runner.invoke(app, ["get", "pods", *where, "--nats-creds", str(secured.stranger)])
    assert result.exit_code == 1
    assert "refused the connection" in result.stderr

    async def bare_connect() -> None:
        nc = await nats.connect(secured.url, allow_reconnect=False, max_reconnect_attempts=1)
        await nc.close()

    with pytest.raises(Exception, match=r"[Aa]uthorization"):
        asyncio.run(bare_connect())


@pytest.mark.parametrize("creds", ["none", "stranger"])
def test_the_service_without_valid_creds_does_not_start(
    creds: str, secured: Secured, make_serve: MakeServe
) -> None:
    args = ["--nats-creds", str(secured.stranger)] if creds == "stranger" else []
    svc = make_serve(nats_url=secured.url, args=args).start(wait_ready=False)
    assert svc.proc is not None
    assert svc.proc.wait(60) == 1
    assert "refused the connection" in svc.stderr_text()

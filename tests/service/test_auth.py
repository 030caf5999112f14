"""NATS with users: the roles of deploy/nats/roles/users.conf, end to end.

The server runs the shipped users.conf as is. The admin makes the stream
with `volfsm stream create`; node n1 runs `volfsm serve` in the `node` role
(`--stream-setup check`, its own login); a client drives it with the
`client` role. The node publishes every event, restarts, and gets a lost
log back with `--restore-from-stream`, all with only the node role's
rights. Connections without valid credentials are refused.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import nats
import pytest
from typer.testing import CliRunner

from tests.helpers.natsroles import ADMIN, CLIENT, cli_login, login, node_serve_args, roles_config
from tests.service.conftest import MakeServe, MakeServer
from tests.service.helpers import EXAMPLES, NODE, expected_stream, keyless, read_stream
from volfsm.bus import NatsServer
from volfsm.cli import app
from volfsm.service.config import ConfigError, settings_from


@pytest.fixture
def secured(make_server: MakeServer) -> NatsServer:
    """A JetStream server that admits only the roles of the shipped users.conf."""
    return make_server("nats-auth", config_text=roles_config())


def stream_cmd(runner: CliRunner, verb: str, url: str, user: str) -> tuple[int, str]:
    """`volfsm stream <verb>` logged in as `user`: exit code and output."""
    result = runner.invoke(app, ["stream", verb, "--nats", url, *cli_login(user)])
    return result.exit_code, result.output


def test_the_roles_end_to_end_create_serve_command_restart_restore(
    runner: CliRunner, secured: NatsServer, make_serve: MakeServe
) -> None:
    url = secured.url
    # Arrange: the operator's part, with the admin credential
    code, out = stream_cmd(runner, "check", url, ADMIN)
    assert (code, out.strip()) == (1, "stream VOLFSM does not exist: `volfsm stream create --nats"
                                   " URL --stream VOLFSM` creates it")  # fmt: skip
    code, out = stream_cmd(runner, "create", url, ADMIN)
    assert code == 0 and out.startswith("created stream VOLFSM\n"), out
    code, out = stream_cmd(runner, "check", url, ADMIN)
    assert code == 0 and out.startswith("stream VOLFSM ok: "), out

    # Act: the node in its role; a client in its own
    svc = make_serve(nats_url=url, args=node_serve_args(NODE)).start()
    where = ["--nats", url, "--node", NODE, *cli_login(CLIENT)]
    result = runner.invoke(app, ["apply", "-f", str(EXAMPLES / "emptydir-pod.yaml"), *where])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        app, ["wait", "pod", "default/scratch", "--for", "mounted", "--timeout", "60", *where]
    )
    assert result.exit_code == 0, result.output
    errors = asyncio.run(client_misbehaves(url))
    assert svc.stop() == 0

    # Assert: every event in the stream once; the client could not pose as the node
    with svc.open_log() as log:
        before = list(log.read_after(0))
        assert read_stream(url, **login(ADMIN)) == expected_stream(log)
    assert any("subscription to" in e and f"volfsm.{NODE}.cmd" in e for e in errors), errors
    assert any("publish to" in e and f"volfsm.{NODE}.events" in e for e in errors), errors
    assert any("publish to" in e and "$js.api.stream.purge" in e for e in errors), errors

    # Act: the log is lost; the node puts it back from the stream with its own rights
    for path in svc.data_dir.glob("volfsm.db*"):
        shutil.move(path, svc.workdir / path.name)
    again = make_serve(nats_url=url, args=[*node_serve_args(NODE), "--restore-from-stream"])
    again.start()
    assert again.stop() == 0

    # Assert: the history is back, event for event, and the stream still equals the log
    with again.open_log() as log:
        assert list(log.read_after(0, len(before))) == before
        assert keyless(read_stream(url, **login(ADMIN))) == keyless(expected_stream(log))
    assert "log restored from stream VOLFSM: seq 1.." in again.stderr_text()


async def client_misbehaves(url: str) -> list[str]:
    """The client tries to take the node's commands, publish its events, purge; the errors."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    nc = await nats.connect(url, error_cb=on_error, inbox_prefix="_INBOX.client", **login(CLIENT))
    try:
        await nc.subscribe(f"volfsm.{NODE}.cmd.>")
        await nc.publish(f"volfsm.{NODE}.events.PodAdded", b"{}")
        await nc.publish("$JS.API.STREAM.PURGE.VOLFSM", b"{}")
        await nc.flush()
        await asyncio.sleep(0.3)
        reply = await nc.request(f"volfsm.{NODE}.cmd.get", b'{"what": "pods"}', timeout=10)
        assert json.loads(reply.data)["ok"] is True
    finally:
        await nc.close()
    return errors


def test_a_node_that_only_checks_does_not_start_without_the_stream(
    secured: NatsServer, make_serve: MakeServe
) -> None:
    svc = make_serve(nats_url=secured.url, args=node_serve_args(NODE)).start(wait_ready=False)
    assert svc.proc is not None
    assert svc.proc.wait(60) == 1
    text = svc.stderr_text()
    assert "JetStream stream VOLFSM does not exist" in text
    assert "volfsm stream create --nats URL --stream VOLFSM" in text


def test_a_node_may_not_create_the_stream(runner: CliRunner, secured: NatsServer) -> None:
    result = runner.invoke(
        app, ["stream", "create", "--nats", secured.url, *cli_login("volfsm-node-n1")]
    )
    assert result.exit_code == 1
    assert "NATS denied" in result.stderr and "needs the admin credential" in result.stderr
    assert stream_cmd(runner, "check", secured.url, ADMIN)[0] == 1  # still no stream


def test_a_client_without_credentials_is_refused(runner: CliRunner, secured: NatsServer) -> None:
    result = runner.invoke(app, ["get", "pods", "--nats", secured.url, "--node", NODE])
    assert result.exit_code == 1
    assert "refused the connection" in result.stderr

    async def bare_connect() -> None:
        nc = await nats.connect(secured.url, allow_reconnect=False, max_reconnect_attempts=1)
        await nc.close()

    with pytest.raises(Exception, match=r"[Aa]uthorization"):
        asyncio.run(bare_connect())


def test_the_service_without_credentials_does_not_start(
    secured: NatsServer, make_serve: MakeServe
) -> None:
    svc = make_serve(nats_url=secured.url).start(wait_ready=False)
    assert svc.proc is not None
    assert svc.proc.wait(60) == 1
    assert "refused the connection" in svc.stderr_text()


def test_only_checking_the_stream_needs_a_nats_url() -> None:
    """With the embedded server the service makes its own stream: `check` makes no sense."""
    with pytest.raises(ConfigError, match=r"--stream-setup .* needs --nats URL"):
        settings_from({"stream_setup": "check"}, environ={})
    assert settings_from({"nats": "nats://127.0.0.1:4222"}, environ={}).stream_setup == "create"

"""`volfsm stream create|check` against a real nats-server: what it makes, fixes and reports."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig
from typer.testing import CliRunner

from events.subjects import EVENTS_WILDCARD
from tests.relay.helpers import STREAM
from volfsm.bus import NatsServer
from volfsm.cli import app


@pytest.fixture
async def js(nats_server: NatsServer) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(nats_server.url)
    yield nc.jetstream()
    await nc.close()


def run_stream(url: str, *args: str) -> tuple[int, list[str]]:
    """`volfsm stream ARGS --nats URL`: exit code and output lines."""
    result = CliRunner().invoke(app, ["stream", *args, "--nats", url])
    return result.exit_code, result.output.splitlines()


async def stream(url: str, *args: str) -> tuple[int, list[str]]:
    """`run_stream` from a worker thread (the command runs its own event loop)."""
    return await asyncio.to_thread(run_stream, url, *args)


async def test_create_makes_the_stream_volfsm_needs_and_check_says_ok(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    code, out = await stream(nats_server.url, "create", "--duplicate-window", "30")
    assert code == 0 and out[0] == f"created stream {STREAM}", out
    cfg = (await js.stream_info(STREAM)).config
    assert (cfg.subjects, cfg.storage, cfg.retention) == ([EVENTS_WILDCARD], "file", "limits")
    assert (cfg.num_replicas, cfg.duplicate_window, cfg.allow_direct) == (1, 30.0, True)
    code, out = await stream(nats_server.url, "create", "--duplicate-window", "30")
    assert code == 0 and out[0] == f"stream {STREAM} already has volfsm's settings", out
    code, out = await stream(nats_server.url, "check", "--duplicate-window", "30")
    assert code == 0, out
    assert out == [
        f"stream {STREAM} ok: subjects {EVENTS_WILDCARD}; file storage; limits retention; "
        "replicas 1; duplicate window 30s; direct get on; no limits; 0 messages"
    ]


async def test_check_names_each_problem_and_create_fixes_what_it_can(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    """A stream as an older volfsm made it (no direct gets), with another window."""
    await js.add_stream(StreamConfig(name=STREAM, subjects=["audit.>"], duplicate_window=60))
    code, out = await stream(nats_server.url, "check", "--replicas", "3")
    assert code == 1
    assert out == [
        f"stream {STREAM}: its subjects ['audit.>'] do not capture {EVENTS_WILDCARD}",
        f"stream {STREAM}: direct gets are off (allow_direct: false); a node reads its last"
        " event with one",
        f"stream {STREAM}: its duplicate window is 60s, not 120s",
        f"stream {STREAM}: its replicas are 1, not 3",
    ]
    code, out = await stream(nats_server.url, "create")
    assert code == 0
    assert out[0] == (
        f"updated stream {STREAM}: subjects ['audit.>'] -> ['audit.>', '{EVENTS_WILDCARD}'],"
        " duplicate_window 60.0 -> 120.0, allow_direct False -> True"
    )
    assert (await stream(nats_server.url, "check"))[0] == 0


async def test_a_stream_create_cannot_fix_is_reported_and_left_alone(
    nats_server: NatsServer, js: JetStreamContext
) -> None:
    await js.add_stream(
        StreamConfig(name=STREAM, subjects=[EVENTS_WILDCARD], storage=StorageType.MEMORY)
    )
    before = (await js.stream_info(STREAM)).config
    code, out = await stream(nats_server.url, "create")
    assert code == 1
    assert "volfsm needs file storage (storage cannot be changed" in "\n".join(out)
    assert (await js.stream_info(STREAM)).config == dataclasses.replace(before)


def test_an_unreachable_server_is_one_line_and_exit_1(nats_server: NatsServer) -> None:
    nats_server.stop()
    code, out = run_stream(nats_server.url, "check")
    assert code == 1
    assert len(out) == 1 and out[0].startswith("volfsm: error: cannot reach NATS at")

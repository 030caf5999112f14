"""What the roles may not do, against a real nats-server running the shipped users.conf.

One server for the module: the stream made with `volfsm stream create`
(admin), then events of nodes n1 and n2 published by their relays in the
`node` role. Each refused action is tried with one role's login; the test
asserts the server's refusal (a permissions violation naming the subject,
or a JetStream error) and that the stream did not change: message count,
first and last seq, consumers and configuration.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS
from typer.testing import CliRunner

from events.codec import envelope_to_json
from events.log import EventLog
from events.subjects import events_subject, msg_id, msg_key
from tests.helpers.natsroles import (
    ADMIN,
    AGGREGATOR,
    CLIENT,
    REPO,
    cli_login,
    login,
    node_login,
    roles_config,
)
from tests.relay.helpers import STREAM, append_events, wait_until
from tests.service.test_cli_operator import read_until, terminate
from tests.service.test_intake import FakeEngine
from volfsm.analytics.aggregator import Aggregator, AggregatorConfig
from volfsm.analytics.defaults import DEFAULT_DURABLE
from volfsm.analytics.store import AnalyticsStore
from volfsm.bus import NatsServer
from volfsm.bus.relay import Relay, RelayConfig
from volfsm.bus.roles import (
    AGGREGATOR_INBOX_PREFIX,
    CLIENT_INBOX_PREFIX,
    events_consumers,
    history_consumer,
)
from volfsm.cli import app
from volfsm.service.intake import CommandIntake, CommandProcessor

EVENTS = {"n1": 20, "n2": 15}


@dataclass(frozen=True)
class Bus:
    """The module's server and the nodes' logs."""

    url: str
    logs: dict[str, Path]


async def publish_as_node(url: str, log_path: Path, node: str, count: int) -> None:
    """Append `count` events to the node's log and let its relay (node role) publish them."""
    with EventLog(log_path, node=node) as log:
        await append_events(log, count)
        relay = Relay(
            log, url, node, RelayConfig(manage_stream=False, connect_options=node_login(node))
        )
        await relay.start()
        await relay.stop(flush_timeout=30)
        assert relay.lag() == 0, relay.last_error


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bus]:
    base = tmp_path_factory.mktemp("roles")
    server = NatsServer(base / "nats", config_text=roles_config(root=True))
    server.start()
    try:
        made = CliRunner().invoke(
            app, ["stream", "create", "--nats", server.url, *cli_login(ADMIN)]
        )
        assert made.exit_code == 0, made.output
        assert made.stdout.startswith(f"created stream {STREAM}")
        logs = {node: base / f"{node}.db" for node in EVENTS}
        for node, count in EVENTS.items():
            asyncio.run(publish_as_node(server.url, logs[node], node, count))
        yield Bus(server.url, logs)
    finally:
        server.stop()


async def stream_state(url: str) -> tuple[Any, ...]:
    """What must not change: counts, first and last seq, consumers, the configuration."""
    nc = await nats.connect(url)  # the test's own user (every right)
    try:
        info = await nc.jetstream().stream_info(STREAM)
    finally:
        await nc.close()
    state = info.state
    return (
        state.messages,
        state.first_seq,
        state.last_seq,
        state.consumer_count,
        json.dumps(info.config.as_dict(), sort_keys=True),
    )


Act = Callable[[NATS], Awaitable[object]]


async def errors_of(url: str, who: dict[str, Any], act: Act) -> list[str]:
    """Do `act` logged in as `who`; the errors the server reported for it (lower case)."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    nc = await nats.connect(url, error_cb=on_error, allow_reconnect=False, **who)
    try:
        await act(nc)
        await nc.flush(timeout=5)
        await wait_until(lambda: errors, timeout=10, what="the server's refusal")
    finally:
        await nc.close()
    return errors


def request(subject: str, body: object = None, headers: dict[str, str] | None = None) -> Act:
    """Publish `body` (JSON) to `subject` with a reply inbox, as a request would."""

    async def act(nc: NATS) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        await nc.publish(subject, data, reply=nc.new_inbox(), headers=headers)

    return act


def subscribe(subject: str) -> Act:
    async def act(nc: NATS) -> None:
        await nc.subscribe(subject)

    return act


N1 = node_login("n1")
API = "$JS.API"
SLOT = events_consumers()[0]
"""A consumer name the client may use for `volfsm events`."""
REFUSED: list[tuple[str, dict[str, Any], Act, str]] = [
    # (case, login, action, what the refusal names)
    ("node-purge", N1, request(f"{API}.STREAM.PURGE.{STREAM}", {}), "publish to"),
    ("node-purge-other-node", N1, request(
        f"{API}.STREAM.PURGE.{STREAM}", {"filter": "volfsm.n2.events.>"}), "publish to"),
    ("node-delete-stream", N1, request(f"{API}.STREAM.DELETE.{STREAM}"), "publish to"),
    ("node-update-stream", N1, request(
        f"{API}.STREAM.UPDATE.{STREAM}",
        {"name": STREAM, "subjects": ["volfsm.*.events.>"], "max_msgs": 1}), "publish to"),
    ("node-create-stream-on-n2", N1, request(
        f"{API}.STREAM.CREATE.STEAL", {"name": "STEAL", "subjects": ["volfsm.n2.events.>"]}),
     "publish to"),
    ("node-delete-message", N1, request(f"{API}.STREAM.MSG.DELETE.{STREAM}", {"seq": 1}),
     "publish to"),
    ("node-get-message-by-seq", N1, request(f"{API}.STREAM.MSG.GET.{STREAM}", {"seq": 1}),
     "publish to"),
    ("node-direct-get-by-seq", N1, request(f"{API}.DIRECT.GET.{STREAM}", {"seq": 1}),
     "publish to"),
    ("node-direct-get-n2-last", N1, request(f"{API}.DIRECT.GET.{STREAM}.volfsm.n2.events.>"),
     "publish to"),
    ("node-publish-n2-event-forged-id", N1, request(
        "volfsm.n2.events.PodAdded", {"forged": True}, {"Nats-Msg-Id": "n2:16"}), "publish to"),
    ("node-subscribe-n2-commands", N1, subscribe("volfsm.n2.cmd.>"), "subscription to"),
    ("node-subscribe-all-commands", N1, subscribe("volfsm.*.cmd.>"), "subscription to"),
    ("node-subscribe-n2-events-live", N1, subscribe("volfsm.n2.events.>"), "subscription to"),
    ("node-subscribe-n2-inbox", N1, subscribe("_INBOX.node.n2.>"), "subscription to"),
    ("node-subscribe-aggregator-inbox", N1, subscribe(f"{AGGREGATOR_INBOX_PREFIX}.>"),
     "subscription to"),
    ("node-consumer-on-n2", N1, request(
        f"{API}.CONSUMER.CREATE.{STREAM}.{history_consumer('n1')}.volfsm.n2.events.>",
        {"stream_name": STREAM, "config": {"name": history_consumer("n1"),
                                           "filter_subject": "volfsm.n2.events.>"}}),
     "publish to"),
    ("node-consumer-on-all", N1, request(
        f"{API}.CONSUMER.CREATE.{STREAM}.{history_consumer('n1')}.volfsm.*.events.>",
        {"stream_name": STREAM, "config": {"name": history_consumer("n1"),
                                           "filter_subject": "volfsm.*.events.>"}}),
     "publish to"),
    ("node-consumer-n2-name", N1, request(
        f"{API}.CONSUMER.CREATE.{STREAM}.{history_consumer('n2')}.volfsm.n2.events.>",
        {"stream_name": STREAM, "config": {"name": history_consumer("n2"),
                                           "filter_subject": "volfsm.n2.events.>"}}),
     "publish to"),
    ("node-consumer-unfiltered", N1, request(
        f"{API}.CONSUMER.CREATE.{STREAM}", {"stream_name": STREAM, "config": {}}), "publish to"),
    ("node-durable-consumer", N1, request(
        f"{API}.CONSUMER.DURABLE.CREATE.{STREAM}.mine",
        {"stream_name": STREAM, "config": {"durable_name": "mine"}}), "publish to"),
    ("node-pull-aggregator-consumer", N1, request(
        f"{API}.CONSUMER.MSG.NEXT.{STREAM}.volfsm-analytics", {"batch": 10}), "publish to"),
    ("client-publish-event", login(CLIENT), request("volfsm.n1.events.PodAdded", {}),
     "publish to"),
    ("client-purge", login(CLIENT), request(f"{API}.STREAM.PURGE.{STREAM}", {}), "publish to"),
    ("client-delete-stream", login(CLIENT), request(f"{API}.STREAM.DELETE.{STREAM}"), "publish to"),
    ("client-update-stream", login(CLIENT), request(
        f"{API}.STREAM.UPDATE.{STREAM}", {"name": STREAM, "max_msgs": 1}), "publish to"),
    ("client-delete-message", login(CLIENT), request(
        f"{API}.STREAM.MSG.DELETE.{STREAM}", {"seq": 1}), "publish to"),
    ("client-direct-get-by-seq", login(CLIENT), request(f"{API}.DIRECT.GET.{STREAM}", {"seq": 1}),
     "publish to"),
    ("client-durable-consumer", login(CLIENT), request(
        f"{API}.CONSUMER.DURABLE.CREATE.{STREAM}.{SLOT}",
        {"stream_name": STREAM, "config": {"durable_name": SLOT}}), "publish to"),
    ("client-consumer-other-name", login(CLIENT), request(
        f"{API}.CONSUMER.CREATE.{STREAM}.mine.volfsm.n1.events.>",
        {"stream_name": STREAM,
         "config": {"name": "mine", "filter_subject": "volfsm.n1.events.>"}}),
     "publish to"),
    ("client-update-aggregator-consumer", login(CLIENT), request(
        f"{API}.CONSUMER.CREATE.{STREAM}.{DEFAULT_DURABLE}.volfsm.*.events.>",
        {"stream_name": STREAM, "config": {"name": DEFAULT_DURABLE, "ack_wait": 1}}),
     "publish to"),
    ("client-update-node-history-consumer", login(CLIENT), request(
        f"{API}.CONSUMER.CREATE.{STREAM}.{history_consumer('n1')}.volfsm.n1.events.>",
        {"stream_name": STREAM, "config": {"name": history_consumer("n1")}}), "publish to"),
    ("client-consumer-unnamed", login(CLIENT), request(
        f"{API}.CONSUMER.CREATE.{STREAM}", {"stream_name": STREAM, "config": {}}), "publish to"),
    ("client-consumer-unfiltered", login(CLIENT), request(
        f"{API}.CONSUMER.CREATE.{STREAM}.{SLOT}",
        {"stream_name": STREAM, "config": {"name": SLOT}}), "publish to"),
    ("client-consumer-beyond-events", login(CLIENT), request(
        f"{API}.CONSUMER.CREATE.{STREAM}.{SLOT}.>",
        {"stream_name": STREAM, "config": {"name": SLOT, "filter_subject": ">"}}), "publish to"),
    ("client-consumer-info", login(CLIENT), request(
        f"{API}.CONSUMER.INFO.{STREAM}.{DEFAULT_DURABLE}"), "publish to"),
    ("client-pull-aggregator-consumer", login(CLIENT), request(
        f"{API}.CONSUMER.MSG.NEXT.{STREAM}.{DEFAULT_DURABLE}", {"batch": 10}), "publish to"),
    ("client-delete-aggregator-consumer", login(CLIENT), request(
        f"{API}.CONSUMER.DELETE.{STREAM}.{DEFAULT_DURABLE}"), "publish to"),
    ("client-subscribe-commands", login(CLIENT), subscribe("volfsm.n1.cmd.>"),
     "subscription to"),
    ("client-subscribe-node-inbox", login(CLIENT), subscribe("_INBOX.node.n1.>"),
     "subscription to"),
    ("aggregator-purge", login(AGGREGATOR), request(f"{API}.STREAM.PURGE.{STREAM}", {}),
     "publish to"),
    ("aggregator-delete-stream", login(AGGREGATOR), request(f"{API}.STREAM.DELETE.{STREAM}"),
     "publish to"),
    ("aggregator-delete-message", login(AGGREGATOR), request(
        f"{API}.STREAM.MSG.DELETE.{STREAM}", {"seq": 1}), "publish to"),
    ("aggregator-update-stream", login(AGGREGATOR), request(
        f"{API}.STREAM.UPDATE.{STREAM}", {"name": STREAM, "max_msgs": 1}), "publish to"),
    ("aggregator-other-consumer", login(AGGREGATOR), request(
        f"{API}.CONSUMER.DURABLE.CREATE.{STREAM}.other",
        {"stream_name": STREAM, "config": {"durable_name": "other"}}), "publish to"),
    ("aggregator-publish-event", login(AGGREGATOR), request("volfsm.n1.events.PodAdded", {}),
     "publish to"),
    ("aggregator-subscribe-commands", login(AGGREGATOR), subscribe("volfsm.n1.cmd.>"),
     "subscription to"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("who", "act", "refusal"),
    [pytest.param(who, act, refusal, id=case) for case, who, act, refusal in REFUSED],
)
async def test_refused_and_the_stream_is_unchanged(
    bus: Bus, who: dict[str, Any], act: Act, refusal: str
) -> None:
    before = await stream_state(bus.url)
    errors = await errors_of(bus.url, who, act)
    assert any("permissions violation" in e and refusal in e for e in errors), errors
    assert await stream_state(bus.url) == before


async def test_a_consumer_whose_filter_differs_from_its_create_subject_is_refused(
    bus: Bus,
) -> None:
    """Allowed subject (n1's own filter), body asking for n2's events: the server says no."""
    name = history_consumer("n1")
    before = await stream_state(bus.url)
    nc = await nats.connect(bus.url, **N1)
    try:
        for body_filter in ("volfsm.n2.events.>", None):
            config: dict[str, Any] = {"name": name, "deliver_policy": "all", "ack_policy": "none"}
            if body_filter is not None:
                config["filter_subject"] = body_filter
            reply = await nc.request(
                f"{API}.CONSUMER.CREATE.{STREAM}.{name}.volfsm.n1.events.>",
                json.dumps({"stream_name": STREAM, "config": config}).encode(),
                timeout=5,
            )
            assert json.loads(reply.data)["error"]["err_code"] == 10131, reply.data
    finally:
        await nc.close()
    assert await stream_state(bus.url) == before


def events_cli(url: str, *args: str) -> list[str]:
    """`volfsm events` of node n1 as the client role."""
    return [sys.executable, "-m", "volfsm.cli", "events", "--nats", url, "--node", "n1",
            *cli_login(CLIENT), "-o", "json", *args]  # fmt: skip


def test_the_client_reads_a_nodes_events_and_leaves_the_stream_as_it_was(bus: Bus) -> None:
    before = asyncio.run(stream_state(bus.url))
    done = subprocess.run(
        events_cli(bus.url), capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    with EventLog(bus.logs["n1"], node="n1") as log:
        expected = [envelope_to_json(env).decode() for env in log.read_after(0)]
    assert done.stdout.splitlines() == expected
    assert asyncio.run(stream_state(bus.url)) == before  # its consumer deleted on exit


def test_the_client_follows_a_nodes_new_events(bus: Bus) -> None:
    """Two alike `volfsm events --follow` at once: a consumer each, both print the new event."""
    before = asyncio.run(stream_state(bus.url))
    tails = [
        subprocess.Popen(
            events_cli(bus.url, "--follow"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
        )
        for _ in range(2)
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 60  # a safety net only
        while asyncio.run(stream_state(bus.url))[3] < before[3] + 2:  # their consumers
            assert time.monotonic() < deadline, "volfsm events made no consumer"
            time.sleep(0.05)
        asyncio.run(publish_as_node(bus.url, bus.logs["n1"], "n1", 1))
        with EventLog(bus.logs["n1"], node="n1") as log:
            newest = log.last_seq()
        seen = [read_until(tail, f'"seq":{newest},') for tail in tails]
    finally:
        ends = [terminate(tail) for tail in tails]
    assert ends == [(0, ""), (0, "")]
    for printed in seen:
        assert [json.loads(line)["seq"] for line in printed.splitlines()] == [newest]
    messages, first, last, consumers, config = asyncio.run(stream_state(bus.url))
    assert (messages, first, last, consumers, config) == (
        before[0] + 1, before[1], before[2] + 1, before[3], before[4])  # fmt: skip


def test_a_client_consumer_whose_filter_differs_from_its_create_subject_is_refused(
    bus: Bus,
) -> None:
    """Allowed subject (a slot name, n1's filter), body asking for more: the server says no."""

    async def attempt() -> list[int]:
        nc = await nats.connect(bus.url, **login(CLIENT), inbox_prefix=CLIENT_INBOX_PREFIX)
        codes = []
        try:
            for body_filter in ("volfsm.n2.events.>", None):
                config: dict[str, Any] = {"name": SLOT, "ack_policy": "none"}
                if body_filter is not None:
                    config["filter_subject"] = body_filter
                reply = await nc.request(
                    f"{API}.CONSUMER.CREATE.{STREAM}.{SLOT}.volfsm.n1.events.>",
                    json.dumps({"stream_name": STREAM, "config": config}).encode(),
                    timeout=5,
                )
                codes.append(json.loads(reply.data)["error"]["err_code"])
        finally:
            await nc.close()
        return codes

    before = asyncio.run(stream_state(bus.url))
    assert asyncio.run(attempt()) == [10131, 10131]
    assert asyncio.run(stream_state(bus.url)) == before


async def test_a_forged_msg_id_does_not_keep_the_real_event_out(bus: Bus) -> None:
    """n1 tried to publish n2's next id on n2's subject (refused above): n2's event still lands."""
    errors = await errors_of(
        bus.url, N1, request("volfsm.n2.events.PodAdded", {}, {"Nats-Msg-Id": "n2:100"})
    )
    assert any("volfsm.n2.events.podadded" in e for e in errors), errors
    with EventLog(bus.logs["n2"], node="n2") as log:
        have = log.last_seq()
        await append_events(log, 100 - have)
        relay = Relay(
            log, bus.url, "n2", RelayConfig(manage_stream=False, connect_options=node_login("n2"))
        )
        await relay.start()
        try:
            assert await relay.flush(30)
        finally:
            await relay.stop(flush_timeout=5)
        assert relay.counters.duplicates == 0
        [last] = list(log.read_after(99, 100))
        key = msg_key(log.log_id)
    nc = await nats.connect(bus.url)
    try:
        msg = await nc.jetstream().get_last_msg(STREAM, "volfsm.n2.events.>")
    finally:
        await nc.close()
    assert (msg.headers or {}).get("Nats-Msg-Id") == f"n2:100/{key}"
    assert msg.data == envelope_to_json(last)


async def test_the_intake_runs_requests_only_not_jetstream_deliveries(bus: Bus) -> None:
    """nats-server lets whoever may create a consumer name any deliver subject, n2's command
    subjects included; such a delivery has no reply subject or a `$JS.` one. n2's intake runs
    neither: only requests."""
    handled: list[tuple[str, str]] = []
    n2 = CommandProcessor(
        FakeEngine(), "n2", max_bytes=4096, count=lambda verb, code: handled.append((verb, code))
    )
    intake = CommandIntake(n2, bus.url, "n2", connect_options=node_login("n2"))
    await intake.start()
    nc = await nats.connect(bus.url)  # the test's own user: may publish anything
    try:
        assert await intake.wait_subscribed(10)
        await nc.publish("volfsm.n2.cmd.delete", b'{"uid": "victim"}')
        await nc.publish(
            "volfsm.n2.cmd.delete", b'{"uid": "victim"}', reply=f"$JS.ACK.{STREAM}.c.1.1.1.0.0"
        )
        client = await nats.connect(bus.url, **login(CLIENT), inbox_prefix="_INBOX.client")
        try:
            reply = await client.request("volfsm.n2.cmd.get", b'{"what": "pods"}', timeout=10)
        finally:
            await client.close()
        assert json.loads(reply.data)["ok"] is True
    finally:
        await nc.close()
        await intake.close()
    assert [verb for verb, _ in handled] == ["get"]


async def test_the_aggregator_ingests_each_event_once_and_refuses_foreign_ones(
    bus: Bus, tmp_path: Path
) -> None:
    # Arrange: n1 publishes, on its own subject (allowed), an event that claims to be n2's
    with EventLog(bus.logs["n2"], node="n2") as log:
        [victim] = list(log.read_after(0, 1))
        n2_events = log.last_seq()
    with EventLog(bus.logs["n1"], node="n1") as log:
        n1_events = log.last_seq()
    forged = msgspec.structs.replace(victim, seq=1000)
    node1 = await nats.connect(bus.url, **N1)
    try:
        ack = await node1.jetstream().publish(
            events_subject("n1", forged.type),
            envelope_to_json(forged),
            headers={"Nats-Msg-Id": "n2:1000"},
        )
        assert ack.stream == STREAM
    finally:
        await node1.close()
    before = await stream_state(bus.url)

    # Act: the aggregator (its role's login) ingests, twice over the same store
    db = tmp_path / "analytics.db"
    counts = []
    for _ in range(2):
        nc = await nats.connect(bus.url, **login(AGGREGATOR), inbox_prefix=AGGREGATOR_INBOX_PREFIX)
        try:
            with AnalyticsStore(db) as store:
                counts.append(
                    await Aggregator(store, nc.jetstream(), AggregatorConfig()).run_until_idle()
                )
        finally:
            await nc.close()

    # Assert: every event once, n2 untouched by the forgery, nothing changed in the stream
    with AnalyticsStore(db, read_only=True) as store:
        per_node = {n.node: n.events for n in store.nodes()}
        counters = store.counters()
        gaps = store.gap_log()
    assert per_node == {"n1": n1_events, "n2": n2_events}
    assert counters.applied == n1_events + n2_events
    assert counters.undecodable == 1  # the forged event, kept as a reject
    assert gaps == []
    assert counts[1] == 0
    messages, first, last, consumers, config = await stream_state(bus.url)
    assert (messages, first, last, config) == (before[0], before[1], before[2], before[4])
    assert consumers == before[3] + 1  # its own durable consumer, and nothing else


async def test_a_node_cannot_shadow_another_nodes_next_event(bus: Bus) -> None:
    """JetStream dedupes by msg id across subjects: n1 sends, on its own subject (allowed),
    the ids n2's next event would have without a key, and with the key of a log id it made up.
    n2's event still lands: its id carries the key of n2's own log, which n1 never sees."""
    with EventLog(bus.logs["n2"], node="n2") as log:
        next_seq = log.last_seq() + 1
        real_key = msg_key(log.log_id)
    guesses = [msg_id("n2", next_seq), msg_id("n2", next_seq, msg_key("guessed-log-id"))]
    node1 = await nats.connect(bus.url, **N1)
    try:
        for guess in guesses:
            ack = await node1.jetstream().publish(
                events_subject("n1", "PodAdded"), b"{}", headers={"Nats-Msg-Id": guess}
            )
            assert not ack.duplicate
    finally:
        await node1.close()
    with EventLog(bus.logs["n2"], node="n2") as log:
        await append_events(log, 1)
        relay = Relay(
            log, bus.url, "n2", RelayConfig(manage_stream=False, connect_options=node_login("n2"))
        )
        await relay.start()
        try:
            assert await relay.flush(30)
        finally:
            await relay.stop(flush_timeout=5)
        assert relay.counters.duplicates == 0
        [event] = list(log.read_after(next_seq - 1))
    nc = await nats.connect(bus.url)
    try:
        msg = await nc.jetstream().get_last_msg(STREAM, "volfsm.n2.events.>")
    finally:
        await nc.close()
    assert (msg.headers or {}).get("Nats-Msg-Id") == msg_id("n2", next_seq, real_key)
    assert msg.data == envelope_to_json(event)

"""End to end: the stream holds the log, once each, in order; flush, lag, notify, restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats

from events.log import EventLog
from events.subjects import EVENTS_WILDCARD, msg_key
from tests.relay.conftest import MakeRelay
from tests.relay.helpers import (
    STREAM,
    append_events,
    assert_stream_matches_log,
    read_stream,
    wait_until,
)
from volfsm.bus import NatsServer
from volfsm.bus.relay import Relay, RelayConfig


async def test_relay_publishes_the_log_in_order_exactly_once(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    await append_events(event_log, 300)  # a backlog before the relay starts
    relay = make_relay(nats_server.url)
    await relay.start()
    assert relay.connected
    await append_events(event_log, 700, relay=relay)  # and more while it runs
    await assert_stream_matches_log(relay, event_log, nats_server.url)
    assert relay.lag() == 0
    assert event_log.get_cursor(f"relay:{STREAM}") == event_log.last_seq() == 1000
    assert relay.counters.acked == 1000
    assert relay.counters.timeouts == 0
    assert relay.counters.duplicates == 0


async def test_stream_is_created_with_the_requested_settings(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    relay = make_relay(nats_server.url, duplicate_window_s=7)
    await relay.start()
    nc = await nats.connect(nats_server.url)
    try:
        cfg = (await nc.jetstream().stream_info(STREAM)).config
    finally:
        await nc.close()
    assert cfg.subjects == [EVENTS_WILDCARD]
    assert cfg.storage == "file"
    assert cfg.retention == "limits"
    assert cfg.num_replicas == 1
    assert cfg.duplicate_window == 7


async def test_lag_counts_unacked_events_and_flush_waits_for_the_cursor(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    await append_events(event_log, 40)
    relay = make_relay(nats_server.url)
    assert relay.lag() == 40  # not started: nothing acked
    await relay.start()
    assert await relay.flush(30)
    assert relay.lag() == 0
    assert relay.cursor == 40


async def test_notify_from_another_thread_wakes_the_relay(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    relay = make_relay(nats_server.url, poll_interval_s=3600)  # only notify() can wake it
    await relay.start()
    last = await append_events(event_log, 5)
    await asyncio.to_thread(relay.notify)
    await wait_until(lambda: relay.acked_seq == last, what="events published after notify()")


async def test_a_restarted_relay_resumes_from_the_cursor(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    first = make_relay(nats_server.url)
    await first.start()
    await append_events(event_log, 120, relay=first)
    await first.stop(flush_timeout=30)
    assert event_log.get_cursor(f"relay:{STREAM}") == 120
    await append_events(event_log, 80)
    second = make_relay(nats_server.url)
    await second.start()
    await assert_stream_matches_log(second, event_log, nats_server.url)
    assert second.counters.published == 80
    assert second.counters.skipped == 0


async def test_two_nodes_share_the_stream_without_mixing(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay, tmp_path: Path
) -> None:
    other_log = EventLog(tmp_path / "n2.db", node="n2")
    try:
        mine = make_relay(nats_server.url)
        other = Relay(other_log, nats_server.url, "n2", RelayConfig(backoff_max_s=0.3))
        await mine.start()
        await other.start()
        try:
            await append_events(event_log, 50, relay=mine)
            await append_events(other_log, 30, relay=other)
            await assert_stream_matches_log(mine, event_log, nats_server.url)
            assert await other.flush(30)
            got = await read_stream(nats_server.url, node="n2")
            key = msg_key(other_log.log_id)
            assert len(key) == 16 and key != msg_key(event_log.log_id)
            assert [e.msg_id for e in got] == [f"n2:{i}/{key}" for i in range(1, 31)]
        finally:
            await other.stop(flush_timeout=0)
    finally:
        other_log.close()

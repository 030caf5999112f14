"""A crash between PubAck and cursor write must not duplicate events, even past the
duplicate window: on start the relay reconciles its cursor with the stream."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import nats

from events.codec import envelope_to_json
from events.log import EventLog
from events.subjects import events_subject, msg_id, msg_key
from tests.relay.conftest import MakeRelay
from tests.relay.helpers import (
    NODE,
    STREAM,
    append_events,
    assert_stream_matches_log,
    wait_until,
)
from volfsm.bus import NatsServer

ROOT = Path(__file__).resolve().parents[2]
CURSOR = f"relay:{STREAM}"


async def test_acked_but_cursor_not_written_is_not_republished(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    """A relay whose cursor writes are lost, then a new relay after the window passed."""
    await append_events(event_log, 300)
    real_set_cursor = event_log.set_cursor
    event_log.set_cursor = lambda name, seq: None  # type: ignore[method-assign]
    first = make_relay(nats_server.url, duplicate_window_s=1.0)
    await first.start()
    await wait_until(lambda: first.acked_seq == 300, what="all 300 events acked")
    await first.stop(flush_timeout=0)
    assert event_log.get_cursor(CURSOR) == 0  # acked, never recorded
    event_log.set_cursor = real_set_cursor  # type: ignore[method-assign]

    await asyncio.sleep(1.5)  # past the duplicate window: msg ids no longer dedupe
    await append_events(event_log, 50)
    second = make_relay(nats_server.url, duplicate_window_s=1.0)
    await second.start()
    await assert_stream_matches_log(second, event_log, nats_server.url)
    assert second.counters.skipped == 300
    assert second.counters.published == 50
    assert second.counters.duplicates == 0


async def test_events_published_by_hand_then_relay_skips_them(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    """The crash simulated at the wire: the first 40 events are in the stream, cursor 0."""
    await append_events(event_log, 100)
    setup = make_relay(nats_server.url, duplicate_window_s=1.0)
    await setup.start()  # creates the stream
    await setup.stop(flush_timeout=0)
    event_log.set_cursor(CURSOR, 0)
    # Recreate the stream empty and put the first 40 events in it as a relay would have.
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.purge_stream(STREAM)
        for env in event_log.read_after(0, until_seq=40):
            await js.publish(
                events_subject(NODE, env.type),
                envelope_to_json(env),
                headers={"Nats-Msg-Id": msg_id(NODE, env.seq, msg_key(event_log.log_id))},
            )
    finally:
        await nc.close()
    await asyncio.sleep(1.5)
    relay = make_relay(nats_server.url, duplicate_window_s=1.0)
    await relay.start()
    await assert_stream_matches_log(relay, event_log, nats_server.url)
    assert relay.counters.skipped == 40
    assert relay.counters.published == 60


async def test_sigkill_between_publish_and_cursor_write(
    nats_server: NatsServer, tmp_path: Path, make_relay: MakeRelay
) -> None:
    """A relay process killed with SIGKILL after its PubAcks, before its cursor writes."""
    log_path = tmp_path / "crash.db"
    log = EventLog(log_path, node=NODE)
    await append_events(log, 500)
    log.close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.relay.child_relay", str(log_path), nats_server.url, "120"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)
        assert line.strip() == b"ACKED 500"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    await asyncio.sleep(1.5)  # past the 1 s duplicate window

    log = EventLog(log_path, node=NODE)
    relay = make_relay(nats_server.url, log=log, duplicate_window_s=1.0)
    try:
        cursor = log.get_cursor(CURSOR)
        assert cursor <= 120  # the process died with its cursor behind the stream
        await append_events(log, 25)
        await relay.start()
        await assert_stream_matches_log(relay, log, nats_server.url)
        assert relay.counters.skipped == 500 - cursor
        assert relay.counters.published == 25
    finally:
        await relay.stop(flush_timeout=0)
        log.close()


async def test_stream_that_lost_events_gets_them_republished(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    """The stream holds less than the cursor (recreated, or an R1 server lost unsynced acks).

    flush() must wait for the republished tail, not for the cursor the log
    already had: enough events that the republish outlasts a start().
    """
    first = make_relay(nats_server.url)
    await first.start()
    await append_events(event_log, 2000, batch=200, relay=first)
    assert await first.flush(30)
    await first.stop()
    nc = await nats.connect(nats_server.url)
    try:
        await nc.jetstream().delete_stream(STREAM)
    finally:
        await nc.close()
    second = make_relay(nats_server.url)
    await second.start()
    await assert_stream_matches_log(second, event_log, nats_server.url)
    assert second.counters.rewinds == 1
    assert second.counters.published == 2000

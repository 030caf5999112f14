"""Outages of any length: the stream still ends up holding every event once, in order.

NATS is stopped, killed, or frozen while events are being appended and
published; appends go on meanwhile; the relay reconnects by itself and the
stream, read back with a consumer, equals the log.
"""

from __future__ import annotations

import asyncio

import pytest

from events.log import EventLog
from tests.relay.conftest import MakeRelay
from tests.relay.helpers import append_events, assert_stream_matches_log, wait_until
from volfsm.bus import NatsServer


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_nats_down_during_a_burst_then_back(
    how: str, nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    relay = make_relay(nats_server.url)
    await relay.start()
    burst = asyncio.create_task(append_events(event_log, 3000, batch=10, relay=relay))
    await wait_until(lambda: relay.acked_seq >= 300, what="the relay publishing the burst")
    # Take NATS away while the burst is still being appended and published.
    await asyncio.to_thread(nats_server.stop if how == "stop" else nats_server.kill)
    await burst
    assert not nats_server.running, "the burst should have finished while NATS was down"
    await wait_until(lambda: not relay.connected, what="the relay noticing the outage")
    # More appends, entirely while NATS is down: they complete without it.
    last = await append_events(event_log, 500, relay=relay)
    assert not nats_server.running
    assert last == event_log.last_seq() == 3500
    assert relay.lag() > 0
    await asyncio.to_thread(nats_server.start)
    await assert_stream_matches_log(relay, event_log, nats_server.url)
    assert relay.counters.reconnects >= 1


async def test_outage_longer_than_the_duplicate_window(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    """Publishes whose outcome is unknown, then an outage past the dedupe window.

    The server is frozen while publishes are in flight (no PubAck comes back,
    so the relay cannot know what was stored), then killed, and stays down
    longer than the 1 s duplicate window: msg-id dedupe can no longer help.
    """
    relay = make_relay(nats_server.url, duplicate_window_s=1.0, publish_timeout_s=0.5)
    await relay.start()
    await append_events(event_log, 200, relay=relay)
    assert await relay.flush(30)
    nats_server.pause()
    await append_events(event_log, 400, relay=relay)
    await wait_until(lambda: relay.counters.timeouts > 0, what="in-flight publishes timing out")
    await asyncio.to_thread(nats_server.kill)
    await append_events(event_log, 100, relay=relay)
    await asyncio.sleep(2.5)  # longer than the duplicate window: ids published before are forgotten
    await asyncio.to_thread(nats_server.start)
    await assert_stream_matches_log(relay, event_log, nats_server.url)


async def test_hung_server_times_out_publishes_and_recovers(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    """A frozen server answers nothing: every publish has its own deadline.

    The relay must not wait on PubAcks forever: it counts timeouts, drops the
    connection, and once the server answers again reconciles with the stream
    (some of the timed-out publishes may have been stored after all).
    """
    relay = make_relay(nats_server.url, publish_timeout_s=0.3)
    await relay.start()
    await append_events(event_log, 50, relay=relay)
    assert await relay.flush(30)
    nats_server.pause()
    try:
        await append_events(event_log, 300, relay=relay)
        await wait_until(lambda: relay.counters.timeouts > 0, what="publish timeouts")
        assert relay.last_error is not None and "no PubAck" in relay.last_error
        acked_while_frozen = relay.counters.acked
        await append_events(event_log, 50, relay=relay)  # appends go on meanwhile
    finally:
        nats_server.resume()
    assert acked_while_frozen == 50
    await assert_stream_matches_log(relay, event_log, nats_server.url)
    assert relay.counters.reconnects >= 1


async def test_relay_started_while_nats_is_down_catches_up(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    await asyncio.to_thread(nats_server.stop)
    relay = make_relay(nats_server.url)
    await relay.start()  # does not raise: NATS down is lag, not failure
    assert not relay.connected
    assert relay.last_error is not None and "cannot reach NATS" in relay.last_error
    await append_events(event_log, 250, relay=relay)
    assert relay.lag() == 250
    await asyncio.to_thread(nats_server.start)
    await assert_stream_matches_log(relay, event_log, nats_server.url)

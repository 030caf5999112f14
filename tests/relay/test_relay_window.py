"""In-flight publishes are bounded by max_inflight."""

from __future__ import annotations

import asyncio

from events.log import EventLog
from tests.relay.conftest import MakeRelay
from tests.relay.helpers import append_events, assert_stream_matches_log, wait_until
from volfsm.bus import NatsServer


async def test_never_more_than_max_inflight_outstanding(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    """With the server frozen no PubAck comes back: the relay sends exactly the window, no more."""
    relay = make_relay(nats_server.url, max_inflight=8, publish_timeout_s=60)
    await relay.start()
    nats_server.pause()
    try:
        await append_events(event_log, 500, relay=relay)
        await wait_until(lambda: relay.inflight == 8, what="the window to fill")
        for _ in range(20):  # it stays full and is not exceeded while nothing is acked
            relay.notify()
            await asyncio.sleep(0.01)
            assert relay.counters.published == 8
            assert relay.inflight == 8
    finally:
        nats_server.resume()
    await assert_stream_matches_log(relay, event_log, nats_server.url)
    assert relay.counters.max_inflight_seen == 8
    assert relay.counters.published == 500


async def test_window_of_one_publishes_strictly_one_at_a_time(
    nats_server: NatsServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    relay = make_relay(nats_server.url, max_inflight=1)
    await relay.start()
    await append_events(event_log, 120, relay=relay)
    await assert_stream_matches_log(relay, event_log, nats_server.url)
    assert relay.counters.max_inflight_seen == 1

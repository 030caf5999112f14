"""The stream is created or checked at start: safe differences are updated, the rest reported."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from events.codec import envelope_to_json
from events.log import EventLog
from events.subjects import EVENTS_WILDCARD, events_subject, msg_id
from tests.relay.conftest import MakeRelay
from tests.relay.helpers import NODE, STREAM, append_events, assert_stream_matches_log
from volfsm.bus import NatsServer, StreamConfigError
from volfsm.bus.relay import StreamAheadError


@pytest.fixture
async def js(nats_server: NatsServer) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(nats_server.url)
    yield nc.jetstream()
    await nc.close()


async def test_existing_stream_gets_our_subjects_and_window(
    nats_server: NatsServer, js: JetStreamContext, event_log: EventLog, make_relay: MakeRelay
) -> None:
    await js.add_stream(
        StreamConfig(
            name=STREAM, subjects=["audit.>"], storage=StorageType.FILE, duplicate_window=60
        )
    )
    relay = make_relay(nats_server.url, duplicate_window_s=5)
    await relay.start()
    cfg = (await js.stream_info(STREAM)).config
    assert cfg.subjects == ["audit.>", EVENTS_WILDCARD]
    assert cfg.duplicate_window == 5
    await append_events(event_log, 30, relay=relay)
    await assert_stream_matches_log(relay, event_log, nats_server.url)


async def test_a_wider_existing_subject_is_kept(
    nats_server: NatsServer, js: JetStreamContext, make_relay: MakeRelay
) -> None:
    await js.add_stream(StreamConfig(name=STREAM, subjects=["volfsm.>"], duplicate_window=120))
    await make_relay(nats_server.url).start()
    assert (await js.stream_info(STREAM)).config.subjects == ["volfsm.>"]


@pytest.mark.parametrize(
    ("config", "complaint"),
    [
        (StreamConfig(subjects=[EVENTS_WILDCARD], storage=StorageType.MEMORY), "file storage"),
        (
            StreamConfig(subjects=[EVENTS_WILDCARD], retention=RetentionPolicy.WORK_QUEUE),
            "needs limits",
        ),
    ],
)
async def test_unusable_stream_is_reported_at_start(
    nats_server: NatsServer,
    js: JetStreamContext,
    make_relay: MakeRelay,
    config: StreamConfig,
    complaint: str,
) -> None:
    config.name = STREAM
    await js.add_stream(config)
    with pytest.raises(StreamConfigError, match=complaint):
        await make_relay(nats_server.url).start()


async def test_subjects_taken_by_another_stream_are_reported(
    nats_server: NatsServer, js: JetStreamContext, make_relay: MakeRelay
) -> None:
    await js.add_stream(StreamConfig(name="OTHER", subjects=["volfsm.>"]))
    with pytest.raises(StreamConfigError, match=f"cannot create JetStream stream {STREAM}"):
        await make_relay(nats_server.url).start()


async def test_replicas_the_server_cannot_give_are_reported(
    nats_server: NatsServer, make_relay: MakeRelay
) -> None:
    with pytest.raises(StreamConfigError, match="cannot create"):
        await make_relay(nats_server.url, replicas=3).start()


async def test_stream_ahead_of_the_log_is_refused(
    nats_server: NatsServer, js: JetStreamContext, event_log: EventLog, make_relay: MakeRelay
) -> None:
    """Events of this node up to seq 10 in the stream, a log with 3: wrong log or name clash."""
    await append_events(event_log, 3)
    first = make_relay(nats_server.url)
    await first.start()
    await first.stop(flush_timeout=30)  # the stream holds 1..3
    env = next(iter(event_log.read_after(0)))
    await js.publish(
        events_subject(NODE, env.type),
        envelope_to_json(env),
        headers={"Nats-Msg-Id": msg_id(NODE, 10)},
    )
    with pytest.raises(StreamAheadError, match="local log ends at 3"):
        await make_relay(nats_server.url).start()


async def test_stream_with_limits_is_not_refilled(
    nats_server: NatsServer, js: JetStreamContext, event_log: EventLog, make_relay: MakeRelay
) -> None:
    """With max_msgs set, a stream shorter than the cursor is the limit at work, not a loss."""
    await js.add_stream(
        StreamConfig(name=STREAM, subjects=[EVENTS_WILDCARD], max_msgs=10, duplicate_window=120)
    )
    first = make_relay(nats_server.url)
    await first.start()
    await append_events(event_log, 50, relay=first)
    assert await first.flush(30)
    await first.stop()
    await js.purge_stream(STREAM)
    second = make_relay(nats_server.url)
    await second.start()
    assert await second.flush(10)
    assert second.counters.rewinds == 0
    assert second.counters.published == 0
    assert (await js.stream_info(STREAM)).state.messages == 0


async def test_stream_deleted_while_running_is_recreated_and_refilled(
    nats_server: NatsServer, js: JetStreamContext, event_log: EventLog, make_relay: MakeRelay
) -> None:
    """Publishes to a deleted stream get no PubAck but an error status: the relay says so,
    recreates the stream and, the log being the source of truth, republishes everything."""
    relay = make_relay(nats_server.url)
    await relay.start()
    await append_events(event_log, 100, relay=relay)
    assert await relay.flush(30)
    await js.delete_stream(STREAM)
    await append_events(event_log, 50, relay=relay)
    await assert_stream_matches_log(relay, event_log, nats_server.url)
    assert relay.counters.errors >= 1
    assert relay.counters.rewinds == 1

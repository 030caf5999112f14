"""`restore_from_stream`: the node's events copied back from a real JetStream, or refused.

`js` is the restoring node's connection and `admin_js` the one that damages
the stream for a test (purge, delete, publish a copy): the same here;
`test_node_role_suite.py` runs these tests with the `node` role's
credentials for `js` only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.js import JetStreamContext

from events.codec import envelope_to_json
from events.log import EventLog
from events.subjects import events_subject
from tests.relay.conftest import MakeRelay
from tests.relay.helpers import NODE, STREAM, append_events
from volfsm.bus import NatsServer
from volfsm.service.restore import RESTORE_CHUNK, LogRestoreError, restore_from_stream


@pytest.fixture
async def js(nats_server: NatsServer) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(nats_server.url)
    yield nc.jetstream()
    await nc.close()


@pytest.fixture
def admin_js(js: JetStreamContext) -> JetStreamContext:
    return js


async def published(make_relay: MakeRelay, url: str, log: EventLog, n: int) -> None:
    """Append n events to `log` and let a relay put them all in the stream."""
    await append_events(log, n)
    relay = make_relay(url, log=log)
    await relay.start()
    await relay.stop(flush_timeout=30)
    assert relay.lag() == 0


async def test_more_than_one_chunk_comes_back_in_order(
    tmp_path: Path, nats_server: NatsServer, js: JetStreamContext, event_log: EventLog,
    make_relay: MakeRelay,
) -> None:  # fmt: skip
    await published(make_relay, nats_server.url, event_log, RESTORE_CHUNK + 300)
    with EventLog(tmp_path / "new.db", node=NODE) as new:
        result = await restore_from_stream(new, js, STREAM, NODE)
        assert (result.log_last_seq, result.restored) == (0, RESTORE_CHUNK + 300)
        assert list(new.read_after(0)) == list(event_log.read_after(0))
        again = await restore_from_stream(new, js, STREAM, NODE)
        assert again.restored == 0 and again.stream_last_seq == new.last_seq()


async def test_events_dropped_by_retention_cannot_be_restored(
    tmp_path: Path, nats_server: NatsServer, js: JetStreamContext, admin_js: JetStreamContext,
    event_log: EventLog, make_relay: MakeRelay,
) -> None:  # fmt: skip
    await published(make_relay, nats_server.url, event_log, 40)
    await admin_js.purge_stream(STREAM, keep=30)  # what max_msgs or max_age would do
    with EventLog(tmp_path / "new.db", node=NODE) as new:
        with pytest.raises(
            LogRestoreError,
            match=r"no longer holds events 1\.\.10 of node n1 \(retention dropped"
            r" them; nothing restored\)",
        ):
            await restore_from_stream(new, js, STREAM, NODE)
        assert new.last_seq() == 0
    # A backup ending at 10: the stream no longer has seq 10 to compare it with
    with EventLog(tmp_path / "old.db", node=NODE) as old:
        old.restore(list(event_log.read_after(0, 10)))
        with pytest.raises(LogRestoreError, match="no longer holds event seq 10 of node n1"):
            await restore_from_stream(old, js, STREAM, NODE)
        assert old.last_seq() == 10
    # A backup ending at 15 is checked against the stream's seq 15 and gets 16..40 back
    with EventLog(tmp_path / "backup.db", node=NODE) as backup:
        backup.restore(list(event_log.read_after(0, 15)))
        result = await restore_from_stream(backup, js, STREAM, NODE)
        assert (result.log_last_seq, result.restored) == (15, 25)
        assert list(backup.read_after(0)) == list(event_log.read_after(0))


async def test_a_copy_the_stream_holds_twice_is_taken_once(
    tmp_path: Path, nats_server: NatsServer, js: JetStreamContext, admin_js: JetStreamContext,
    event_log: EventLog, make_relay: MakeRelay,
) -> None:  # fmt: skip
    # Arrange: seq 5 published again after its duplicate window (another msg id)
    await published(make_relay, nats_server.url, event_log, 12)
    [fifth] = list(event_log.read_after(4, 5))
    await admin_js.publish(
        events_subject(NODE, fifth.type), envelope_to_json(fifth), headers={"Nats-Msg-Id": "x"}
    )

    # Act
    with EventLog(tmp_path / "new.db", node=NODE) as new:
        result = await restore_from_stream(new, js, STREAM, NODE)

        # Assert
        assert result.restored == 12
        assert list(new.read_after(0)) == list(event_log.read_after(0))


async def test_a_hole_in_the_middle_keeps_what_came_before_it(
    tmp_path: Path, nats_server: NatsServer, js: JetStreamContext, admin_js: JetStreamContext,
    event_log: EventLog, make_relay: MakeRelay,
) -> None:  # fmt: skip
    # Arrange: the stream lost node seq 8 (its message deleted)
    await published(make_relay, nats_server.url, event_log, 12)
    await admin_js.delete_msg(STREAM, 8)  # stream seq 8 is node seq 8: one node, published in order

    # Act / Assert
    with EventLog(tmp_path / "new.db", node=NODE) as new:
        with pytest.raises(LogRestoreError, match=r"events 8\.\.8 .* seq 1\.\.7 restored"):
            await restore_from_stream(new, js, STREAM, NODE)
        assert list(new.read_after(0)) == list(event_log.read_after(0, 7))

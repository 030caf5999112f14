"""The relay and `--restore-from-stream` with nothing but the `node` role's rights.

The server runs the shipped deploy/nats/roles/users.conf; the stream is
created beforehand, as `volfsm stream create` would, and every relay here
logs in as node n1 and only checks the stream (`manage_stream=False`, the
service's `--stream-setup check`). The tests imported below are the
relay, outage and restore suites' own: they run here a second time, with
`make_relay` and the restoring `js` logged in as the node, while the
tests' observers (reading the stream back, purging or deleting on purpose
as retention would) connect as a test user with every right.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from events.log import EventLog
from tests.helpers.natsroles import ADMIN, login, node_login, roles_config
from tests.relay.conftest import MakeRelay, MakeServer
from tests.relay.helpers import NODE, STREAM, append_events, assert_stream_matches_log, wait_until
from tests.relay.test_relay_basic import (  # noqa: F401  (collected here too)
    test_a_restarted_relay_resumes_from_the_cursor,
    test_lag_counts_unacked_events_and_flush_waits_for_the_cursor,
    test_relay_publishes_the_log_in_order_exactly_once,
)
from tests.relay.test_relay_outage import (  # noqa: F401
    test_nats_down_during_a_burst_then_back,
    test_relay_started_while_nats_is_down_catches_up,
)
from tests.relay.test_relay_stream_setup import (  # noqa: F401
    test_stream_ahead_of_the_log_is_refused,
)
from tests.relay.test_restore_from_stream import (  # noqa: F401
    test_a_copy_the_stream_holds_twice_is_taken_once,
    test_a_hole_in_the_middle_keeps_what_came_before_it,
    test_events_dropped_by_retention_cannot_be_restored,
    test_more_than_one_chunk_comes_back_in_order,
)
from volfsm.bus import NatsServer, StreamConfigError, ensure_event_stream


async def create_stream(url: str) -> None:
    """What `volfsm stream create` does, with the admin credential."""
    nc = await nats.connect(url, **login(ADMIN))
    try:
        await ensure_event_stream(nc.jetstream(), STREAM, replicas=1, duplicate_window_s=120)
    finally:
        await nc.close()


@pytest.fixture
async def nats_server(make_server: MakeServer) -> NatsServer:
    """A server with the shipped roles (and a test user with every right), the stream made."""
    server = make_server("nats-roles", config_text=roles_config(root=True))
    await create_stream(server.url)
    return server


@pytest.fixture
def make_relay(make_relay: MakeRelay) -> MakeRelay:
    """Relays of node n1 in the `node` role: its login, and the stream only checked."""

    def make(url: str, **kwargs: Any) -> Any:
        return make_relay(url, **{"manage_stream": False, **node_login(NODE), **kwargs})

    return make


@pytest.fixture
async def js(nats_server: NatsServer) -> AsyncIterator[JetStreamContext]:
    """The restoring node's JetStream: node n1's login."""
    nc = await nats.connect(nats_server.url, **node_login(NODE))
    yield nc.jetstream()
    await nc.close()


@pytest.fixture
async def admin_js(nats_server: NatsServer) -> AsyncIterator[JetStreamContext]:
    """The test's own JetStream, with every right (it damages the stream on purpose)."""
    nc = await nats.connect(nats_server.url)
    yield nc.jetstream()
    await nc.close()


async def test_a_node_that_checks_a_missing_stream_names_the_command_that_makes_it(
    nats_server: NatsServer, admin_js: JetStreamContext, make_relay: MakeRelay
) -> None:
    await admin_js.delete_stream(STREAM)
    relay = make_relay(nats_server.url)
    with pytest.raises(StreamConfigError, match=r"does not exist.*`volfsm stream create --nats"):
        await relay.start()
    with pytest.raises(NotFoundError):
        await admin_js.stream_info(STREAM)  # the node created nothing


async def test_a_node_that_checks_names_every_setting_that_is_wrong(
    nats_server: NatsServer, admin_js: JetStreamContext, make_relay: MakeRelay
) -> None:
    cfg = (await admin_js.stream_info(STREAM)).config
    await admin_js.update_stream(
        dataclasses.replace(cfg, allow_direct=False, duplicate_window=10.0)
    )
    with pytest.raises(StreamConfigError) as caught:
        await make_relay(nats_server.url).start()
    text = str(caught.value)
    assert "direct gets are off" in text
    assert "duplicate window is 10s, shorter than this node's 120s" in text
    assert "volfsm stream create" in text
    after = (await admin_js.stream_info(STREAM)).config
    assert (after.allow_direct, after.duplicate_window) == (False, 10.0)  # the node changed nothing


async def test_a_node_in_create_mode_without_the_right_is_told_to_check(
    nats_server: NatsServer, admin_js: JetStreamContext, make_relay: MakeRelay
) -> None:
    """The server denies the create: the relay says so at once, not after a timeout."""
    await admin_js.delete_stream(STREAM)
    relay = make_relay(nats_server.url, manage_stream=True, publish_timeout_s=60)
    with pytest.raises(StreamConfigError, match="denied creating or updating stream VOLFSM") as err:
        await relay.start()
    assert "--stream-setup check" in str(err.value)
    assert "$js.api.stream.create.volfsm" in str(err.value)


async def test_an_old_stream_without_direct_gets_is_fixed_by_a_managing_relay(
    make_server: MakeServer, event_log: EventLog, make_relay: MakeRelay
) -> None:
    """A stream made by an older volfsm (no allow_direct) and the old `$JS.API.>` permission."""
    server = make_server("nats-open")
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await ensure_event_stream(js, STREAM, replicas=1, duplicate_window_s=120)
        cfg = (await js.stream_info(STREAM)).config
        await js.update_stream(dataclasses.replace(cfg, allow_direct=False))
        relay = make_relay(server.url, manage_stream=True, user=None, password=None)
        await relay.start()
        assert (await js.stream_info(STREAM)).config.allow_direct is True
        await append_events(event_log, 20, relay=relay)
        await assert_stream_matches_log(relay, event_log, server.url)
    finally:
        await nc.close()


async def test_a_node_that_checks_waits_for_a_deleted_stream_then_refills_it(
    nats_server: NatsServer, admin_js: JetStreamContext, event_log: EventLog, make_relay: MakeRelay
) -> None:
    """It may not recreate the stream: it says why while it waits for the admin, then the log
    (the source of truth) goes out again, in order, once each."""
    relay = make_relay(nats_server.url, publish_timeout_s=1.0)
    await relay.start()
    await append_events(event_log, 50, relay=relay)
    assert await relay.flush(30)
    await admin_js.delete_stream(STREAM)
    await append_events(event_log, 20, relay=relay)
    await wait_until(
        lambda: "does not exist" in (relay.last_error or ""), what="the relay saying why it waits"
    )
    with pytest.raises(NotFoundError):
        await admin_js.stream_info(STREAM)
    await create_stream(nats_server.url)
    await assert_stream_matches_log(relay, event_log, nats_server.url)
    assert relay.counters.rewinds == 1

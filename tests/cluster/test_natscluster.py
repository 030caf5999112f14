"""`volfsm.bus.cluster.NatsCluster`: three clustered JetStream servers, one killed and back."""

from __future__ import annotations

import asyncio

import nats
import nats.errors
import pytest

from tests.cluster.conftest import Setup
from volfsm.bus import ensure_event_stream
from volfsm.bus.cluster import NatsClusterError

STREAM = "VOLFSM"


async def test_members_r3_stream_leader_crash_and_restart(setup: Setup) -> None:
    cluster = setup.cluster
    # The members: distinct names, ports and store dirs under the cluster's base dir
    assert len(set(cluster.names)) == len(set(cluster.urls)) == 3
    assert cluster.url == ",".join(cluster.urls)
    for m in cluster.members:
        assert m.server.store_dir == cluster.base_dir / m.name
        assert m.healthy()
    with pytest.raises(NatsClusterError, match="no server named"):
        cluster.member("nope")

    nc = await nats.connect(servers=cluster.urls, max_reconnect_attempts=-1)
    try:
        js = nc.jetstream()
        await ensure_event_stream(js, STREAM, replicas=3, duplicate_window_s=120.0)
        for i in range(10):
            await js.publish(f"volfsm.n1.events.E{i}", b"{}")
        leader = await cluster.stream_leader(js, STREAM)
        assert leader in cluster.names

        # Act: the leader crashes; another member takes over; the crashed one comes back
        cluster.kill(leader)
        assert not cluster.member(leader).running
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        new = None
        while new in (None, leader):
            assert loop.time() < deadline, "no new stream leader"
            await asyncio.sleep(0.2)
            try:
                new = await cluster.stream_leader(js, STREAM)
            except (nats.errors.Error, TimeoutError):
                new = None
        await js.publish("volfsm.n1.events.E10", b"{}")  # accepted without the old leader
        # (started from this thread: a member dies with the thread that started it)
        cluster.restart(leader)  # waits until it is healthy, i.e. caught up
        assert cluster.member(leader).healthy()

        # Assert: the restarted member holds every message, read from it alone
        alone = await nats.connect(cluster.member(leader).url)
        try:
            info = await alone.jetstream().stream_info(STREAM)
        finally:
            await alone.close()
        assert info.state.messages == 11
        assert info.cluster is not None
        peers = [info.cluster.leader, *(r.name for r in info.cluster.replicas or [])]
        assert sorted(str(p) for p in peers) == sorted(cluster.names)
    finally:
        await nc.close()

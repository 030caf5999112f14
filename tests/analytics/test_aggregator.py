"""The aggregator against a real nats-server: exactly once, redelivery, gaps, lag, start by time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from events.subjects import events_subject
from events.types import Envelope
from projections.analytics import GapFigure, report_of
from tests.analytics.feed import report_from, without_publish_lag
from tests.analytics.sim import STREAM, T0, SimNode, interleave, mixed_workload, publish
from volfsm.analytics.aggregator import Aggregator, AggregatorConfig, StartFrom
from volfsm.analytics.store import AnalyticsStore
from volfsm.bus import NatsServer

NOW = T0 + 10**12  # far after every simulated event


def three_nodes(pods: int = 60) -> list[list[Envelope]]:
    nodes = []
    for i, name in enumerate(("node-a", "node-b", "node-c")):
        sim = SimNode(name)
        mixed_workload(sim, pods=pods, seed=10 + i)
        nodes.append(sim.envs)
    return nodes


async def ingest(js: JetStreamContext, db: Path, **config: object) -> AnalyticsStore:
    """Run an aggregator until the stream is drained; returns its (open) store."""
    store = AnalyticsStore(db)
    agg = Aggregator(store, js, AggregatorConfig(fetch_timeout_s=0.5, **config))  # type: ignore[arg-type]
    await agg.run_until_idle()
    return store


def assert_exact(db: Path, nodes: list[list[Envelope]]) -> None:
    """The store holds each published event once: per-node counts and the whole report."""
    with AnalyticsStore(db, read_only=True) as store:
        assert {n.node: n.events for n in store.nodes()} == {e[0].node: len(e) for e in nodes}
        assert store.count("events") == sum(len(e) for e in nodes)
        assert store.gaps() == []
        assert store.gap_log() == []
    expected = report_of(interleave(nodes), now_us=NOW)
    assert without_publish_lag(report_from(db, NOW)) == without_publish_lag(expected)


async def test_counts_equal_the_published_sums_of_three_nodes(
    js: JetStreamContext, tmp_path: Path
) -> None:
    nodes = three_nodes()
    envs = interleave(nodes)
    half = len(envs) // 2
    await publish(js, envs[:half])
    store = await ingest(js, tmp_path / "a.db", batch=300)
    await publish(js, envs[half:])  # more arrive while the same durable resumes
    store.close()
    store = await ingest(js, tmp_path / "a.db", batch=300)
    counters = store.counters()
    store.close()
    assert (counters.applied, counters.duplicates, counters.undecodable) == (len(envs), 0, 0)
    assert counters.stream == STREAM and counters.stream_seq == len(envs)
    assert_exact(tmp_path / "a.db", nodes)


class AckNever(Aggregator):
    """Commits batches but never acknowledges them (hangs where the ack would be)."""

    async def _ack(self, last: Msg) -> None:
        await asyncio.Event().wait()


async def test_a_killed_task_that_never_acked_is_redelivered_and_not_counted_twice(
    js: JetStreamContext, tmp_path: Path
) -> None:
    nodes = three_nodes()
    await publish(js, interleave(nodes))
    db = tmp_path / "a.db"
    first = AnalyticsStore(db)
    config = AggregatorConfig(batch=500, fetch_timeout_s=0.5, commit_events=500)
    agg = AckNever(first, js, config)
    task = asyncio.create_task(agg.run())
    for _ in range(1000):
        if agg.stats.batches:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    # committed, never acked: the first batch, and the next if it was fetched in the meantime
    committed = first.count("events")
    assert committed == 500 * agg.stats.batches and agg.stats.batches in (1, 2)
    first.close()
    info = await js.consumer_info(STREAM, "volfsm-analytics")
    assert info.num_ack_pending == committed and (info.ack_floor.stream_seq or 0) == 0

    store = await ingest(js, db, batch=500)  # the same durable, a new aggregator
    assert store.counters().duplicates == committed
    store.close()
    assert_exact(db, nodes)


async def test_a_gap_in_one_nodes_seq_is_reported_and_no_other_gaps(
    js: JetStreamContext, tmp_path: Path
) -> None:
    nodes = three_nodes(pods=10)
    a = nodes[0]
    missing = [e for e in a if 11 <= e.seq <= 13]
    await publish(js, interleave([[e for e in a if e not in missing], nodes[1], nodes[2]]))
    db = tmp_path / "a.db"
    store = await ingest(js, db, batch=50)
    assert store.gaps() == [GapFigure("node-a", 11, 13, 3)]
    [(node, lo, hi, _noticed)] = store.gap_log()
    assert (node, lo, hi) == ("node-a", 11, 13)
    store.close()
    report = report_from(db, NOW)
    assert [(n.node, n.gaps, n.missing_events) for n in report.nodes] == [
        ("node-a", 1, 3),
        ("node-b", 0, 0),
        ("node-c", 0, 0),
    ]
    assert report.gaps == [GapFigure("node-a", 11, 13, 3)]

    await publish(js, missing)  # the node republishes what was lost
    store = await ingest(js, db, batch=50)
    assert store.gaps() == []
    assert len(store.gap_log()) == 1  # noticed once, kept as history
    assert {n.node: n.events for n in store.nodes()} == {e[0].node: len(e) for e in nodes}
    store.close()


async def test_a_node_whose_events_stop_arriving_shows_as_lagging(
    js: JetStreamContext, tmp_path: Path
) -> None:
    sims = {name: SimNode(name) for name in ("node-a", "node-b", "node-c")}
    for t in range(0, 1001, 10):
        for name, sim in sims.items():
            if name != "node-c" or t <= 100:  # node-c goes quiet after t100
                mixed_workload_step(sim, t)
    await publish(js, interleave([s.envs for s in sims.values()]))
    db = tmp_path / "a.db"
    (await ingest(js, db)).close()

    def lagging(now_s: float) -> dict[str, bool]:
        report = report_from(db, T0 + round(now_s * 1e6), lag_threshold_s=60.0)
        return {n.node: n.lagging for n in report.nodes}

    assert lagging(1010) == {"node-a": False, "node-b": False, "node-c": True}
    assert lagging(150) == {"node-a": False, "node-b": False, "node-c": False}

    sent = len(sims["node-c"].envs)
    mixed_workload_step(sims["node-c"], 1005)  # node-c speaks again
    await publish(js, sims["node-c"].envs[sent:])
    (await ingest(js, db)).close()
    assert lagging(1010) == {"node-a": False, "node-b": False, "node-c": False}


def mixed_workload_step(sim: SimNode, t: float) -> None:
    """A few events at time t."""
    sim.now_us = max(sim.now_us, T0 + round(t * 1e6))
    sub = SimNode(sim.name, now_us=sim.now_us)
    mixed_workload(sub, pods=1, seed=int(t))
    for env in sub.envs[:3]:
        sim.emit(env.stream, env.body)


async def test_start_from_a_time_takes_what_was_stored_since(
    js: JetStreamContext, tmp_path: Path
) -> None:
    nodes = three_nodes(pods=10)
    envs = interleave(nodes)
    await publish(js, envs[:200])
    await publish(js, envs[200:])
    first_late = await js.get_msg(STREAM, 201)
    start_us = int(first_late.time.timestamp() * 1e6)  # type: ignore[union-attr]
    store = await ingest(js, tmp_path / "a.db", start=StartFrom.TIME, start_time_us=start_us)
    assert store.count("events") == len(envs) - 200
    assert store.gaps() == []  # each node's first event sets where it starts
    store.close()


async def test_an_undecodable_message_is_kept_counted_and_leaves_no_gap(
    js: JetStreamContext, tmp_path: Path
) -> None:
    sim = SimNode("node-a")
    mixed_workload(sim, pods=2, seed=1)
    envs = sim.envs[:10]
    await publish(js, envs[:4])
    await js.publish(
        events_subject("node-a", "VolumeTeleported"),
        b'{"seq": 5, "type": "VolumeTeleported"}',
        headers={"Nats-Msg-Id": "node-a:5"},
    )
    await publish(js, envs[5:])
    store = await ingest(js, tmp_path / "a.db")
    counters = store.counters()
    assert (counters.applied, counters.undecodable) == (9, 1)
    assert store.gaps() == []
    assert [r.msg_id for r in store.rejects()] == ["node-a:5"]
    store.close()


async def test_a_nats_server_restart_mid_ingest_stays_exact(
    js: JetStreamContext, nats_server: NatsServer, tmp_path: Path
) -> None:
    nodes = three_nodes(pods=150)
    envs = interleave(nodes)
    half = len(envs) // 2
    await publish(js, envs[:half])
    db = tmp_path / "a.db"
    store = AnalyticsStore(db)
    agg = Aggregator(store, js, AggregatorConfig(batch=100, fetch_timeout_s=0.5, commit_events=100))
    stop = asyncio.Event()
    task = asyncio.create_task(agg.run(stop, retry_s=0.2))
    try:
        for _ in range(3000):
            if agg.stats.applied >= 500:
                break
            await asyncio.sleep(0.01)
        assert 500 <= agg.stats.applied < half, "not mid-ingest"
        await asyncio.to_thread(nats_server.restart)
        for _ in range(3000):  # the test's own client reconnects too
            try:
                await publish(js, envs[half:])
                break
            except (nats.errors.Error, OSError):
                await asyncio.sleep(0.05)
        for _ in range(6000):
            if agg.stats.applied >= len(envs):
                break
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)
        store.close()
    assert_exact(db, nodes)


async def test_where_a_run_starts(js: JetStreamContext, tmp_path: Path) -> None:
    nodes = three_nodes(pods=10)
    envs = interleave(nodes)
    total = len(envs)
    await publish(js, envs)
    db = tmp_path / "a.db"
    (await ingest(js, db)).close()

    # From the start again on the same store: every event is recognised, none counted twice.
    store = await ingest(js, db, start=StartFrom.BEGINNING)
    assert store.counters().duplicates == total
    store.close()
    assert_exact(db, nodes)

    # The durable is deleted: the store's own position says where to go on.
    await js.delete_consumer(STREAM, "volfsm-analytics")
    store = await ingest(js, db)
    assert store.counters().duplicates == total  # nothing new was redelivered
    store.close()
    info = await js.consumer_info(STREAM, "volfsm-analytics")
    assert info.config.opt_start_seq == total + 1

    # A new, empty store with the used durable: it starts over and gets everything.
    store = await ingest(js, tmp_path / "new.db")
    assert (store.count("events"), store.counters().duplicates) == (total, 0)
    store.close()
    assert_exact(tmp_path / "new.db", nodes)

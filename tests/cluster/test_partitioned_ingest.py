"""Three aggregators share a partitioned R3 stream on a 3-server cluster; one is SIGKILLed
mid-ingest and restarted; together their rows are exactly the nodes' logs.

The stream gets the partition transform (`volfsm analytics partition`), node
logs are generated and published as relays publish them (real nodes would
add nothing here but minutes), and each aggregator (`volfsm analytics serve
--partition P --partitions 3`, its own process and durable) writes its
partition's catalog and Parquet files into one store directory.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import msgspec
import nats
from typer.testing import CliRunner

from events.types import Envelope
from projections.analytics import ROW_COLUMNS, MemoryFacts, flatten, report_of
from tests.analytics.feed import report_from, without_publish_lag
from tests.analytics.sim import SimNode, interleave, mixed_workload, publish
from tests.cluster.conftest import Setup
from tests.cluster.harness import AggregatorProcess, wait_for
from volfsm.analytics.cli import app as analytics_app
from volfsm.analytics.partition import node_partition
from volfsm.analytics.store import AnalyticsStore, StoreError
from volfsm.bus import ensure_event_stream

STREAM = "VOLFSM"
PARTITIONS = 3
NODES = ("n-amber", "n-birch", "n-cedar", "n-delta", "n-ember", "n-fjord")


def node_logs() -> dict[str, list[Envelope]]:
    """Each node's log, as its relay would publish it."""
    logs = {}
    for i, name in enumerate(NODES):
        sim = SimNode(name)
        mixed_workload(sim, pods=120, seed=70 + i)
        logs[name] = sim.envs
    return logs


def stored(root: Path, partition: int | None = None) -> int:
    """Events committed in the store (of one partition), 0 before it exists."""
    try:
        with AnalyticsStore(root, read_only=True) as store:
            nodes = store.nodes()
    except StoreError:
        return 0
    return sum(
        n.events
        for n in nodes
        if partition is None or node_partition(n.node, PARTITIONS) == partition
    )


async def test_three_partition_aggregators_one_killed_union_is_every_log_exactly(
    setup: Setup,
) -> None:
    cluster = setup.cluster
    logs = node_logs()
    by_partition = Counter(node_partition(n, PARTITIONS) for n in NODES)
    assert sorted(by_partition) == [0, 1, 2]  # every partition owns nodes
    nc = await nats.connect(cluster.urls)
    try:
        js = nc.jetstream(publish_async_max_pending=4000)
        await ensure_event_stream(js, STREAM, replicas=3, duplicate_window_s=120.0)
        result = await asyncio.to_thread(
            CliRunner().invoke,
            analytics_app,
            ["partition", "--nats", cluster.url, "--partitions", str(PARTITIONS)],
        )
        assert result.exit_code == 0, result.output
        root = setup.base / "analytics"
        aggs = []
        for p in range(PARTITIONS):
            log = setup.base / f"aggregator-{p}.log"
            extra = ("--batch", "20", "--partition", str(p), "--partitions", str(PARTITIONS))
            agg = AggregatorProcess(root, log, cluster.url, *extra)
            setup.aggregators.append(agg)
            agg.start()
            aggs.append(agg)
        envs = interleave(list(logs.values()))
        half = len(envs) // 2
        await publish(js, envs[:half])

        # partition 0's aggregator is SIGKILLed while it ingests; more events come meanwhile
        victim = aggs[0]
        part0 = sum(len(logs[n]) for n in NODES if node_partition(n, PARTITIONS) == 0)
        await wait_for(
            "partition 0's first commits", lambda: stored(root, 0) >= 200, 90, victim.tail
        )
        victim.kill()
        at_kill = stored(root, 0)
        assert 200 <= at_kill < part0, f"killed at {at_kill} of {part0}: not mid-ingest"
        await publish(js, envs[half:])
        victim.start()
        await wait_for("every event", lambda: stored(root) == len(envs), 120, victim.tail)
        for agg in aggs:
            assert agg.stop() == 0, agg.tail()
        for p in range(PARTITIONS):
            info = await js.consumer_info(STREAM, f"volfsm-analytics-p{p}")
            assert info.config.filter_subject == f"volfsm.*.events.{p}.>"
            assert info.num_ack_pending == 0
    finally:
        await nc.close()

    # each partition holds its own nodes' rows, and together every log's rows exactly once
    facts = MemoryFacts()  # rows as stored: folded (an op's end takes its start's driver)
    for env in envs:
        facts.apply(flatten(env))
    expected_rows = sorted(msgspec.structs.astuple(r) for r in facts.rows)
    union: list[tuple[object, ...]] = []
    with AnalyticsStore(root, read_only=True) as whole:
        assert whole.snapshot().partitions == [0, 1, 2]
    for p in range(PARTITIONS):
        owned = {n for n in NODES if node_partition(n, PARTITIONS) == p}
        rows = partition_rows(root, p)
        assert {r[0] for r in rows} == owned
        union.extend(rows)
    assert sorted(union) == expected_rows
    with AnalyticsStore(root, read_only=True) as store:
        assert store.gaps() == [] and store.gap_log() == []
        counters = store.counters()
    assert (counters.applied, counters.undecodable) == (len(envs), 0)
    assert counters.duplicates >= 0
    now = max(e.ts for e in envs) + 1_000_000
    assert without_publish_lag(report_from(root, now)) == without_publish_lag(
        report_of(envs, now_us=now)
    )


def partition_rows(root: Path, partition: int) -> list[tuple[object, ...]]:
    """The event rows partition `partition`'s aggregator wrote."""
    with AnalyticsStore(root, read_only=True, only=partition) as store:
        rows = [tuple(r) for chunk in store.iter_events() for r in chunk]
    assert len(rows[0]) == len(ROW_COLUMNS)
    return rows

"""Benchmark of the analytics aggregator and store: JetStream -> store, exactly once, and reports.

Run `python bench/analytics.py` (a short run), or `--scale` for a small fleet
(5,000,000 events of 1,000 nodes, a 50,000,000-event store for the big
report, the page cache dropped for the cold one; heavy: about an hour on two
cores). It starts its own nats-server on a loopback port; files go to a
temporary directory removed at the end. It prints one human line per figure
and, last, one JSON object.

What is measured (ev/s = events per second), each against the bare consumer
and the previous (SQLite, schema 1) store in the same run:

* The stream holds `--events` events of `--nodes` simulated nodes (each
  node's mixed workload in seq order, round-robin), published as relays
  publish them. The stream carries the partition transform for two
  partitions (an unpartitioned consumer still reads all of it).
* bare_consume_ev_s: a plain nats-py pull consumer (AckPolicy.NONE) fetching
  the whole stream in batches of `--batch`, doing nothing (best of two).
  bare_fetch_ev_s: the same consumer fetching as the aggregator does
  (`volfsm.analytics.fetch`, no task per message); ingest_ratio_same_fetch
  compares the aggregator with it.
* single_ingest_ev_s (= ingest_ev_s): one aggregator process (its own
  durable, AckPolicy.ALL, ack after commit) into a new Parquet store, from
  its first fetch until every event is committed. ingest_ratio =
  ingest_ev_s / bare_consume_ev_s (target >= 0.7).
* sqlite_ingest_ev_s: the same into the previous SQLite store.
* partitioned_ingest_ev_s: two aggregator processes, partitions 0 and 1 of
  2, into one store directory, from the first fetch of either to the last
  commit of both (target >= 1.3 x single_ingest_ev_s on two cores).
* report_ms_warm: the full report of the new store (median of 3 after one
  warm-up; target <= 500); report_ms_cold: the same in a fresh process
  after dropping the page cache where allowed (target <= 2,000);
  sqlite_report_ms_warm: the SQLite store's report of the same data.
* report_ms_50m_warm: the full report of a `--big-events` store made by
  tiling the new store's files (shifted by whole days, seqs continued),
  written through the store's own compaction, without JetStream (target
  <= 1,000 at 50,000,000), as of a minute after its last event.
  `--big-store DIR` keeps that store in DIR (and reuses it when DIR holds
  one); `--big-only --big-store DIR` measures only its report.
* store_bytes_per_event: the new store's size (catalog, the Parquet files
  it lists and their sidecars) / events, after the aggregator's last compaction (target <= 60),
  beside the SQLite file's.
Every store is checked exact (events, no gap) and both reports equal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402
import nats  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from nats.js import JetStreamContext  # noqa: E402
from nats.js.api import AckPolicy, ConsumerConfig  # noqa: E402
from workdir import scratch_dir  # noqa: E402

from events.types import Envelope  # noqa: E402
from projections.analytics import build_report  # noqa: E402
from tests.analytics.sim import STREAM, SimNode, mixed_workload, publish  # noqa: E402
from volfsm.analytics.aggregator import Aggregator, AggregatorConfig  # noqa: E402
from volfsm.analytics.columns import TABLES  # noqa: E402
from volfsm.analytics.defaults import partition_subjects  # noqa: E402
from volfsm.analytics.fetch import fetch  # noqa: E402
from volfsm.analytics.legacy import SQLiteStore  # noqa: E402
from volfsm.analytics.partition import node_partition, set_stream_partitions  # noqa: E402
from volfsm.analytics.report import ReportOptions, store_report  # noqa: E402
from volfsm.analytics.sortedruns import sidecar_of  # noqa: E402
from volfsm.analytics.store import AnalyticsStore, StoreState, encode_store_state  # noqa: E402
from volfsm.bus import NatsServer, ensure_event_stream  # noqa: E402

PARTITIONS = 2
DAY_US = 86_400_000_000


# --------------------------------------------------------------------------
# Events


def node_counts(events: int, nodes: int) -> dict[str, int]:
    """Events per node: equal shares, the first ones one more."""
    return {
        f"node-{i:04d}": events // nodes + (1 if i < events % nodes else 0) for i in range(nodes)
    }


def node_history(name: str, count: int, seed: int) -> Iterator[Envelope]:
    """`count` events of one node's mixed workload, made as they are taken."""
    sim = SimNode(name)
    made = round_ = 0
    while made < count:
        mixed_workload(sim, pods=50, seed=seed * 100_000 + round_)
        round_ += 1
        yield from sim.envs[: count - made]
        made += min(len(sim.envs), count - made)
        sim.envs.clear()


def fleet_events(counts: dict[str, int]) -> Iterator[Envelope]:
    """Every node's events, round-robin (each node's in seq order)."""
    streams = [node_history(name, n, i) for i, (name, n) in enumerate(counts.items())]
    while streams:
        alive = []
        for it in streams:
            env = next(it, None)
            if env is not None:
                yield env
                alive.append(it)
        streams = alive


# --------------------------------------------------------------------------
# Consumers


async def bare_consume(
    js: JetStreamContext, total: int, batch: int, name: str, *, ours: bool = False
) -> float:
    """Seconds a plain pull consumer takes to fetch `total` messages (nats-py's fetch, or with
    `ours` the aggregator's)."""
    config = ConsumerConfig(ack_policy=AckPolicy.NONE, max_ack_pending=-1)
    sub = await js.pull_subscribe("volfsm.*.events.>", durable=name, stream=STREAM, config=config)
    got = 0
    start = time.perf_counter()
    while got < total:
        msgs = await fetch(sub, batch, 5.0) if ours else await sub.fetch(batch, timeout=5)
        got += len(msgs)
    elapsed = time.perf_counter() - start
    await sub.unsubscribe()
    return elapsed


def ingest_worker(
    url: str,
    db: str,
    kind: str,
    partition: int | None,
    expected: int,
    batch: int,
    durable: str,
    barrier: Any,
    results: Any,
) -> None:
    """One aggregator process: ingest until `expected` events are committed; put its times."""
    asyncio.run(_ingest(url, Path(db), kind, partition, expected, batch, durable, barrier, results))


async def _ingest(
    url: str,
    db: Path,
    kind: str,
    partition: int | None,
    expected: int,
    batch: int,
    durable: str,
    barrier: Any,
    results: Any,
) -> None:
    nc = await nats.connect(url)
    store: Any
    if kind == "sqlite":
        store = SQLiteStore(db)
    else:
        store = AnalyticsStore(
            db, partition=partition or 0, partitions=PARTITIONS if partition is not None else 1
        )
    config = AggregatorConfig(
        durable=durable,
        stream=STREAM,
        subjects=partition_subjects(partition),
        batch=batch,
        partition=partition,
        partitions=PARTITIONS if partition is not None else 1,
    )
    agg = Aggregator(store, nc.jetstream(), config)
    await agg.prepare()
    await asyncio.to_thread(barrier.wait)
    start = time.monotonic()
    while agg.stats.applied < expected:
        await agg.poll()
    await agg.flush()
    end = time.monotonic()
    if kind != "sqlite":
        store.compact()  # what a clean shutdown leaves (not timed)
    store.close()
    await nc.close()
    results.put((start, end, agg.stats.applied, agg.stats.duplicates))


def run_ingest(
    url: str, db: Path, kind: str, parts: list[tuple[int | None, int]], batch: int, tag: str
) -> float:
    """Events per second of aggregator processes, one per (partition, expected events)."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(parts))
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=ingest_worker,
            args=(str(url), str(db), kind, p, n, batch, f"bench-{tag}-{p}", barrier, results),
        )
        for p, n in parts
    ]
    for proc in procs:
        proc.start()
    got = [results.get(timeout=7200) for _ in procs]
    for proc in procs:
        proc.join()
        assert proc.exitcode == 0, f"{tag}: an ingest worker failed"
    total = sum(n for _p, n in parts)
    assert sum(g[2] for g in got) == total and all(g[3] == 0 for g in got), got
    return float(total / (max(g[1] for g in got) - min(g[0] for g in got)))


# --------------------------------------------------------------------------
# Reports


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return (time.perf_counter() - start) * 1000, value


def warm_report_ms(db: Path, now_us: int) -> tuple[float, Any]:
    """Median ms of 3 full reports after a warm-up; and the report."""
    with AnalyticsStore(db, read_only=True) as store:
        store_report(store, now_us=now_us)
        runs = [timed(lambda: store_report(store, now_us=now_us)) for _ in range(3)]
    return statistics.median(ms for ms, _ in runs), runs[0][1]


def sqlite_report_ms(db: Path, now_us: int) -> tuple[float, Any]:
    """Median ms of 3 full reports of the SQLite store after a warm-up; and the report."""
    opts = ReportOptions()

    def report() -> Any:
        query = opts.query(now_us)
        return build_report(store.report_inputs(query), query)

    with SQLiteStore(db, read_only=True) as store:
        report()
        runs = [timed(report) for _ in range(3)]
    return statistics.median(ms for ms, _ in runs), runs[0][1]


_COLD = """
import sys, time
sys.path.insert(0, {root!r})
from volfsm.analytics.report import store_report
from volfsm.analytics.store import AnalyticsStore
start = time.perf_counter()
with AnalyticsStore({db!r}, read_only=True) as store:
    store_report(store, now_us={now})
print((time.perf_counter() - start) * 1000)
"""


def cold_report_ms(db: Path, now_us: int, drop: bool) -> tuple[float, str]:
    """A full report in a fresh process (store opened there), after dropping the page cache."""
    how = "fresh process"
    if drop:
        try:
            subprocess.run(["sync"], check=True)
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            how = "page cache dropped, fresh process"
        except OSError as exc:
            how = f"fresh process (page cache not dropped: {exc.strerror})"
    code = _COLD.format(root=str(ROOT), db=str(db), now=now_us)
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    return float(out.strip().splitlines()[-1]), how


def same_report(a: Any, b: Any) -> bool:
    da, db_ = msgspec.to_builtins(a), msgspec.to_builtins(b)
    for doc in (da, db_):
        for node in doc["nodes"]:
            node["publish_lag_s"] = 0.0
    return bool(da == db_)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def store_bytes(root: Path) -> int:
    """Bytes of a store: its catalogs, the files they list and their sidecars (not merged-away
    files still waiting out their grace period)."""
    with AnalyticsStore(root, read_only=True) as store:
        files = store.snapshot().files
    paths = [f.path for f in files] + [sidecar_of(f.path) for f in files]
    return dir_bytes(root / "_catalog") + sum(p.stat().st_size for p in paths if p.exists())


# --------------------------------------------------------------------------
# The big store


def _shift(table: pa.Table, name: str, shift_us: int, seq_add: pa.Array | None) -> pa.Table:
    for col in TABLES[name].schema.names:
        if col.endswith("_us") and col != "duration_us":
            table = table.set_column(
                table.schema.get_field_index(col), col, pc.add(table[col], shift_us)
            )
    if seq_add is not None:
        seq = pc.add(table["seq"], seq_add)
        table = table.set_column(table.schema.get_field_index("seq"), "seq", seq)
    return table


def tile_store(src: Path, dst: Path, copies: int) -> int:
    """A store of `copies` copies of `src`'s rows, each shifted by whole days, seqs continued."""
    with AnalyticsStore(src, read_only=True) as source:
        snap = source.snapshot()
    assert not snap.hot, "compact the source first"
    nodes = {n.node: n for n in snap.state.nodes}
    lo = min(n.first_us for n in nodes.values())
    hi = max(n.last_us for n in nodes.values())
    shift = (hi - lo) // DAY_US * DAY_US + DAY_US
    names = pa.array(sorted(nodes))
    counts = pa.array([nodes[n].events for n in names.to_pylist()], pa.int64())
    empty = encode_store_state(StoreState())
    with AnalyticsStore(dst, compact_rows=10**12) as store:
        for k in range(copies):
            for f in snap.files:
                table = pq.read_table(f.path, schema=TABLES[f.table].schema)
                add = None
                if f.table == "events":
                    add = pc.multiply(pc.take(counts, pc.index_in(table["node"], names)), k)
                store.commit_tables({f.table: _shift(table, f.table, k * shift, add)}, state=empty)
                store.compact()
        last = (copies - 1) * shift
        state = StoreState(
            ranges={
                n: [[s.first_seq, s.first_seq - 1 + s.events * copies]] for n, s in nodes.items()
            },
            open_ops=[_moved_op(o, last) for o in snap.state.open_ops],
            open_spans=[_moved_span(s, last) for s in snap.state.open_spans],
            pending_pods=snap.state.pending_pods,
            nodes=[_moved_node(s, copies, last) for s in nodes.values()],
        )
        store.commit_tables({}, state=encode_store_state(state))
        store.compact()
        return sum(n.events for n in state.nodes)


def _moved_op(op: Any, shift: int) -> Any:
    op.started_us += shift
    return op


def _moved_span(span: Any, shift: int) -> Any:
    span.from_us += shift
    return span


def _moved_node(stats: Any, copies: int, shift: int) -> Any:
    stats.events *= copies
    stats.last_seq = stats.first_seq - 1 + stats.events
    stats.last_us += shift
    return stats


# --------------------------------------------------------------------------


async def publish_all(url: str, counts: dict[str, int]) -> float:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(publish_async_max_pending=8000)
        await ensure_event_stream(js, STREAM, replicas=1, duplicate_window_s=120.0)
        await set_stream_partitions(js, STREAM, PARTITIONS)
        start = time.perf_counter()
        await publish(js, fleet_events(counts), window=4000)
        return time.perf_counter() - start
    finally:
        await nc.close()


async def bare_rounds(url: str, total: int, batch: int, tag: str, *, ours: bool = False) -> float:
    nc = await nats.connect(url)
    try:
        return await bare_consume(nc.jetstream(), total, batch, f"bench-bare-{tag}", ours=ours)
    finally:
        await nc.close()


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    counts = node_counts(args.events, args.nodes)
    total = sum(counts.values())
    by_part = [0] * PARTITIONS
    for name, n in counts.items():
        by_part[node_partition(name, PARTITIONS)] += n
    server = NatsServer(work / "nats").start()
    try:
        url = server.url
        publish_s = asyncio.run(publish_all(url, counts))
        print(f"published {total:,} events of {args.nodes} nodes: {total / publish_s:,.0f} ev/s")
        bare = [asyncio.run(bare_rounds(url, total, args.batch, "1"))]
        print(f"bare consume: {total / bare[-1]:,.0f} ev/s")
        new_db, old_db, part_db = work / "store", work / "sqlite.db", work / "partitioned"
        single = run_ingest(url, new_db, "parquet", [(None, total)], args.batch, "single")
        print(f"ingest, one aggregator, Parquet store: {single:,.0f} ev/s")
        sqlite_ev_s = 0.0
        if not args.skip_sqlite:
            sqlite_ev_s = run_ingest(url, old_db, "sqlite", [(None, total)], args.batch, "sqlite")
            print(f"ingest, one aggregator, SQLite store: {sqlite_ev_s:,.0f} ev/s")
        parts: list[tuple[int | None, int]] = [(p, by_part[p]) for p in range(PARTITIONS)]
        partitioned = run_ingest(url, part_db, "parquet", parts, args.batch, "part")
        print(f"ingest, two partitioned aggregators: {partitioned:,.0f} ev/s {by_part}")
        bare.append(asyncio.run(bare_rounds(url, total, args.batch, "2")))
        print(f"bare consume: {total / bare[-1]:,.0f} ev/s")
        fast = asyncio.run(bare_rounds(url, total, args.batch, "fast", ours=True))
        print(f"bare consume with the aggregator's fetch: {total / fast:,.0f} ev/s")
    finally:
        server.stop()
    shutil.rmtree(work / "nats", ignore_errors=True)

    with AnalyticsStore(new_db, read_only=True) as store:
        assert store.event_count() == total and not store.gaps()
        last_us = max(n.last_us for n in store.nodes())
    with AnalyticsStore(part_db, read_only=True) as store:
        assert store.event_count() == total and not store.gaps()
    now = last_us + 60_000_000
    report_ms, report = warm_report_ms(new_db, now)
    print(f"full report, Parquet store: {report_ms:.0f} ms warm")
    cold_ms, cold_how = cold_report_ms(new_db, now, args.drop_caches)
    print(f"full report, Parquet store: {cold_ms:.0f} ms cold ({cold_how})")
    sqlite_ms, equal = 0.0, None
    if not args.skip_sqlite:
        sqlite_ms, old_report = sqlite_report_ms(old_db, now)
        equal = same_report(report, old_report)
        print(f"full report, SQLite store: {sqlite_ms:.0f} ms warm (same figures: {equal})")
    new_bytes = store_bytes(new_db)
    sqlite_bytes = 0
    if not args.skip_sqlite:  # the .db with its WAL
        sqlite_bytes = sum(p.stat().st_size for p in work.glob("sqlite.db*"))

    big = args.big_store or work / "big"
    big_events, big_ms = big_report(big, new_db, max(1, round(args.big_events / total)))
    bare_ev_s = total / min(bare)
    return {
        "events": total,
        "nodes": args.nodes,
        "batch": args.batch,
        "publish_ev_s": round(total / publish_s),
        "bare_consume_ev_s": round(bare_ev_s),
        "ingest_ev_s": round(single),
        "ingest_ratio": round(single / bare_ev_s, 3),
        "bare_fetch_ev_s": round(total / fast),
        "ingest_ratio_same_fetch": round(single * fast / total, 3),
        "sqlite_ingest_ev_s": round(sqlite_ev_s),
        "sqlite_ingest_ratio": round(sqlite_ev_s / bare_ev_s, 3),
        "single_ingest_ev_s": round(single),
        "partitioned_ingest_ev_s": round(partitioned),
        "partitioned_gain": round(partitioned / single, 3),
        "report_ms_warm": round(report_ms, 1),
        "report_ms_cold": round(cold_ms, 1),
        "report_cold_how": cold_how,
        "sqlite_report_ms_warm": round(sqlite_ms, 1),
        "reports_equal": equal,
        "report_ms_50m_warm": round(big_ms, 1),
        "big_events": big_events,
        "store_bytes_per_event": round(new_bytes / total, 1),
        "sqlite_bytes_per_event": round(sqlite_bytes / total, 1),
        "big_store_bytes_per_event": round(store_bytes(big) / big_events, 1),
        "targets": {
            "ingest_ratio": ">= 0.7",
            "report_ms_warm": "<= 500",
            "report_ms_cold": "<= 2000",
            "report_ms_50m_warm": "<= 1000 (at 50,000,000 events)",
            "store_bytes_per_event": "<= 60",
            "partitioned_gain": ">= 1.3",
        },
    }


def big_report(big: Path, source: Path | None, copies: int) -> tuple[int, float]:
    """(events, warm report ms) of the big store at `big`: tiled from `source` first unless
    `big` already holds a store (one kept by an earlier `--big-store` run)."""
    if not (big / "_catalog").is_dir():
        if source is None:
            raise SystemExit(f"--big-only: {big} holds no store (make one with --big-store)")
        t = time.perf_counter()
        tile_store(source, big, copies)
        print(f"tiled store in {time.perf_counter() - t:.0f} s")
    with AnalyticsStore(big, read_only=True) as store:
        events = store.event_count()
        now = max(n.last_us for n in store.nodes()) + 60_000_000
    big_ms, _ = warm_report_ms(big, now)
    print(f"full report, {events:,} events: {big_ms:.0f} ms warm")
    return events, big_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--big-events", type=int, default=2_000_000)
    parser.add_argument(
        "--big-store",
        type=Path,
        help="keep the big (tiled) store in this directory; reuse it if it holds one",
    )
    parser.add_argument(
        "--big-only",
        action="store_true",
        help="only the big store's report (needs --big-store holding a store)",
    )
    parser.add_argument("--drop-caches", action="store_true", help="before the cold report")
    parser.add_argument("--skip-sqlite", action="store_true", help="no SQLite store run")
    parser.add_argument(
        "--scale",
        action="store_true",
        help="5,000,000 events of 1,000 nodes, a 50,000,000-event store, caches dropped",
    )
    args = parser.parse_args()
    if args.scale:
        args.events, args.nodes, args.big_events = 5_000_000, 1000, 50_000_000
        args.drop_caches = True
    if args.big_only:
        if args.big_store is None:
            raise SystemExit("--big-only needs --big-store DIR")
        events, big_ms = big_report(args.big_store, None, 1)
        print(json.dumps({"report_ms_50m_warm": round(big_ms, 1), "big_events": events}))
        return
    work = scratch_dir("volfsm-bench-analytics-")
    try:
        result = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

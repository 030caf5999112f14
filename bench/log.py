"""Benchmark of the durable event log: appends, replay, the eventsourcing peer, FSM models.

Run `python bench/log.py` (single process). It prints one human line per
figure and, last, one JSON object with every figure and the target ratios.
Files go to a temporary directory on the same disk as the project and are
removed at the end.

What is measured (ev/s = events per second):

* append_durable_single: one appender, each `append` of one event awaited
  (durable, synchronous=FULL) before the next; with p50/p99 latency.
* append_durable_group: 256 concurrent appenders (asyncio tasks on
  `append_async`; also 256 threads on `append`), one event per append, each
  on its own stream with its expected version: group commit at work.
* raw_sqlite_batch: plain sqlite3 inserting the same rows into the same table
  and indexes in 1000-row synchronous=FULL WAL transactions (the floor).
* replay: fold 1,000,000 logged events into `projections.asw.Asw` as a
  start does (`EventLog.scan_fold` + `Asw.fold_rows`); replay_envelopes:
  the same through `EventLog.replay` and `Asw.apply` (an `Envelope` per
  event, what offline projections use).
* raw_read_decode: plain SELECT of the same rows plus msgspec decode of the body.
  It and the replays are measured one after the other `--replay-pairs`
  times a round; replay_vs_raw_read is the median of those pairs' ratios
  (its range is in the JSON), so a ratio never compares two moments of a
  shared machine's load.
* peer_eventsourcing_save / _replay: the `eventsourcing` library on its SQLite
  recorder, one event per save, replay = read every event back and apply it
  to its aggregate.
* fsm_models_100k_s / fsm_model_bytes: 100,000 device models via
  `volfsm.fsm.DEVICE.new_model` (time, tracemalloc bytes each).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import shutil
import sqlite3
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402
from workdir import scratch_dir  # noqa: E402

from events.log import EventLog  # noqa: E402
from events.types import (  # noqa: E402
    Body,
    DeviceAttached,
    DeviceDetached,
    DeviceMounted,
    DeviceUnmounted,
    Event,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    VolumeMounted,
    VolumeUnmounted,
)
from projections.asw import Asw  # noqa: E402

RESULTS: dict[str, Any] = {}
REPLAY_RATIOS: list[tuple[float, float]] = []
"""(fold, envelope fold) / raw read+decode, each pair measured one after the other."""


def say(name: str, value: float, unit: str, note: str = "") -> None:
    """Record one figure (the best over the rounds so far) and print it as a human line."""
    value = round(value, 3)
    best = RESULTS.get(name)
    if best is None:
        RESULTS[name] = value
    elif name.endswith("_ev_s"):
        RESULTS[name] = max(best, value)
    else:  # times, latencies, sizes: lower is better
        RESULTS[name] = min(best, value)
    extra = f"  ({note})" if note else ""
    shown = f"{value:>14,.1f}" if abs(value) >= 100 else f"{value:>14,.3f}"
    print(f"{name:36s} {shown} {unit}{extra}", flush=True)


def bench_dir() -> Path:
    """A fresh temporary directory outside the checkout (see bench/workdir.py)."""
    return scratch_dir("volfsm-bench-")


# ------------------------------------------------------------------ workload


def lifecycle(i: int) -> list[tuple[str, Body]]:
    """One volume's realistic history: attach, stage, publish, a failed unpublish, teardown."""
    vid = f"pvc-{i:07d}"
    uid = f"pod-{i:07d}"
    dev = f"device/{vid}"
    pv = f"podvol/{uid}/data"
    staging = f"/var/lib/kubelet/plugins/kubernetes.io/csi/pv/{vid}/globalmount"
    target = f"/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/{vid}/mount"
    return [
        (dev, OperationStarted(op_id=f"{i}-a", operation="attach", volume_id=vid, plugin="csi")),
        (
            dev,
            DeviceAttached(volume_id=vid, plugin="csi", attachable=True, device_path="/dev/vdb"),
        ),
        (dev, OperationSucceeded(op_id=f"{i}-a", operation="attach", duration_s=0.012)),
        (dev, DeviceMounted(volume_id=vid, device_mount_path=staging, mount_found=True)),
        (pv, VolumeMounted(volume_id=vid, pod_uid=uid, volume_name="data", mount_path=target)),
        (
            pv,
            OperationFailed(
                op_id=f"{i}-u",
                operation="unmount",
                code="DeadlineExceeded",
                message="context deadline exceeded",
                final=False,
                backoff_s=0.5,
            ),
        ),
        (pv, VolumeUnmounted(volume_id=vid, pod_uid=uid, volume_name="data")),
        (dev, DeviceUnmounted(volume_id=vid)),
        (dev, DeviceDetached(volume_id=vid)),
    ]


def bodies_for_stream(n: int) -> Iterator[Body]:
    """An endless-enough sequence of realistic bodies for one appender's stream."""
    k = 0
    while True:
        for _, body in lifecycle(k):
            yield body
            n -= 1
            if n == 0:
                return
        k += 1


# ------------------------------------------------------------------ appends


def bench_single(tmp: Path, n: int) -> None:
    log = EventLog(tmp / "single.db", node="bench")
    bodies = list(bodies_for_stream(n))
    lat: list[float] = []
    t0 = time.perf_counter()
    for i, body in enumerate(bodies):
        s = time.perf_counter()
        log.append("device/single", i, [body])
        lat.append(time.perf_counter() - s)
    dt = time.perf_counter() - t0
    log.close()
    lat.sort()
    say("append_durable_single_ev_s", n / dt, "ev/s", f"{n} appends, 1 event each")
    say("append_durable_single_p50_ms", statistics.median(lat) * 1000, "ms")
    say("append_durable_single_p99_ms", lat[int(len(lat) * 0.99)] * 1000, "ms")


def bench_group_async(tmp: Path, appenders: int, per: int) -> Path:
    path = tmp / "group.db"
    log = EventLog(path, node="bench")

    async def appender(k: int) -> None:
        stream = f"device/g{k:04d}"
        append = log.append_async
        for v, body in enumerate(bodies_for_stream(per)):
            await append(stream, v, [body])

    async def main() -> None:
        await asyncio.gather(*(appender(k) for k in range(appenders)))

    t0 = time.perf_counter()
    asyncio.run(main())
    last = log.last_seq()
    log.close()  # timed too: close indexes the last unindexed events
    dt = time.perf_counter() - t0
    total = appenders * per
    assert last == total, (last, total)
    say(
        "append_durable_group_ev_s",
        total / dt,
        "ev/s",
        f"{appenders} asyncio appenders, {total} appends of 1 event",
    )
    return path


def bench_group_threads(tmp: Path, appenders: int, per: int) -> None:
    log = EventLog(tmp / "group_threads.db", node="bench")
    start = threading.Barrier(appenders + 1)

    def appender(k: int) -> None:
        stream = f"device/t{k:04d}"
        append = log.append
        start.wait()
        for v, body in enumerate(bodies_for_stream(per)):
            append(stream, v, [body])

    threads = [threading.Thread(target=appender, args=(k,)) for k in range(appenders)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    log.close()
    total = appenders * per
    say(
        "append_durable_group_threads_ev_s",
        total / dt,
        "ev/s",
        f"{appenders} threads, {total} appends of 1 event",
    )


_SELECT = "SELECT seq, stream, version, type, schema, ts, node, body FROM events ORDER BY seq"
_INSERT_EVENT = "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_INDEX = "INSERT INTO stream_index (stream, version, seq) VALUES (?, ?, ?)"


_SCHEMA_1_DDL = (
    "CREATE TABLE events (seq INTEGER PRIMARY KEY, stream TEXT NOT NULL, "
    "version INTEGER NOT NULL, type TEXT NOT NULL, schema INTEGER NOT NULL, "
    "ts INTEGER NOT NULL, node TEXT NOT NULL, body BLOB NOT NULL)",
    "CREATE UNIQUE INDEX idx_events_stream_version ON events (stream, version)",
    "CREATE INDEX idx_events_ts ON events (ts)",
)


def bench_raw_sqlite(tmp: Path, source: Path) -> None:
    """Plain sqlite3: the rows the group benchmark wrote, 1000 per synchronous=FULL commit.

    raw_sqlite_batch_ev_s: an empty volfsm log (the same tables and indexes);
    each transaction inserts 1000 events and their stream_index entries, the
    plain way to store the same data. Two more figures for context: the
    events table alone (no per-stream index at all: less work than the log
    does), and log schema 1's layout (a unique (stream, version) index on
    the events table itself, maintained inside every commit).
    """
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    rows = src.execute(_SELECT).fetchall()
    src.close()
    index_rows = [(r[1], r[2], r[0]) for r in rows]
    variants = (
        ("raw_sqlite_batch_ev_s", "events + stream_index", True),
        ("raw_sqlite_batch_events_only_ev_s", "events table only", False),
        ("raw_sqlite_batch_schema1_ev_s", "schema-1 layout, index on events", False),
    )
    for name, what, with_index in variants:
        path = tmp / f"{name}.db"
        if "schema1" in name:
            conn = sqlite3.connect(path, isolation_level=None)
            for ddl in _SCHEMA_1_DDL:
                conn.execute(ddl)
            conn.close()
        else:
            EventLog(path, node="bench").close()
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        t0 = time.perf_counter()
        for i in range(0, len(rows), 1000):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(_INSERT_EVENT, rows[i : i + 1000])
            if with_index:
                conn.executemany(_INSERT_INDEX, index_rows[i : i + 1000])
            conn.execute("COMMIT")
        dt = time.perf_counter() - t0
        conn.close()
        say(name, len(rows) / dt, "ev/s", f"{len(rows)} rows, 1000 per commit, {what}")


# ------------------------------------------------------------------- replay


def fill_log(path: Path, n: int) -> None:
    """Write `n` lifecycle events quickly: large multi-event appends from many tasks."""
    log = EventLog(path, node="bench")
    streams: dict[str, list[Body]] = {}
    written = 0
    i = 0
    pending: list[tuple[str, list[Body]]] = []
    while written < n:
        for stream, body in lifecycle(i):
            if written == n:
                break
            streams.setdefault(stream, []).append(body)
            written += 1
        i += 1
        if len(streams) >= 2048 or written == n:
            pending.extend(streams.items())
            streams = {}

    async def main() -> None:
        sem = asyncio.Semaphore(64)

        async def one(stream: str, bodies: list[Body]) -> None:
            async with sem:
                await log.append_async(stream, 0, bodies)

        await asyncio.gather(*(one(s, b) for s, b in pending))

    asyncio.run(main())
    assert log.last_seq() == n
    log.close()


def bench_replay(path: Path, n: int) -> tuple[float, float]:
    """The ASW fold of a start (stored rows, `Asw.fold_rows`), then the envelope fold (ev/s)."""
    log = EventLog(path, readonly=True)
    gc.collect()
    asw = Asw()
    t0 = time.perf_counter()
    with log.scan_fold() as rows:
        last, count = asw.fold_rows(rows)
    dt = time.perf_counter() - t0
    assert last == n == count and asw.last_seq == n, (last, count, asw.last_seq, n)
    fold_rate = n / dt
    say("replay_ev_s", fold_rate, "ev/s", f"{n} stored rows folded into the ASW (Asw.fold_rows)")
    gc.collect()
    envelopes = Asw()
    t0 = time.perf_counter()
    last = log.replay(envelopes.apply)
    dt = time.perf_counter() - t0
    assert last == n and envelopes.last_seq == n, (last, envelopes.last_seq, n)
    log.close()
    say("replay_envelopes_ev_s", n / dt, "ev/s", f"{n} envelopes (EventLog.replay + Asw.apply)")
    return fold_rate, n / dt


def bench_raw_read(path: Path, n: int) -> float:
    """The peer of the replays: every row read and every body decoded in full (ev/s)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    decode = msgspec.msgpack.Decoder(Event).decode
    gc.collect()
    t0 = time.perf_counter()
    count = 0
    for row in conn.execute(_SELECT):
        decode(row[7])
        count += 1
    dt = time.perf_counter() - t0
    conn.close()
    assert count == n
    say("raw_read_decode_ev_s", n / dt, "ev/s", "SELECT + msgspec decode of each body")
    return n / dt


# --------------------------------------------------------------------- peer


@functools.cache
def _peer_classes() -> tuple[Any, Any]:
    """The peer's aggregate and application classes (defined once: it registers topics)."""
    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate, event

    class Volume(Aggregate):
        @event("Registered")
        def __init__(self, stream: str) -> None:
            self.stream = stream
            self.last_type = ""
            self.count = 0

        @event("Recorded")
        def record(self, type_name: str, body: dict[str, Any]) -> None:
            self.last_type = type_name
            self.count += 1

    class Node(Application[Any]):
        pass

    return Volume, Node


def bench_peer(tmp: Path, n: int) -> None:
    """The eventsourcing library, SQLite recorder: one event per save; replay all."""
    os.environ["PERSISTENCE_MODULE"] = "eventsourcing.sqlite"
    os.environ["SQLITE_DBNAME"] = str(tmp / "eventsourcing.db")
    Volume, Node = _peer_classes()
    app = Node()
    work = [(s, b) for i in range(n // 9 + 1) for s, b in lifecycle(i)][:n]
    aggregates: dict[str, Any] = {}
    for stream, _ in work:  # created and saved up front, untimed: one event per timed save
        if stream not in aggregates:
            aggregates[stream] = agg = Volume(stream=stream)
            app.save(agg)
    creations = len(aggregates)
    t0 = time.perf_counter()
    for stream, body in work:
        agg = aggregates[stream]
        agg.record(type_name=type(body).__name__, body=msgspec.to_builtins(body))
        app.save(agg)
    dt = time.perf_counter() - t0
    say("peer_eventsourcing_save_ev_s", n / dt, "ev/s", f"{n} saves of one event each")

    gc.collect()
    t0 = time.perf_counter()
    rebuilt: dict[Any, Any] = {}
    count = 0
    start = 1
    to_domain = app.mapper.to_domain_event
    while True:
        page = app.recorder.select_notifications(start, 1000)
        if not page:
            break
        for note in page:
            ev = to_domain(note)
            rebuilt[ev.originator_id] = ev.mutate(rebuilt.get(ev.originator_id))
            count += 1
        start = page[-1].id + 1
    dt = time.perf_counter() - t0
    assert count == n + creations, (count, n, creations)
    say(
        "peer_eventsourcing_replay_ev_s",
        count / dt,
        "ev/s",
        f"{count} stored events read back and applied to {len(rebuilt)} aggregates",
    )
    app.close()


# ------------------------------------------------------------------- models


def bench_models(n: int) -> None:
    from volfsm.fsm import DEVICE

    streams = [f"device/pvc-{i:07d}" for i in range(n)]
    new_model = DEVICE.new_model
    gc.collect()
    t0 = time.perf_counter()
    models = [new_model(s) for s in streams]
    dt = time.perf_counter() - t0
    del models
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    models = [new_model(s) for s in streams]
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(models) == n
    say("fsm_models_100k_s", dt * 100_000 / n, "s", f"{n} DEVICE.new_model calls")
    say("fsm_model_bytes", (after - before) / n, "B", "per model, incl. its list slot")


# --------------------------------------------------------------------- main


def timed(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    t0 = time.perf_counter()
    out = fn(*args)
    print(f"  [{name} took {time.perf_counter() - t0:.1f} s]", flush=True)
    return out


def run_round(rdir: Path, replay_db: Path, args: argparse.Namespace) -> None:
    """One round of every measurement, its files in `rdir`."""
    rdir.mkdir()
    timed("single", bench_single, rdir, args.single_events)
    group_db = timed("group", bench_group_async, rdir, args.appenders, args.group_per_appender)
    timed("raw", bench_raw_sqlite, rdir, group_db)
    timed("threads", bench_group_threads, rdir, args.appenders, args.thread_per_appender)
    for _ in range(args.replay_pairs):  # each replay against the peer measured just before
        raw = timed("raw read", bench_raw_read, replay_db, args.replay_events)
        fold, envelopes = timed("replay", bench_replay, replay_db, args.replay_events)
        REPLAY_RATIOS.append((fold / raw, envelopes / raw))
    timed("peer", bench_peer, rdir, args.peer_events)
    timed("models", bench_models, 100_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replay-events", type=int, default=1_000_000)
    parser.add_argument("--single-events", type=int, default=3000)
    parser.add_argument("--group-per-appender", type=int, default=800)
    parser.add_argument("--thread-per-appender", type=int, default=200)
    parser.add_argument("--peer-events", type=int, default=10_000)
    parser.add_argument("--appenders", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2, help="report the best of N rounds")
    parser.add_argument(
        "--replay-pairs",
        type=int,
        default=3,
        help="raw read + replays measured N times a round; the replay ratios are their medians",
    )
    args = parser.parse_args()

    tmp = bench_dir()
    print(f"volfsm log benchmark; files in {tmp}; best of {args.rounds} rounds", flush=True)
    started = time.perf_counter()
    try:
        replay_db = tmp / "replay.db"
        timed("fill", fill_log, replay_db, args.replay_events)
        for k in range(args.rounds):
            print(f"-- round {k + 1}", flush=True)
            run_round(tmp / f"round{k + 1}", replay_db, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"-- best of {args.rounds} rounds", flush=True)
    for name, value in sorted(RESULTS.items()):
        print(f"{name:36s} {value:>14,.3f}", flush=True)

    r = RESULTS
    ratios = {
        "group_vs_raw": r["append_durable_group_ev_s"] / r["raw_sqlite_batch_ev_s"],
        "group_vs_peer_save": r["append_durable_group_ev_s"] / r["peer_eventsourcing_save_ev_s"],
        "replay_vs_raw_read": statistics.median(f for f, _ in REPLAY_RATIOS),
        "replay_vs_peer_replay": r["replay_ev_s"] / r["peer_eventsourcing_replay_ev_s"],
    }
    targets = {
        "group_vs_raw": 0.5,
        "group_vs_peer_save": 20.0,
        "replay_vs_raw_read": 0.6,
        "replay_vs_peer_replay": 20.0,
    }
    print()
    for key, value in ratios.items():
        ok = "ok" if value >= targets[key] else "MISSED"
        print(f"{key:36s} {value:>14.2f} x   (target >= {targets[key]}: {ok})")
        r[key] = round(value, 3)
    context = {
        "replay_envelopes_vs_raw_read": statistics.median(e for _, e in REPLAY_RATIOS),
        "group_vs_raw_events_only": (
            r["append_durable_group_ev_s"] / r["raw_sqlite_batch_events_only_ev_s"]
        ),
        "group_vs_raw_schema1": r["append_durable_group_ev_s"] / r["raw_sqlite_batch_schema1_ev_s"],
    }
    for key, value in context.items():
        print(f"{key:36s} {value:>14.2f} x   (context, no target)")
        r[key] = round(value, 3)
    for key, pick in (("replay_vs_raw_read", 0), ("replay_envelopes_vs_raw_read", 1)):
        each = sorted(round(pair[pick], 3) for pair in REPLAY_RATIOS)
        print(f"{key + ' (each)':36s} {' '.join(f'{x:.3f}' for x in each)}")
        r[f"{key}_range"] = [each[0], each[-1]]
    models_ok = r["fsm_models_100k_s"] < 2.0 and r["fsm_model_bytes"] < 2048
    print(f"{'fsm_models (< 2 s, < 2 KiB each)':36s} {'ok' if models_ok else 'MISSED':>14s}")
    r["targets_met"] = {
        **{k: ratios[k] >= v for k, v in targets.items()},
        "fsm_models": models_ok,
    }
    r["bench_seconds"] = round(time.perf_counter() - started, 1)
    r["cpus"] = os.cpu_count()
    print(json.dumps(r, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()

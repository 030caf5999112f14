"""Converting a store of an earlier volfsm (schema 1, one SQLite file) into a store directory.

The old file is opened read-only. Its rows (events, finished operations,
Uncertain spans, ready pods) are copied in chunks into the new store's
Parquet files; its applied ranges, open state, node counters, gaps,
rejected messages, redelivery count and stream position become the new
catalog's. Nothing is re-derived, so the new store reports what the old
one did and the aggregator goes on from the same stream position. The new
directory must be new or empty; if the copy is cut short, delete it and
run again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from projections.analytics import ROW_COLUMNS, OpenOp, PendingPod, UncertainSpan
from volfsm.analytics.columns import EVENTS, READY, SAMPLES, SPANS, Table
from volfsm.analytics.legacy import node_stats
from volfsm.analytics.store import (
    STORE_FORMAT,
    AnalyticsStore,
    Reject,
    StoreError,
    StoreState,
    catalog_paths,
    encode_store_state,
)

OLD_SCHEMA = 1
CHUNK = 200_000

_SAMPLE_SQL = (
    "SELECT node, op_id, operation, phase, driver, volume_id, started_us, ended_us, "
    "CAST(round(duration_s * 1000000) AS INTEGER), failed, code, final FROM op_samples"
)


@dataclass(slots=True)
class MigrationResult:
    """What was copied."""

    events: int
    samples: int
    spans: int
    ready: int
    nodes: int


def _open_old(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise StoreError(f"{path}: no such file")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path}: not an analytics store of an earlier volfsm ({exc})") from None
    if meta.get("format") != STORE_FORMAT or meta.get("schema") != str(OLD_SCHEMA):
        conn.close()
        raise StoreError(f"{path}: not an analytics store of schema {OLD_SCHEMA}")
    return conn


def _chunks(conn: sqlite3.Connection, sql: str, table: Table) -> Iterator[pa.Table]:
    cur = conn.execute(sql)
    while True:
        rows = cur.fetchmany(CHUNK)
        if not rows:
            return
        columns = list(zip(*rows, strict=True))
        arrays = []
        for values, f in zip(columns, table.schema, strict=True):
            data: Any = values
            if pa.types.is_boolean(f.type):
                data = [None if v is None else bool(v) for v in values]
            arrays.append(pa.array(data, type=f.type))
        yield pa.Table.from_arrays(arrays, schema=table.schema)


def _old_state(conn: sqlite3.Connection) -> StoreState:
    ranges: dict[str, list[list[int]]] = {}
    for node, lo, hi in conn.execute("SELECT node, lo, hi FROM applied ORDER BY node, lo"):
        ranges.setdefault(node, []).append([lo, hi])
    return StoreState(
        ranges=ranges,
        open_ops=[
            OpenOp(n, o, op, d, v, p, s, t, bool(staged))
            for n, o, op, d, v, p, s, t, staged in conn.execute("SELECT * FROM open_ops")
        ],
        open_spans=[
            UncertainSpan(n, s, k, v, p, f, None, bool(r))
            for n, s, k, v, p, f, r in conn.execute("SELECT * FROM uncertain_open")
        ],
        pending_pods=[
            PendingPod(n, p, t, set(w.split(",")) if w else set(), v)
            for n, p, t, w, v in conn.execute("SELECT * FROM pending_pods")
        ],
        nodes=[node_stats(r) for r in conn.execute("SELECT * FROM nodes ORDER BY node")],
    )


def migrate(old: Path, new: Path) -> MigrationResult:
    """Copy the store at `old` (schema 1) into a new store directory at `new`."""
    conn = _open_old(old)
    try:
        if new.exists() and (not new.is_dir() or any(new.iterdir()) or catalog_paths(new)):
            raise StoreError(f"{new}: not a new or empty directory")
        counts = {"events": 0, "samples": 0, "spans": 0, "ready": 0}
        empty = encode_store_state(StoreState())
        sources = (
            (EVENTS, f"SELECT {', '.join(ROW_COLUMNS)} FROM events ORDER BY node, seq"),
            (SAMPLES, _SAMPLE_SQL),
            (SPANS, "SELECT * FROM uncertain_spans"),
            (READY, "SELECT * FROM pod_ready"),
        )
        with AnalyticsStore(new) as store:
            for table, sql in sources:
                for chunk in _chunks(conn, sql, table):
                    store.commit_tables({table.name: chunk}, state=empty)
                    store.compact()
                    counts[table.name] += chunk.num_rows
            state = _old_state(conn)
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            stream, seq = meta.get("stream"), meta.get("stream_seq")
            store.commit_tables(
                {},
                state=encode_store_state(state),
                gaps=conn.execute("SELECT * FROM gap_log").fetchall(),
                rejects=[
                    Reject(*row)
                    for row in conn.execute(
                        "SELECT stream_seq, subject, msg_id, error, data FROM rejects"
                    )
                ],
                duplicates=int(meta.get("duplicates") or 0),
                position=(stream, int(seq)) if stream is not None and seq is not None else None,
            )
        return MigrationResult(**counts, nodes=len(state.nodes))
    finally:
        conn.close()

"""The analytics store of volfsm before schema 2: one SQLite file (kept to migrate and compare).

`volfsm analytics migrate` reads it; `bench/analytics.py` runs it beside
the Parquet store to measure both on the same data. Nothing else writes it.

One batch of events is one transaction: the event rows, the facts and open
state the fold derived from them, the applied seq ranges (the exactly-once
tracking), gaps noticed and counters are all written together, so a crash
either keeps the whole batch or none of it, and a redelivered event is
recognised by the ranges that were committed with its row. The events
table's primary key (node, seq) backs that up: applying an event twice
fails the transaction instead of double counting.

WAL with `synchronous=FULL`: the aggregator acks a batch to JetStream only
after its commit, so a committed batch must survive power loss. Reports read
through their own connections (`read_only=True`) while the aggregator writes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec

from projections.analytics import (
    ROW_COLUMNS,
    AnalyticsFold,
    FoldChanges,
    GapFigure,
    NodeStats,
    NodeWindow,
    OpenOp,
    OpSample,
    PendingPod,
    PodReady,
    ReportInputs,
    ReportQuery,
    UncertainSpan,
    distribution,
    failure_figures,
    in_window,
    op_groups,
    series_buckets,
    series_frame,
    uncertain_totals,
    whole_us,
)
from volfsm.analytics.store import Batch, IngestCounters, StoreError
from volfsm.analytics.tracking import SeqRanges

STORE_FORMAT = "volfsm-analytics"
STORE_SCHEMA = 1

_DDL = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    node TEXT NOT NULL, seq INTEGER NOT NULL, ts_us INTEGER NOT NULL, type TEXT NOT NULL,
    kind TEXT NOT NULL, stream TEXT NOT NULL, volume_id TEXT NOT NULL, pod_uid TEXT NOT NULL,
    volume_name TEXT NOT NULL, driver TEXT NOT NULL, operation TEXT NOT NULL,
    op_id TEXT NOT NULL, code TEXT NOT NULL, final INTEGER, duration_s REAL,
    reconstructed INTEGER NOT NULL, pod_volumes TEXT NOT NULL,
    PRIMARY KEY (node, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS applied (
    node TEXT NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL, PRIMARY KEY (node, lo)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gap_log (
    node TEXT NOT NULL, from_seq INTEGER NOT NULL, to_seq INTEGER NOT NULL,
    noticed_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS rejects (
    stream_seq INTEGER PRIMARY KEY, subject TEXT NOT NULL, msg_id TEXT NOT NULL,
    error TEXT NOT NULL, data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS op_samples (
    node TEXT NOT NULL, op_id TEXT NOT NULL, operation TEXT NOT NULL, phase TEXT NOT NULL,
    driver TEXT NOT NULL, volume_id TEXT NOT NULL, started_us INTEGER NOT NULL,
    ended_us INTEGER NOT NULL, duration_s REAL NOT NULL, failed INTEGER NOT NULL,
    code TEXT NOT NULL, final INTEGER
);
CREATE TABLE IF NOT EXISTS open_ops (
    node TEXT NOT NULL, op_id TEXT NOT NULL, operation TEXT NOT NULL, driver TEXT NOT NULL,
    volume_id TEXT NOT NULL, pod_uid TEXT NOT NULL, stream TEXT NOT NULL,
    started_us INTEGER NOT NULL, staged INTEGER NOT NULL, PRIMARY KEY (node, op_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS uncertain_spans (
    node TEXT NOT NULL, stream TEXT NOT NULL, kind TEXT NOT NULL, volume_id TEXT NOT NULL,
    pod_uid TEXT NOT NULL, from_us INTEGER NOT NULL, to_us INTEGER NOT NULL,
    reconstructed INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS uncertain_open (
    node TEXT NOT NULL, stream TEXT NOT NULL, kind TEXT NOT NULL, volume_id TEXT NOT NULL,
    pod_uid TEXT NOT NULL, from_us INTEGER NOT NULL, reconstructed INTEGER NOT NULL,
    PRIMARY KEY (node, stream)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pending_pods (
    node TEXT NOT NULL, pod_uid TEXT NOT NULL, added_us INTEGER NOT NULL,
    waiting TEXT NOT NULL, volumes INTEGER NOT NULL, PRIMARY KEY (node, pod_uid)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pod_ready (
    node TEXT NOT NULL, pod_uid TEXT NOT NULL, added_us INTEGER NOT NULL,
    ready_us INTEGER NOT NULL, volumes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    node TEXT PRIMARY KEY, events INTEGER NOT NULL, first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL, first_us INTEGER NOT NULL, last_us INTEGER NOT NULL,
    reconstructions INTEGER NOT NULL, restarts INTEGER NOT NULL,
    interrupted_ops INTEGER NOT NULL, last_reconstructed INTEGER NOT NULL,
    last_stream_us INTEGER NOT NULL, publish_lag_s REAL NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO meta (key, value) VALUES ('format', '{STORE_FORMAT}');
INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', '{STORE_SCHEMA}');
"""

_INSERT_EVENT = (
    f"INSERT INTO events ({', '.join(ROW_COLUMNS)}) VALUES ({', '.join('?' * len(ROW_COLUMNS))})"
)
_INSERT_SAMPLE = "INSERT INTO op_samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_SPAN = "INSERT INTO uncertain_spans VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_READY = "INSERT INTO pod_ready VALUES (?, ?, ?, ?, ?)"
_UPSERT_OP = "INSERT OR REPLACE INTO open_ops VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
_UPSERT_OPEN_SPAN = "INSERT OR REPLACE INTO uncertain_open VALUES (?, ?, ?, ?, ?, ?, ?)"
_UPSERT_POD = "INSERT OR REPLACE INTO pending_pods VALUES (?, ?, ?, ?, ?)"
_UPSERT_NODE = "INSERT OR REPLACE INTO nodes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


def _columns(cls: type, *, skip: tuple[str, ...] = ()) -> Callable[[Any], tuple[Any, ...]]:
    """A getter of a dataclass's fields, in declaration order (= the table's column order)."""
    return attrgetter(*(f.name for f in fields(cls) if f.name not in skip))


_sample_row = _columns(OpSample)
_span_row = _columns(UncertainSpan)
_open_span_row = _columns(UncertainSpan, skip=("to_us",))
_ready_row = _columns(PodReady)
_op_row = _columns(OpenOp)
_node_row = _columns(NodeStats)


class SQLiteStore:
    """One SQLite analytics store of schema 1. Writers call `commit`; readers the query methods."""

    keeps_state_blob = False
    """The aggregator need not encode its open state for this store (it keeps rows)."""

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        if read_only:
            if not self.path.exists():
                raise StoreError(f"{self.path}: no analytics store there")
            uri = f"file:{self.path}?mode=ro"
            self._conn = sqlite3.connect(
                uri, uri=True, isolation_level=None, check_same_thread=False
            )
        else:
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA busy_timeout = 10000")
        if not read_only:
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = FULL")
            self._conn.executescript(_DDL)
        self._check_format()

    def _check_format(self) -> None:
        try:
            meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a volfsm analytics store ({exc})") from None
        if meta.get("format") != STORE_FORMAT:
            raise StoreError(f"{self.path}: not a volfsm analytics store")
        if int(meta.get("schema", "0")) > STORE_SCHEMA:
            raise StoreError(
                f"{self.path}: written by a newer volfsm (store schema {meta['schema']})"
            )

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- state

    def load_state(self) -> tuple[SeqRanges, AnalyticsFold]:
        """The committed applied ranges and a fold holding the committed open state."""
        ranges = SeqRanges()
        for node, lo, hi in self._conn.execute(
            "SELECT node, lo, hi FROM applied ORDER BY node, lo"
        ):
            ranges.ranges.setdefault(node, []).append([lo, hi])
        fold = AnalyticsFold()
        ops = [
            OpenOp(n, o, op, d, v, p, s, t, bool(staged))
            for n, o, op, d, v, p, s, t, staged in self._conn.execute("SELECT * FROM open_ops")
        ]
        pods = [
            PendingPod(n, p, t, set(w.split(",")) if w else set(), v)
            for n, p, t, w, v in self._conn.execute("SELECT * FROM pending_pods")
        ]
        fold.restore(ops, self.open_spans(), pods, self.nodes())
        return ranges, fold

    def _ranges(self) -> SeqRanges:
        ranges = SeqRanges()
        rows = self._conn.execute("SELECT node, lo, hi FROM applied ORDER BY node, lo")
        for node, lo, hi in rows:
            ranges.ranges.setdefault(node, []).append([lo, hi])
        return ranges

    # --------------------------------------------------------------- writing

    def commit(self, batch: Batch) -> None:
        """Write one batch in one transaction (all of it or none)."""
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            c.executemany(_INSERT_EVENT, map(msgspec.structs.astuple, batch.rows))
            self._write_changes(batch.changes)
            for node, node_ranges in batch.ranges.items():
                c.execute("DELETE FROM applied WHERE node = ?", (node,))
                c.executemany(
                    "INSERT INTO applied VALUES (?, ?, ?)",
                    [(node, lo, hi) for lo, hi in node_ranges],
                )
            c.executemany("INSERT INTO gap_log VALUES (?, ?, ?, ?)", batch.gaps)
            c.executemany(
                "INSERT OR IGNORE INTO rejects VALUES (?, ?, ?, ?, ?)",
                [(r.stream_seq, r.subject, r.msg_id, r.error, r.data) for r in batch.rejects],
            )
            if batch.duplicates:
                self._add_counter("duplicates", batch.duplicates)
            if batch.position is not None:
                self._set_meta("stream", batch.position[0])
                self._set_meta("stream_seq", str(batch.position[1]))
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise

    def _write_changes(self, ch: FoldChanges) -> None:
        c = self._conn
        c.executemany(_INSERT_SAMPLE, map(_sample_row, ch.samples))
        c.executemany(_INSERT_SPAN, map(_span_row, ch.closed_spans))
        c.executemany(_INSERT_READY, map(_ready_row, ch.ready))
        for key, op in ch.open_ops.items():
            if op is None:
                c.execute("DELETE FROM open_ops WHERE node = ? AND op_id = ?", key)
            else:
                c.execute(_UPSERT_OP, _op_row(op))
        for key, span in ch.open_spans.items():
            if span is None:
                c.execute("DELETE FROM uncertain_open WHERE node = ? AND stream = ?", key)
            else:
                c.execute(_UPSERT_OPEN_SPAN, _open_span_row(span))
        for key, pod in ch.pending_pods.items():
            if pod is None:
                c.execute("DELETE FROM pending_pods WHERE node = ? AND pod_uid = ?", key)
            else:
                waiting = ",".join(sorted(pod.waiting))
                c.execute(_UPSERT_POD, (pod.node, pod.pod_uid, pod.added_us, waiting, pod.volumes))
        c.executemany(_UPSERT_NODE, map(_node_row, ch.nodes))

    def _set_meta(self, key: str, value: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _add_counter(self, key: str, delta: int) -> None:
        self._conn.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + excluded.value",
            (key, delta),
        )

    # --------------------------------------------------------------- reading

    def meta(self, key: str) -> str | None:
        """One value of the meta table."""
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def position(self) -> tuple[str, int] | None:
        """(stream, stream sequence) of the last committed batch, if any."""
        stream, seq = self.meta("stream"), self.meta("stream_seq")
        if stream is None or seq is None:
            return None
        return stream, int(seq)

    def event_count(self) -> int:
        """How many events the store holds."""
        row = self._conn.execute("SELECT coalesce(sum(events), 0) FROM nodes").fetchone()
        return int(row[0])

    def counters(self) -> IngestCounters:
        """The aggregator's committed counters."""
        undecodable = self._conn.execute("SELECT count(*) FROM rejects").fetchone()[0]
        noticed = self._conn.execute("SELECT count(*) FROM gap_log").fetchone()[0]
        position = self.position() or ("", 0)
        return IngestCounters(
            applied=self.event_count(),
            duplicates=int(self.meta("duplicates") or 0),
            undecodable=int(undecodable),
            gaps_noticed=int(noticed),
            stream=position[0],
            stream_seq=position[1],
        )

    def nodes(self) -> list[NodeStats]:
        """Per-node counters."""
        return [node_stats(r) for r in self._conn.execute("SELECT * FROM nodes ORDER BY node")]

    def op_rows(
        self, since_us: int | None = None
    ) -> list[tuple[str, str, int, float, int, str, int | None]]:
        """(driver, operation, ended_us, duration_s, failed, code, final) of finished ops."""
        sql = "SELECT driver, operation, ended_us, duration_s, failed, code, final FROM op_samples"
        if since_us is None:
            return self._conn.execute(sql).fetchall()
        return self._conn.execute(sql + " WHERE ended_us >= ?", (since_us,)).fetchall()

    def report_inputs(self, query: ReportQuery) -> ReportInputs:
        """The report's aggregates, as this store computed them: rows into Python, folded there."""
        ops = [
            (d, o, e, whole_us(s), bool(f), c, None if fin is None else bool(fin))
            for d, o, e, s, f, c, fin in self.op_rows(query.since_us)
            if in_window(query, e)
        ]
        start, width = series_frame(query, min((o[2] for o in ops), default=None))
        open_spans = self.open_spans()
        windows = None
        if query.since_us is not None or query.until_us is not None:
            windows = self.windows(query.lo_us)
        return ReportInputs(
            op_groups=op_groups(ops),
            failures=failure_figures(ops),
            series=series_buckets(ops, start, width, max(1, query.buckets)),
            bucket_us=width,
            uncertain=uncertain_totals(self.closed_spans(query.since_us), open_spans, query),
            open_spans=open_spans,
            nodes=self.nodes(),
            windows=windows,
            gaps=self.gaps(),
            pod_ready=distribution(
                r - a
                for a, r in self._conn.execute("SELECT added_us, ready_us FROM pod_ready")
                if in_window(query, r)
            ),
            pending_pods=self.pending_pods(),
        )

    def closed_spans(self, since_us: int | None = None) -> list[tuple[str, str, str, int, int]]:
        """(node, volume_id, kind, from_us, to_us) of closed Uncertain spans ending after since."""
        sql = "SELECT node, volume_id, kind, from_us, to_us FROM uncertain_spans"
        if since_us is None:
            return self._conn.execute(sql).fetchall()
        return self._conn.execute(sql + " WHERE to_us >= ?", (since_us,)).fetchall()

    def open_spans(self) -> list[UncertainSpan]:
        """Devices and pod-volumes Uncertain now."""
        return [
            UncertainSpan(n, s, k, v, p, f, None, bool(r))
            for n, s, k, v, p, f, r in self._conn.execute("SELECT * FROM uncertain_open")
        ]

    def windows(self, since_us: int) -> dict[str, NodeWindow]:
        """Per node: events stamped at or after `since_us`, and their first / last time."""
        rows = self._conn.execute(
            "SELECT node, count(*), min(ts_us), max(ts_us) FROM events WHERE ts_us >= ? "
            "GROUP BY node",
            (since_us,),
        )
        return {node: NodeWindow(n, lo, hi) for node, n, lo, hi in rows}

    def gaps(self) -> list[GapFigure]:
        """Gaps still open: seqs of a node never received between two received ones."""
        ranges = SeqRanges()
        for node, lo, hi in self._conn.execute(
            "SELECT node, lo, hi FROM applied ORDER BY node, lo"
        ):
            ranges.ranges.setdefault(node, []).append([lo, hi])
        return [GapFigure(n, lo, hi, hi - lo + 1) for n, lo, hi in self._ranges().holes()]

    def gap_log(self) -> list[tuple[str, int, int, int]]:
        """Every gap as noticed: (node, from_seq, to_seq, noticed_us)."""
        return self._conn.execute("SELECT * FROM gap_log ORDER BY noticed_us, node").fetchall()

    def pod_ready_s(self, since_us: int | None = None) -> list[float]:
        """Mount-to-ready durations (s) of pods ready at or after `since_us`."""
        sql = "SELECT (ready_us - added_us) / 1e6 FROM pod_ready"
        if since_us is not None:
            sql += " WHERE ready_us >= ?"
            return [r[0] for r in self._conn.execute(sql, (since_us,))]
        return [r[0] for r in self._conn.execute(sql)]

    def pending_pods(self) -> int:
        """Pods not ready yet."""
        return int(self._conn.execute("SELECT count(*) FROM pending_pods").fetchone()[0])

    def iter_events(
        self, since_us: int | None = None, chunk: int = 50_000
    ) -> Iterator[list[tuple[object, ...]]]:
        """Event rows (ROW_COLUMNS order) in chunks, by node and seq."""
        sql = f"SELECT {', '.join(ROW_COLUMNS)} FROM events"
        args: tuple[object, ...] = ()
        if since_us is not None:
            sql += " WHERE ts_us >= ?"
            args = (since_us,)
        cur = self._conn.execute(sql + " ORDER BY node, seq", args)
        while True:
            rows = cur.fetchmany(chunk)
            if not rows:
                return
            yield rows

    def count(self, table: str, where: str = "", args: Iterable[object] = ()) -> int:
        """Row count of one of the store's tables (tests and tools)."""
        if table not in _TABLES:
            raise ValueError(f"no table {table!r} in an analytics store")
        sql = f"SELECT count(*) FROM {table}" + (f" WHERE {where}" if where else "")
        return int(self._conn.execute(sql, tuple(args)).fetchone()[0])


_TABLES = frozenset(
    {
        "events",
        "applied",
        "gap_log",
        "rejects",
        "op_samples",
        "open_ops",
        "uncertain_spans",
        "uncertain_open",
        "pending_pods",
        "pod_ready",
        "nodes",
    }
)


def node_stats(r: tuple[Any, ...]) -> NodeStats:
    """A row of the SQLite store's `nodes` table (`SELECT *`) as NodeStats."""
    return NodeStats(
        node=r[0],
        events=r[1],
        first_seq=r[2],
        last_seq=r[3],
        first_us=r[4],
        last_us=r[5],
        reconstructions=r[6],
        restarts=r[7],
        interrupted_ops=r[8],
        last_reconstructed=bool(r[9]),
        last_stream_us=r[10],
        publish_lag_s=r[11],
    )

"""The report's aggregates computed by DuckDB over a store snapshot.

Each table is read as the union of its Parquet files whose rows meet the
window (the catalog knows each file's interval, so a report over a day
opens that day's files only) and its hot rows (registered Arrow tables).
The SQL computes what `projections.analytics.figures` computes in Python
for the in-memory report: percentiles with `quantile_disc` (nearest rank,
as `percentile`), sums of whole microseconds, the same windows and sort
orders; the two are held equal by tests.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from projections.analytics import (
    FOREVER_US,
    PUBLISH_OPERATIONS,
    ROW_COLUMNS,
    Distribution,
    FailureFigure,
    NodeWindow,
    OpGroup,
    ReportInputs,
    ReportQuery,
    SeriesBucket,
    UncertainNode,
    UncertainTotals,
    UncertainVolume,
    series_frame,
)
from volfsm.analytics.columns import TABLES
from volfsm.analytics.store import Snapshot

_QUANTILES = "[0.5, 0.9, 0.99]"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _opt(value: Any) -> int | None:
    return None if value is None else int(value)


class StoreQuery:
    """A DuckDB connection over one snapshot; `inputs(query)` computes a report's aggregates."""

    def __init__(self, snapshot: Snapshot, *, threads: int | None = None) -> None:
        self.snapshot = snapshot
        self.con = duckdb.connect(":memory:")
        if threads is not None:
            self.con.execute(f"SET threads = {int(threads)}")
        self._hot: dict[str, pa.Table] = {}
        for name in TABLES:
            hot = snapshot.hot_table(name)
            self._hot[name] = hot
            self.con.register(f"hot_{name}", hot)

    def close(self) -> None:
        """Close the connection."""
        self.con.close()

    def __enter__(self) -> StoreQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- sources

    def source(self, table: str, lo_us: int = -FOREVER_US, hi_us: int = FOREVER_US) -> str:
        """A FROM clause: the table's files meeting [lo_us, hi_us) and its hot rows."""
        files = self.snapshot.files_in(table, lo_us, hi_us)
        hot = f"SELECT * FROM hot_{table}"
        if not files:
            return f"({hot})"
        paths = ", ".join(_literal(str(f.path)) for f in files)
        return f"(SELECT * FROM read_parquet([{paths}]) UNION ALL BY NAME {hot})"

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.con.execute(sql, list(params)).fetchall()

    # -------------------------------------------------------------- counts

    def count(self, table: str) -> int:
        """Rows of `table`."""
        return int(self._all(f"SELECT count(*) FROM {self.source(table)}")[0][0])

    def iter_events(self, since_us: int | None, chunk: int) -> Iterator[list[tuple[object, ...]]]:
        """Event rows in ROW_COLUMNS order, by node and seq."""
        lo = since_us if since_us is not None else -FOREVER_US
        cur = self.con.execute(
            f"SELECT {', '.join(ROW_COLUMNS)} FROM {self.source('events', lo)} "
            "WHERE ts_us >= ? ORDER BY node, seq",
            [lo],
        )
        while True:
            rows = cur.fetchmany(chunk)
            if not rows:
                return
            yield rows

    # ------------------------------------------------------------ aggregates

    def inputs(self, query: ReportQuery) -> ReportInputs:
        """The report's aggregates over the window of `query`."""
        lo, hi = query.lo_us, query.hi_us
        samples = self.source("samples", lo, hi)
        window = "ended_us >= ? AND ended_us < ?"
        start, width = series_frame(query, self._first_ended(query))
        state = self.snapshot.state
        return ReportInputs(
            op_groups=self._op_groups(samples, window, lo, hi),
            failures=self._failures(samples, window, lo, hi),
            series=self._series(samples, window, lo, hi, start, width, max(1, query.buckets)),
            bucket_us=width,
            uncertain=self._uncertain(query),
            open_spans=list(state.open_spans),
            nodes=list(state.nodes),
            windows=self._windows(query),
            gaps=self.snapshot.gaps(),
            pod_ready=self._pod_ready(lo, hi),
            pending_pods=len(state.pending_pods),
            health=list(state.health),
        )

    def _first_ended(self, query: ReportQuery) -> int | None:
        """The first end of an operation in a window open at its start (else not needed).

        Read from the catalog (each file knows its first end) and the hot rows.
        """
        if query.since_us is not None:
            return None
        hi = query.hi_us
        firsts = [f.lo_us for f in self.snapshot.files_in("samples", -FOREVER_US, hi)]
        hot = self._hot["samples"]["ended_us"]
        in_window = pc.filter(hot, pc.less(hot, hi))
        if len(in_window):
            firsts.append(pc.min(in_window).as_py())
        return min(firsts, default=None)

    def _op_groups(self, samples: str, window: str, lo: int, hi: int) -> list[OpGroup]:
        rows = self._all(
            f"""SELECT driver, operation,
                       count(*) FILTER (WHERE NOT failed),
                       count(*) FILTER (WHERE failed),
                       quantile_disc(duration_us, {_QUANTILES}) FILTER (WHERE NOT failed),
                       max(duration_us) FILTER (WHERE NOT failed),
                       coalesce(sum(duration_us) FILTER (WHERE NOT failed), 0)
                FROM {samples} WHERE {window} GROUP BY driver, operation""",
            [lo, hi],
        )
        groups = []
        for driver, operation, ok, failed, quantiles, max_us, sum_us in rows:
            p50, p90, p99 = quantiles if quantiles is not None else (None, None, None)
            groups.append(
                OpGroup(driver, operation, ok, failed, p50, p90, p99, _opt(max_us), int(sum_us))
            )
        return groups

    def _failures(self, samples: str, window: str, lo: int, hi: int) -> list[FailureFigure]:
        rows = self._all(
            f"""SELECT driver, operation, code, coalesce(final, false), count(*)
                FROM {samples} WHERE failed AND {window} GROUP BY ALL""",
            [lo, hi],
        )
        return [FailureFigure(d, o, c, bool(f), n) for d, o, c, f, n in rows]

    def _series(
        self, samples: str, window: str, lo: int, hi: int, start: int, width: int, buckets: int
    ) -> list[SeriesBucket]:
        publish = ", ".join(_literal(op) for op in PUBLISH_OPERATIONS)
        rows = self._all(
            f"""SELECT driver, ? + least(?, (ended_us - ?) // ?) * ? AS bucket, count(*),
                       quantile_disc(duration_us, [0.5, 0.9])
                FROM {samples}
                WHERE {window} AND NOT failed AND ended_us >= ? AND operation IN ({publish})
                GROUP BY driver, bucket""",
            [start, buckets - 1, start, width, width, lo, hi, start],
        )
        return [SeriesBucket(d, int(b), n, q[0], q[1]) for d, b, n, q in rows]

    def _uncertain(self, query: ReportQuery) -> UncertainTotals:
        lo, hi, now = query.lo_us, query.hi_us, query.now_us
        spans = self.source("spans", lo, hi)
        open_spans = self.snapshot.state.open_spans
        opened = pa.table(
            {
                "node": pa.array([s.node for s in open_spans], pa.string()),
                "volume_id": pa.array([s.volume_id for s in open_spans], pa.string()),
                "kind": pa.array([s.kind for s in open_spans], pa.string()),
                "from_us": pa.array([s.from_us for s in open_spans], pa.int64()),
            }
        )
        self.con.register("open_spans", opened)
        self.con.execute(
            f"""CREATE OR REPLACE TEMP TABLE uncertain AS
                WITH s AS (
                    SELECT node, volume_id, kind,
                           greatest(0, least(to_us, $hi) - greatest(from_us, $lo)) AS o,
                           false AS open
                    FROM {spans} WHERE to_us >= $lo AND from_us < $hi
                    UNION ALL
                    SELECT node, volume_id, kind,
                           greatest(0, least($now, $hi) - greatest(from_us, $lo)), true
                    FROM open_spans WHERE from_us < $hi
                )
                SELECT node, volume_id, kind, sum(o)::BIGINT AS o, count(*) AS n,
                       bool_or(open) AS open
                FROM s GROUP BY node, volume_id, kind""",
            {"lo": lo, "hi": hi, "now": now},
        )
        top = self._all(
            "SELECT node, volume_id, kind, o, n, open FROM uncertain "
            "ORDER BY o DESC, node, volume_id, kind LIMIT ?",
            [max(0, query.top)],
        )
        by_node = self._all(
            "SELECT node, kind, sum(o)::BIGINT, count(*), sum(n)::BIGINT FROM uncertain "
            "GROUP BY node, kind ORDER BY node, kind"
        )
        total = int(self._all("SELECT count(*) FROM uncertain")[0][0])
        return UncertainTotals(
            [UncertainVolume(n, v, k, o / 1e6, c, bool(op)) for n, v, k, o, c, op in top],
            total,
            [UncertainNode(n, k, o / 1e6, v, s) for n, k, o, v, s in by_node],
        )

    def _windows(self, query: ReportQuery) -> dict[str, NodeWindow] | None:
        if query.since_us is None and query.until_us is None:
            return None
        lo, hi = query.lo_us, query.hi_us
        rows = self._all(
            f"""SELECT node, count(*), min(ts_us), max(ts_us) FROM {self.source("events", lo, hi)}
                WHERE ts_us >= ? AND ts_us < ? GROUP BY node""",
            [lo, hi],
        )
        return {node: NodeWindow(n, first, last) for node, n, first, last in rows}

    def _pod_ready(self, lo: int, hi: int) -> Distribution:
        rows = self._all(
            f"""SELECT count(*), quantile_disc(ready_us - added_us, {_QUANTILES}),
                       max(ready_us - added_us), coalesce(sum(ready_us - added_us), 0)
                FROM {self.source("ready", lo, hi)} WHERE ready_us >= ? AND ready_us < ?""",
            [lo, hi],
        )
        count, quantiles, max_us, sum_us = rows[0]
        if not count:
            return Distribution()
        p50, p90, p99 = quantiles
        return Distribution(count, p50, p90, p99, _opt(max_us), int(sum_us))

"""The report's aggregates over a store snapshot: DuckDB over the Parquet files, numpy over the
sorted runs beside them.

Each table is read as the union of its Parquet files whose rows meet the
window (the catalog knows each file's interval, so a report over a day
opens that day's files only) and its hot rows (registered Arrow tables).
Counts by failure code, Uncertain time, the rows per node are SQL. The
percentiles (latency per driver and operation, the latency series, pod
mount-to-ready) and the sums beside them come from the sorted runs of
`volfsm.analytics.sortedruns`: each file wholly inside the window gives
its sidecar, the other rows (files cut by the window, older files, hot
rows) are read as lists and join them. What is computed matches
`projections.analytics.figures` (the in-memory report): nearest-rank
percentiles (as `percentile`), sums of whole microseconds, the same
windows and sort orders; the two are held equal by tests.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import duckdb
import numpy as np
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
from projections.analytics.waits import WaitRow
from volfsm.analytics.columns import TABLES
from volfsm.analytics.sortedruns import (
    READY_KEY,
    FailureKey,
    Ints,
    Run,
    Runs,
    percentiles,
    read_sidecar,
    select_unsorted,
    sidecar_of,
)
from volfsm.analytics.store import DataFile, Snapshot


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


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
        start, width = series_frame(query, self._first_ended(query))
        state = self.snapshot.state
        runs, raw = self.runs("samples", lo, hi)
        failures = dict(runs.failures)
        buckets = max(1, query.buckets)
        series = _series(runs, start, width, buckets)
        if raw is not None:
            for key, count in self._raw_failures(raw, lo, hi):
                failures[key] = failures.get(key, 0) + count
            series += self._raw_series(raw, lo, hi, start, width, buckets)
        ready = self.runs("ready", lo, hi)[0].by_key.get(READY_KEY, [])
        return ReportInputs(
            op_groups=_op_groups(runs, failures),
            failures=[FailureFigure(*key, count) for key, count in failures.items()],
            series=_merge_series(series, start, width),
            bucket_us=width,
            uncertain=self._uncertain(query),
            open_spans=list(state.open_spans),
            nodes=list(state.nodes),
            windows=self._windows(query),
            gaps=self.snapshot.gaps(),
            pod_ready=_distribution(ready),
            pending_pods=len(state.pending_pods),
            health=list(state.health),
            waits=self._waits(lo, hi),
            open_waits=list(state.waits),
        )

    def _waits(self, lo: int, hi: int) -> list[WaitRow]:
        """The steps of pods' waits for their claims that ended in [lo, hi) (a store written
        before waits were kept has none)."""
        sql = f"""SELECT node, pod_uid, reason, since_us, from_us, to_us, outcome
                  FROM {self.source("waits", lo, hi)} WHERE to_us >= ? AND to_us < ?"""
        return [
            (str(n), str(u), str(r), int(s), int(f), int(t), str(o))
            for n, u, r, s, f, t, o in self._all(sql, [lo, hi])
        ]

    def runs(self, table: str, lo: int, hi: int) -> tuple[Runs, str | None]:
        """The sorted runs of `table` (samples or ready) in [lo, hi), and the FROM clause of
        the rows they were not made of beforehand (None: there are none).

        A file wholly inside the window gives its sidecar; the rows of the
        others (partly inside, or older than sidecars) and the hot rows are
        read and sorted here.
        """
        runs, files = Runs(), []
        for f in self.snapshot.files_in(table, lo, hi):
            inside = lo <= f.lo_us and f.hi_us < hi
            sidecar = read_sidecar(sidecar_of(f.path), table) if inside else None
            if sidecar is None:
                files.append(f)
            else:
                runs.extend(sidecar)
        if not files and not self._hot[table].num_rows:
            return runs, None
        raw = self._raw_source(table, files)
        if table == "samples":
            sql = f"""SELECT driver, operation, list(duration_us), sum(duration_us) FROM {raw}
                      WHERE NOT failed AND ended_us >= ? AND ended_us < ?
                      GROUP BY driver, operation"""
        else:
            sql = f"""SELECT '', '', list(ready_us - added_us), sum(ready_us - added_us)
                      FROM {raw} WHERE ready_us >= ? AND ready_us < ? HAVING count(*) > 0"""
        for driver, operation, values, sum_us in _lists(self.con.sql(sql, params=[lo, hi])):
            runs.add((driver, operation), Run(values, sum_us, ascending=False))
        return runs, raw

    def _raw_source(self, table: str, files: list[DataFile]) -> str:
        """A FROM clause: the rows of `files` and the hot rows of `table`."""
        hot = f"SELECT * FROM hot_{table}"
        if not files:
            return f"({hot})"
        paths = ", ".join(_literal(str(f.path)) for f in files)
        return f"(SELECT * FROM read_parquet([{paths}]) UNION ALL BY NAME {hot})"

    def _raw_series(
        self, raw: str, lo: int, hi: int, start: int, width: int, buckets: int
    ) -> list[tuple[str, int, Ints]]:
        """The succeeded publish durations of rows not in sidecars, per driver and bucket."""
        publish = ", ".join(_literal(op) for op in PUBLISH_OPERATIONS)
        rel = self.con.sql(
            f"""SELECT driver, least(?, (ended_us - ?) // ?) AS bucket, list(duration_us), 0
                FROM {raw}
                WHERE NOT failed AND ended_us >= ? AND ended_us < ? AND ended_us >= ?
                      AND operation IN ({publish})
                GROUP BY driver, bucket""",
            params=[buckets - 1, start, width, lo, hi, start],
        )
        return [(driver, int(bucket), values) for driver, bucket, values, _ in _lists(rel)]

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

    def _raw_failures(self, raw: str, lo: int, hi: int) -> list[tuple[FailureKey, int]]:
        """Failed operations of the rows not in sidecars, by (driver, operation, code, final)."""
        rows = self._all(
            f"""SELECT driver, operation, code, coalesce(final, false), count(*) FROM {raw}
                WHERE failed AND ended_us >= ? AND ended_us < ? GROUP BY ALL""",
            [lo, hi],
        )
        return [((d, o, c, bool(f)), n) for d, o, c, f, n in rows]

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


# --------------------------------------------------------------------------
# Figures of sorted runs


def _distribution(runs: list[Run]) -> Distribution:
    """Count, nearest-rank percentiles, max and sum of the values of `runs`."""
    if not runs:
        return Distribution()
    if len(runs) == 1 and not runs[0].ascending:  # rows read here only: no need to sort them
        values = runs[0].values_us
        p50, p90, p99 = select_unsorted(values, (50, 90, 99))
        return Distribution(len(values), p50, p90, p99, int(values.max()), runs[0].sum_us)
    arrays = [r.values_us if r.ascending else np.sort(r.values_us) for r in runs]
    p50, p90, p99 = percentiles(arrays, (50, 90, 99))
    count = sum(len(a) for a in arrays)
    max_us = max(int(a[-1]) for a in arrays)
    return Distribution(count, p50, p90, p99, max_us, sum(r.sum_us for r in runs))


def _op_groups(runs: Runs, failures: dict[FailureKey, int]) -> list[OpGroup]:
    """Per (driver, operation): succeeded ones from the runs, failed counts from `failures`."""
    failed: dict[tuple[str, str], int] = {}
    for (driver, operation, _code, _final), count in failures.items():
        failed[(driver, operation)] = failed.get((driver, operation), 0) + count
    groups = []
    for (driver, operation), key_runs in runs.by_key.items():
        d = _distribution(key_runs)
        n_failed = failed.pop((driver, operation), 0)
        groups.append(
            OpGroup(
                driver,
                operation,
                d.count,
                n_failed,
                d.p50_us,
                d.p90_us,
                d.p99_us,
                d.max_us,
                d.sum_us,
            )
        )
    for (driver, operation), n_failed in failed.items():
        groups.append(OpGroup(driver, operation, 0, n_failed, None, None, None, None, 0))
    return groups


def _lists(rel: duckdb.DuckDBPyRelation) -> Iterator[tuple[Any, Any, Ints, int]]:
    """Rows (key, key, list of ints, sum) of a query, each list as one numpy array."""
    table = rel.to_arrow_table()
    if not table.num_rows:
        return
    lists = table.column(2).combine_chunks()
    values = np.asarray(lists.flatten().to_numpy(), dtype=np.int64)
    offsets = lists.offsets.to_numpy()
    for i, (k1, k2, total) in enumerate(
        zip(
            table.column(0).to_pylist(),
            table.column(1).to_pylist(),
            table.column(3).to_pylist(),
            strict=True,
        )
    ):
        yield k1, k2, values[offsets[i] : offsets[i + 1]], int(total)


def _series(runs: Runs, start: int, width: int, buckets: int) -> list[tuple[str, int, Ints]]:
    """Succeeded publish durations per driver and bucket of end time (from `start` on), as
    slices of the sidecars' runs by end time."""
    bounds = np.array([start + width * j for j in range(buckets)] + [FOREVER_US], np.int64)
    slices: list[tuple[str, int, Ints]] = []
    for (driver, operation), key_runs in runs.by_key.items():
        if operation not in PUBLISH_OPERATIONS:
            continue
        for run in key_runs:
            if run.ended_us is None or run.by_end_us is None:
                continue  # rows read here: their series comes from `_raw_series`
            cuts = np.searchsorted(run.ended_us, bounds, "left").tolist()
            for j in range(buckets):
                if cuts[j] < cuts[j + 1]:
                    slices.append((driver, j, run.by_end_us[cuts[j] : cuts[j + 1]]))
    return slices


def _merge_series(
    slices: list[tuple[str, int, Ints]], start: int, width: int
) -> list[SeriesBucket]:
    """One series bucket per (driver, bucket) of the slices: count and exact p50 and p90."""
    parts: dict[tuple[str, int], list[Ints]] = {}
    for driver, j, values in slices:
        parts.setdefault((driver, j), []).append(values)
    result = []
    for (driver, j), chunks in parts.items():
        values = np.concatenate(chunks)
        p50, p90 = select_unsorted(values, (50, 90))
        result.append(SeriesBucket(driver, start + j * width, len(values), p50, p90))
    return result

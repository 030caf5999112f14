"""The store's tables as Arrow columns: events, op samples, Uncertain spans, pod readiness,
pods' waits for their claims.

Each `Table` names its Arrow schema, the time column its day partitions
and window pruning follow, the column that starts a row's interval (a
span starts before it ends), and the sort order of its Parquet files.
`to_arrow` turns rows (msgspec structs or dataclasses) into a table,
one column at a time; times are whole microseconds (int64, UTC).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import msgspec
import pyarrow as pa

from projections.analytics import ROW_COLUMNS, OpSample, PodReady, UncertainSpan, whole_us
from projections.analytics.waits import wait_row

_STRING = pa.string()
_INT = pa.int64()
_BOOL = pa.bool_()

_EVENT_TYPES: dict[str, pa.DataType] = {
    "seq": _INT,
    "ts_us": _INT,
    "final": _BOOL,
    "duration_s": pa.float64(),
    "reconstructed": _BOOL,
}


@dataclass(frozen=True, slots=True)
class Table:
    """One of the store's tables."""

    name: str
    schema: pa.Schema
    time: str
    """The column partitions (by day) and windows follow."""
    start: str
    """The column where a row's interval starts (= `time` for point rows)."""
    sort: tuple[str, ...]
    """Row order inside a Parquet file (operations: failed ones, and each operation, in runs
    of row groups that a filter on them skips)."""


EVENTS = Table(
    "events",
    pa.schema([(name, _EVENT_TYPES.get(name, _STRING)) for name in ROW_COLUMNS]),
    "ts_us",
    "ts_us",
    ("node", "seq"),
)
SAMPLES = Table(
    "samples",
    pa.schema(
        [
            ("node", _STRING),
            ("op_id", _STRING),
            ("operation", _STRING),
            ("phase", _STRING),
            ("driver", _STRING),
            ("volume_id", _STRING),
            ("started_us", _INT),
            ("ended_us", _INT),
            ("duration_us", _INT),
            ("failed", _BOOL),
            ("code", _STRING),
            ("final", _BOOL),
        ]
    ),
    "ended_us",
    "ended_us",
    ("failed", "operation", "driver", "ended_us"),
)
SPANS = Table(
    "spans",
    pa.schema(
        [
            ("node", _STRING),
            ("stream", _STRING),
            ("kind", _STRING),
            ("volume_id", _STRING),
            ("pod_uid", _STRING),
            ("from_us", _INT),
            ("to_us", _INT),
            ("reconstructed", _BOOL),
        ]
    ),
    "to_us",
    "from_us",
    ("node", "volume_id", "to_us"),
)
READY = Table(
    "ready",
    pa.schema(
        [
            ("node", _STRING),
            ("pod_uid", _STRING),
            ("added_us", _INT),
            ("ready_us", _INT),
            ("volumes", _INT),
        ]
    ),
    "ready_us",
    "ready_us",
    ("ready_us",),
)

WAITS = Table(
    "waits",
    pa.schema(
        [
            ("node", _STRING),
            ("pod_uid", _STRING),
            ("reason", _STRING),
            ("since_us", _INT),
            ("from_us", _INT),
            ("to_us", _INT),
            ("outcome", _STRING),
        ]
    ),
    "to_us",
    "since_us",
    ("to_us",),
)
"""Steps of pods' waits for their claims (`PodWait`), by the time each step ended. A store
written before it has no `waits` files: it reads as empty."""

TABLES: dict[str, Table] = {t.name: t for t in (EVENTS, SAMPLES, SPANS, READY, WAITS)}
"""Every table by name."""


def _sample_values(s: OpSample) -> tuple[Any, ...]:
    return (
        s.node,
        s.op_id,
        s.operation,
        s.phase,
        s.driver,
        s.volume_id,
        s.started_us,
        s.ended_us,
        whole_us(s.duration_s),
        s.failed,
        s.code,
        s.final,
    )


_ROW_VALUES: dict[str, Callable[[Any], tuple[Any, ...]]] = {
    "events": msgspec.structs.astuple,
    "samples": _sample_values,
    "spans": attrgetter(*(f.name for f in SPANS.schema)),
    "ready": attrgetter(*(f.name for f in READY.schema)),
    "waits": wait_row,
}


def to_arrow(table: Table, rows: Sequence[Any]) -> pa.Table:
    """`rows` of `table` (EventRow, OpSample, UncertainSpan, PodReady or PodWait) as an Arrow
    table."""
    if not rows:
        return table.schema.empty_table()
    columns = list(zip(*map(_ROW_VALUES[table.name], rows), strict=True))
    arrays = [
        pa.array(values, type=f.type) for values, f in zip(columns, table.schema, strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=table.schema)


def span_row(span: UncertainSpan) -> tuple[Any, ...]:
    """The values of a closed span, in the spans table's column order."""
    return tuple(_ROW_VALUES["spans"](span))


def ready_row(ready: PodReady) -> tuple[Any, ...]:
    """The values of a pod readiness, in the ready table's column order."""
    return tuple(_ROW_VALUES["ready"](ready))

"""Export of the flattened events as one Parquet file (times as UTC timestamps).

One row per event with the `EventRow` columns, written in row groups read
from the store in chunks, so memory stays bounded however large the store.
(The store's own files are Parquet too, partitioned by day; this writes
one file of a window, with `ts_us` typed as a timestamp.) A pyarrow that
cannot be imported is reported as `ExportUnavailableError`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from projections.analytics import ROW_COLUMNS
from volfsm.analytics.store import AnalyticsStore


class ExportUnavailableError(RuntimeError):
    """pyarrow is not installed."""


_TYPES = {
    "seq": "int64",
    "ts_us": "int64",
    "final": "bool_",
    "duration_s": "float64",
    "reconstructed": "bool_",
}


def _schema(pa: Any) -> Any:
    fields = []
    for name in ROW_COLUMNS:
        kind = _TYPES.get(name, "string")
        if name == "ts_us":
            fields.append(pa.field(name, pa.timestamp("us", tz="UTC")))
        else:
            fields.append(pa.field(name, getattr(pa, kind)()))
    return pa.schema(fields)


def _import_arrow() -> tuple[Any, Any]:
    try:
        pa = importlib.import_module("pyarrow")
        pq = importlib.import_module("pyarrow.parquet")
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ExportUnavailableError("Parquet export needs pyarrow: pip install pyarrow") from exc
    return pa, pq


def export_parquet(
    store: AnalyticsStore, out: Path, *, since_us: int | None = None, chunk: int = 100_000
) -> int:
    """Write the store's events (stamped at or after `since_us`) to `out`; rows written."""
    pa, pq = _import_arrow()
    schema = _schema(pa)
    written = 0
    with pq.ParquetWriter(str(out), schema, compression="zstd") as writer:
        for rows in store.iter_events(since_us, chunk):
            columns = list(zip(*rows, strict=True))
            arrays = []
            for i, name in enumerate(ROW_COLUMNS):
                values: Any = columns[i]
                if _TYPES.get(name) == "bool_":
                    values = [None if v is None else bool(v) for v in values]
                arrays.append(pa.array(values, type=schema.field(name).type))
            writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
            written += len(rows)
        if written == 0:
            writer.write_table(schema.empty_table())
    return written

"""Sorted durations beside each Parquet file: exact percentiles without re-reading the rows.

A percentile is not a sum: the exact (nearest-rank) percentile of a day
cannot be built from the percentiles of its files. What can be built once
per file, when the file is written, is its durations sorted. Compaction
writes beside each `samples` and `ready` file `NNNNNNNN.parquet` a file
`NNNNNNNN.sorted.arrow` (Arrow IPC, uncompressed, so it is memory-mapped
and read in place): one int64 column holding, for each run (driver,
operation) of succeeded operations (a `ready` file has one run, every
pod's mount-to-ready time), its durations ascending, and for the runs of
publish operations also their end times and durations by end time (the
latency series' buckets are slices of them). The schema metadata holds
each run's key, offsets, length and sum, and (`samples`) the failed
operations counted by driver, operation, code and final.

The k-th smallest of the union of several sorted runs is found by a
binary search on the value, counting with `searchsorted` in each run: a
few dozen probes per run, whatever its length. The rows of a file only
partly inside a report's window, the hot rows and files without a
sidecar (written by an older volfsm) are read at report time and join
the same search.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from projections.analytics import PUBLISH_OPERATIONS

SUFFIX = ".sorted.arrow"
"""A sidecar's name: the Parquet file's stem and this."""
TABLES_WITH_RUNS = ("samples", "ready")
_META_KEY = b"volfsm.runs.v1"

Ints = npt.NDArray[np.int64]
RunKey = tuple[str, str]
"""(driver, operation) of a samples run; ("", "") for the ready run."""
READY_KEY: RunKey = ("", "")
FailureKey = tuple[str, str, str, bool]
"""(driver, operation, code, final) of failed operations."""
_FAILURES_KEY = b"volfsm.failures"


def sidecar_of(parquet: Path) -> Path:
    """The sidecar path of a Parquet file."""
    return parquet.with_name(parquet.name.removesuffix(".parquet") + SUFFIX)


@dataclass(slots=True)
class Run:
    """One run's values: ascending (unless `ascending` is False: rows read at report time),
    their sum, and (a sidecar's samples) the same by end time."""

    values_us: Ints
    sum_us: int
    ended_us: Ints | None = None
    by_end_us: Ints | None = None
    ascending: bool = True


@dataclass(slots=True)
class Runs:
    """Runs by key, from any number of sources (sidecars and rows read at report time)."""

    by_key: dict[RunKey, list[Run]] = field(default_factory=dict)
    failures: dict[FailureKey, int] = field(default_factory=dict)
    """Failed operations counted by (driver, operation, code, final), of the sidecars."""

    def add(self, key: RunKey, run: Run) -> None:
        """Add one source's run of `key` (empty runs are left out)."""
        if len(run.values_us):
            self.by_key.setdefault(key, []).append(run)

    def extend(self, other: Runs) -> None:
        """Add every run of `other`."""
        for key, runs in other.by_key.items():
            for run in runs:
                self.add(key, run)
        for fkey, count in other.failures.items():
            self.failures[fkey] = self.failures.get(fkey, 0) + count


# --------------------------------------------------------------------------
# Writing (at compaction, beside the Parquet file)


def _ints(array: pa.ChunkedArray | pa.Array) -> Ints:
    """int64 values as numpy (in place when they are one chunk: a memory-mapped file stays
    mapped, not read)."""
    if isinstance(array, pa.ChunkedArray) and array.num_chunks == 1:
        array = array.chunk(0)
    return np.asarray(array.to_numpy(), dtype=np.int64)


def _failures(rows: pa.Table) -> list[list[object]]:
    """[driver, operation, code, final, count] of the failed rows."""
    failed = rows.filter(rows["failed"])
    failed = failed.set_column(
        failed.schema.get_field_index("final"), "final", pc.fill_null(failed["final"], False)
    )
    counts = failed.group_by(["driver", "operation", "code", "final"]).aggregate(
        [("ended_us", "count")]
    )
    names = ("driver", "operation", "code", "final", "ended_us_count")
    return [[row[n] for n in names] for row in counts.to_pylist()]


def _sample_runs(rows: pa.Table) -> tuple[pa.Table, list[list[object]]]:
    """The succeeded rows' runs: each run's durations sorted, then, for publish operations,
    each run's end times and durations by end time, all in one column."""
    ok = rows.filter(pc.invert(rows["failed"])).sort_by(
        [("driver", "ascending"), ("operation", "ascending"), ("ended_us", "ascending")]
    )
    keys = ok.group_by(["driver", "operation"], use_threads=False).aggregate(
        [("ended_us", "count")]
    )  # in order of first appearance: the sorted order
    ended, durations = _ints(ok["ended_us"]), _ints(ok["duration_us"])
    parts, by_end = [durations.copy()], []
    meta: list[list[object]] = []
    start, tail = 0, len(durations)
    for driver, operation, length in zip(
        keys["driver"].to_pylist(),
        keys["operation"].to_pylist(),
        keys["ended_us_count"].to_pylist(),
        strict=True,
    ):
        end = start + length
        parts[0][start:end].sort()
        at = -1
        if operation in PUBLISH_OPERATIONS:
            by_end += [ended[start:end], durations[start:end]]
            at, tail = tail, tail + 2 * length
        meta.append([driver, operation, start, length, int(durations[start:end].sum()), at])
        start = end
    return pa.table({"values": np.concatenate(parts + by_end)}), meta


def _ready_runs(rows: pa.Table) -> tuple[pa.Table, list[list[object]]]:
    values = np.sort(_ints(pc.subtract(rows["ready_us"], rows["added_us"])))
    meta: list[list[object]] = (
        [["", "", 0, len(values), int(values.sum()), -1]] if len(values) else []
    )
    return pa.table({"values": values}), meta


def write_sidecar(table: str, rows: pa.Table, path: Path) -> None:
    """Write the sidecar of `rows` (a `samples` or `ready` file's rows): synced, renamed into
    place (the caller syncs the directory)."""
    table_runs, meta = _sample_runs(rows) if table == "samples" else _ready_runs(rows)
    schema_meta = {_META_KEY: json.dumps(meta).encode()}
    if table == "samples":
        schema_meta[_FAILURES_KEY] = json.dumps(_failures(rows)).encode()
    table_runs = table_runs.replace_schema_metadata(schema_meta)
    tmp = path.with_name(f".{path.name}.tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table_runs.schema) as writer:
        writer.write_table(table_runs)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.rename(tmp, path)


# --------------------------------------------------------------------------
# Reading


def _runs(table: pa.Table, meta: Sequence[Sequence[object]]) -> Runs:
    values = _ints(table["values"])
    runs = Runs()
    for driver, operation, offset, length, sum_us, at in meta:
        assert isinstance(offset, int) and isinstance(length, int) and isinstance(at, int)
        assert isinstance(sum_us, int)
        run = Run(values[offset : offset + length], sum_us)
        if at >= 0:
            run.ended_us = values[at : at + length]
            run.by_end_us = values[at + length : at + 2 * length]
        runs.add((str(driver), str(operation)), run)
    return runs


def read_sidecar(path: Path, table: str) -> Runs | None:
    """The runs of the sidecar of a `table` file, memory-mapped (None if there is none: an
    older file)."""
    try:
        source = pa.memory_map(str(path), "r")
    except FileNotFoundError:
        return None
    data = pa.ipc.open_file(source).read_all()
    meta = data.schema.metadata or {}
    if _META_KEY not in meta or (table == "samples" and _FAILURES_KEY not in meta):
        return None  # not one this build reads: the file's rows are read instead
    runs = _runs(data, json.loads(meta[_META_KEY]))
    for driver, operation, code, final, count in json.loads(meta.get(_FAILURES_KEY, b"[]")):
        key = (driver, operation, code, bool(final))
        runs.failures[key] = runs.failures.get(key, 0) + count
    return runs


# --------------------------------------------------------------------------
# Figures of runs


def kth_smallest(arrays: Sequence[Ints], k: int) -> int:
    """The k-th smallest value (0-based) of the union of ascending arrays."""
    if len(arrays) == 1:
        return int(arrays[0][k])
    lo = min(int(a[0]) for a in arrays)
    hi = max(int(a[-1]) for a in arrays)
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(int(np.searchsorted(a, mid, "right")) for a in arrays) > k:
            hi = mid
        else:
            lo = mid + 1
    return lo


def nearest_rank(count: int, p: float) -> int:
    """The 0-based index of the nearest-rank p-th percentile of `count` values (the rank
    `projections.analytics.percentile` takes, to the same float arithmetic)."""
    return min(max(1, math.ceil(p / 100.0 * count)), count) - 1


def percentiles(arrays: Sequence[Ints], ps: Sequence[float]) -> list[int]:
    """Nearest-rank percentiles (p in 0..100) of the union of ascending arrays (not empty)."""
    count = sum(len(a) for a in arrays)
    return [kth_smallest(arrays, nearest_rank(count, p)) for p in ps]


def select_unsorted(values: Ints, ps: Sequence[float]) -> list[int]:
    """Nearest-rank percentiles of unsorted values (not empty), by partial sort."""
    ranks = [nearest_rank(len(values), p) for p in ps]
    part = np.partition(values, sorted(set(ranks)))
    return [int(part[r]) for r in ranks]

"""Cluster-wide storage analytics: flat event rows, the facts derived from them, report figures.

Pure code shared by the aggregator (`volfsm.analytics`), its tests and offline use.
Modules: `rows` (names, flat rows), `fold` (facts and open state), `figures`
(report figures), `memory` (a report of envelopes without a store).

* `flatten(env)` / `flatten_json(data)` turn one envelope (or its public
  JSON form, as published on NATS) into an `EventRow`: scalar columns only,
  the shape of the SQLite store and the Parquet export.
* `AnalyticsFold` folds rows of many nodes (each node's rows in `seq` order)
  into facts: finished operations with their latency (`OpSample`), spans of
  time an entry sat Uncertain (`UncertainSpan`), pod mount-to-ready times
  (`PodReady`) and per-node counters (`NodeStats`). Its open state (running
  operations, open Uncertain spans, pods not yet ready) is explicit so a
  store can persist it beside the rows, and every change is reported by
  `drain()`.
* `build_report(...)` computes the report figures from plain fact tuples.

Operation names are the engine's (kubelet's): stage has no operation of its
own there (MountDevice runs inside `volume_mount`, as in kubelet), so a stage
sample (`mount_device` / `map_device`) is derived from the `OperationStarted`
of a `volume_mount` / `map_volume` to the `DeviceMounted` of its volume on the
same node while that operation runs (WaitForAttach and attach included).

Percentiles are nearest-rank: the p-th percentile of n sorted values is the
value at rank ceil(p/100 * n). Latency percentiles count succeeded
operations; failed ones are counted apart (their time is usually a timeout).
"""

from projections.analytics.figures import (
    FailureFigure,
    GapFigure,
    LatencyFigure,
    NodeFigure,
    NodeWindow,
    PodReadyFigure,
    Report,
    ReportInputs,
    SeriesPoint,
    UncertainNow,
    UncertainVolume,
    build_report,
    percentile,
)
from projections.analytics.fold import (
    AnalyticsFold,
    FoldChanges,
    NodeStats,
    OpenOp,
    OpRow,
    OpSample,
    PendingPod,
    PodReady,
    UncertainSpan,
)
from projections.analytics.memory import MemoryFacts, report_of
from projections.analytics.rows import (
    PHASES,
    ROW_COLUMNS,
    STAGE_OF,
    EventRow,
    driver_of,
    flatten,
    flatten_json,
    phase_of,
)

__all__ = [
    "PHASES",
    "ROW_COLUMNS",
    "STAGE_OF",
    "AnalyticsFold",
    "EventRow",
    "FailureFigure",
    "FoldChanges",
    "GapFigure",
    "LatencyFigure",
    "MemoryFacts",
    "NodeFigure",
    "NodeStats",
    "NodeWindow",
    "OpRow",
    "OpSample",
    "OpenOp",
    "PendingPod",
    "PodReady",
    "PodReadyFigure",
    "Report",
    "ReportInputs",
    "SeriesPoint",
    "UncertainNow",
    "UncertainSpan",
    "UncertainVolume",
    "build_report",
    "driver_of",
    "flatten",
    "flatten_json",
    "percentile",
    "phase_of",
    "report_of",
]

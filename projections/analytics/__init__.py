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
* `WaitFold` (`waits`) follows pods that wait for their claims (`PodPending`
  until `PodAdded` or `PodRemoved`): each step of a wait that ended is a
  `PodWait` with what was missing; the report shows them apart
  (`PodPendingFigure`), since no driver's time is in them.
* `HealthFold` keeps the latest usage and volume condition per pod-volume
  (`VolumeUsageChanged`, `VolumeConditionChanged`) for the "volumes near
  full" and "abnormal volumes" sections.
* The report is built from aggregates (`ReportInputs`) of a window
  (`ReportQuery`): `MemoryFacts` computes them in Python, the store with
  SQL; `build_report` turns them into figures.

Operation names are the engine's (kubelet's): stage has no operation of its
own there (MountDevice runs inside `volume_mount`, as in kubelet), so a stage
sample (`mount_device` / `map_device`) is derived from the `OperationStarted`
of a `volume_mount` / `map_volume` to the `DeviceMounted` of its volume on the
same node while that operation runs (WaitForAttach and attach included).

Durations are added and ranked in whole microseconds. Percentiles are
nearest-rank: the p-th percentile of n sorted values is the value at rank
ceil(p/100 * n). Latency percentiles count succeeded operations; failed
ones are counted apart (their time is usually a timeout).
"""

from projections.analytics.figures import (
    FOREVER_US,
    PUBLISH_OPERATIONS,
    Distribution,
    FailureFigure,
    GapFigure,
    LatencyFigure,
    NodeFigure,
    NodeWindow,
    OpGroup,
    PendingReasonFigure,
    PodPendingFigure,
    PodReadyFigure,
    Report,
    ReportInputs,
    ReportQuery,
    SeriesBucket,
    SeriesPoint,
    SpanRow,
    UncertainNode,
    UncertainNow,
    UncertainTotals,
    UncertainVolume,
    build_report,
    distribution,
    failure_figures,
    in_window,
    op_groups,
    percentile,
    series_buckets,
    series_frame,
    uncertain_totals,
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
    whole_us,
)
from projections.analytics.health import (
    HEALTH_TYPES,
    NEAR_FULL,
    AbnormalFigure,
    HealthFold,
    NearFullFigure,
    VolumeHealth,
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
    "FOREVER_US",
    "HEALTH_TYPES",
    "NEAR_FULL",
    "PHASES",
    "PUBLISH_OPERATIONS",
    "ROW_COLUMNS",
    "STAGE_OF",
    "AbnormalFigure",
    "AnalyticsFold",
    "Distribution",
    "EventRow",
    "FailureFigure",
    "FoldChanges",
    "GapFigure",
    "HealthFold",
    "LatencyFigure",
    "MemoryFacts",
    "NearFullFigure",
    "NodeFigure",
    "NodeStats",
    "NodeWindow",
    "OpGroup",
    "OpRow",
    "OpSample",
    "OpenOp",
    "PendingPod",
    "PendingReasonFigure",
    "PodPendingFigure",
    "PodReady",
    "PodReadyFigure",
    "Report",
    "ReportInputs",
    "ReportQuery",
    "SeriesBucket",
    "SeriesPoint",
    "SpanRow",
    "UncertainNode",
    "UncertainNow",
    "UncertainSpan",
    "UncertainTotals",
    "UncertainVolume",
    "VolumeHealth",
    "build_report",
    "distribution",
    "driver_of",
    "failure_figures",
    "flatten",
    "flatten_json",
    "in_window",
    "op_groups",
    "percentile",
    "phase_of",
    "report_of",
    "series_buckets",
    "series_frame",
    "uncertain_totals",
    "whole_us",
]

"""The report of a set of envelopes computed in memory, without a store."""

from __future__ import annotations

from collections.abc import Iterable

from events.types import Envelope
from projections.analytics.figures import (
    NodeWindow,
    Report,
    ReportInputs,
    ReportQuery,
    build_report,
    distribution,
    failure_figures,
    in_window,
    op_groups,
    series_buckets,
    series_frame,
    uncertain_totals,
)
from projections.analytics.fold import AnalyticsFold, OpSample, PodReady, UncertainSpan
from projections.analytics.rows import EventRow, flatten
from projections.analytics.waits import PodWait, wait_row


class MemoryFacts:
    """Collects a fold's facts in memory: the report of a set of rows without a store."""

    def __init__(self) -> None:
        self.fold = AnalyticsFold()
        self.samples: list[OpSample] = []
        self.closed: list[UncertainSpan] = []
        self.ready: list[PodReady] = []
        self.waits: list[PodWait] = []
        self.rows: list[EventRow] = []

    def apply(self, row: EventRow) -> None:
        """Fold one row and keep what it produced."""
        self.fold.apply(row)
        self.rows.append(row)
        changes = self.fold.drain()
        self.samples.extend(changes.samples)
        self.closed.extend(changes.closed_spans)
        self.ready.extend(changes.ready)
        self.waits.extend(changes.waits)

    def windows(self, query: ReportQuery) -> dict[str, NodeWindow] | None:
        """Per node: events in the window (None when the window is open at both ends)."""
        if query.since_us is None and query.until_us is None:
            return None
        windows: dict[str, NodeWindow] = {}
        for row in self.rows:
            if not in_window(query, row.ts_us):
                continue
            win = windows.get(row.node)
            if win is None:
                windows[row.node] = NodeWindow(1, row.ts_us, row.ts_us)
            else:
                win.events += 1
                win.first_us = min(win.first_us, row.ts_us)
                win.last_us = max(win.last_us, row.ts_us)
        return windows

    def inputs(self, query: ReportQuery) -> ReportInputs:
        """The report's aggregates over the window of `query`."""
        ops = [s.figure_row() for s in self.samples if in_window(query, s.ended_us)]
        start, width = series_frame(query, min((o[2] for o in ops), default=None))
        closed = [
            (s.node, s.volume_id, s.kind, s.from_us, s.to_us)
            for s in self.closed
            if s.to_us is not None
        ]
        open_spans = list(self.fold.open_spans.values())
        return ReportInputs(
            op_groups=op_groups(ops),
            failures=failure_figures(ops),
            series=series_buckets(ops, start, width, max(1, query.buckets)),
            bucket_us=width,
            uncertain=uncertain_totals(closed, open_spans, query),
            open_spans=open_spans,
            nodes=list(self.fold.nodes.values()),
            windows=self.windows(query),
            gaps=[],
            pod_ready=distribution(
                r.ready_us - r.added_us for r in self.ready if in_window(query, r.ready_us)
            ),
            pending_pods=len(self.fold.pending_pods),
            health=list(self.fold.health.volumes.values()),
            waits=[wait_row(w) for w in self.waits if in_window(query, w.to_us)],
            open_waits=list(self.fold.waits.open.values()),
        )


def report_of(
    envelopes: Iterable[Envelope],
    *,
    now_us: int,
    since_us: int | None = None,
    until_us: int | None = None,
    lag_threshold_s: float = 300.0,
    stuck_threshold_s: float = 600.0,
    top: int = 100,
) -> Report:
    """The report of envelopes (of one or many nodes, each in `seq` order), in memory."""
    facts = MemoryFacts()
    for env in envelopes:
        facts.fold.waits.apply(env)  # a PodPending's reasons are not in its row
        facts.apply(flatten(env))
        facts.fold.health.apply(env)
    query = ReportQuery(
        now_us=now_us,
        since_us=since_us,
        until_us=until_us,
        lag_threshold_s=lag_threshold_s,
        stuck_threshold_s=stuck_threshold_s,
        top=top,
    )
    return build_report(facts.inputs(query), query)

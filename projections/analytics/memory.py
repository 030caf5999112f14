"""The report of a set of envelopes computed in memory, without a store."""

from __future__ import annotations

from collections.abc import Iterable

from events.types import Envelope
from projections.analytics.figures import NodeWindow, Report, ReportInputs, build_report
from projections.analytics.fold import AnalyticsFold, OpSample, PodReady, UncertainSpan
from projections.analytics.rows import EventRow, flatten


class MemoryFacts:
    """Collects a fold's facts in memory: the report of a set of rows without a store."""

    def __init__(self) -> None:
        self.fold = AnalyticsFold()
        self.samples: list[OpSample] = []
        self.closed: list[UncertainSpan] = []
        self.ready: list[PodReady] = []
        self.rows: list[EventRow] = []

    def apply(self, row: EventRow) -> None:
        """Fold one row and keep what it produced."""
        self.fold.apply(row)
        self.rows.append(row)
        changes = self.fold.drain()
        self.samples.extend(changes.samples)
        self.closed.extend(changes.closed_spans)
        self.ready.extend(changes.ready)

    def inputs(self, since_us: int | None = None) -> ReportInputs:
        """The report inputs over rows / facts at or after `since_us`."""
        windows: dict[str, NodeWindow] | None = None
        if since_us is not None:
            windows = {}
            for row in self.rows:
                if row.ts_us < since_us:
                    continue
                win = windows.get(row.node)
                if win is None:
                    windows[row.node] = NodeWindow(1, row.ts_us, row.ts_us)
                else:
                    win.events += 1
                    win.first_us = min(win.first_us, row.ts_us)
                    win.last_us = max(win.last_us, row.ts_us)
        cut = since_us if since_us is not None else -(2**62)
        return ReportInputs(
            ops=[s.figure_row() for s in self.samples if s.ended_us >= cut],
            closed_spans=[
                (s.node, s.volume_id, s.kind, s.from_us, s.to_us)
                for s in self.closed
                if s.to_us is not None
            ],
            open_spans=list(self.fold.open_spans.values()),
            nodes=list(self.fold.nodes.values()),
            windows=windows,
            gaps=[],
            pod_ready_s=[(r.ready_us - r.added_us) / 1e6 for r in self.ready if r.ready_us >= cut],
            pending_pods=len(self.fold.pending_pods),
        )


def report_of(
    envelopes: Iterable[Envelope],
    *,
    now_us: int,
    since_us: int | None = None,
    lag_threshold_s: float = 300.0,
    stuck_threshold_s: float = 600.0,
) -> Report:
    """The report of envelopes (of one or many nodes, each in `seq` order), in memory."""
    facts = MemoryFacts()
    for env in envelopes:
        facts.apply(flatten(env))
    return build_report(
        facts.inputs(since_us),
        now_us=now_us,
        since_us=since_us,
        lag_threshold_s=lag_threshold_s,
        stuck_threshold_s=stuck_threshold_s,
    )

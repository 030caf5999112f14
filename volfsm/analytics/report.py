"""The analytics report read from a store: figures, JSON form and tables.

`store_report` takes one snapshot of the store, has DuckDB reduce the
facts the aggregators committed (finished operations, Uncertain spans, pod
readiness) to the report's aggregates over the window, and hands them with
the node counters and applied ranges to `projections.analytics.build_report`;
the JSON and `/metrics` are two renderings of that one `Report`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, TextIO

import duckdb
import msgspec

from projections.analytics import NEAR_FULL, Report, ReportInputs, ReportQuery, build_report
from volfsm.analytics.defaults import (
    DEFAULT_LAG_THRESHOLD_S,
    DEFAULT_STUCK_THRESHOLD_S,
    DEFAULT_TOP_VOLUMES,
)
from volfsm.analytics.query import StoreQuery
from volfsm.analytics.store import AnalyticsStore, IngestCounters, Snapshot
from volfsm.render import fmt_bytes, fmt_ts, print_line, print_table


@dataclass(frozen=True, slots=True)
class ReportOptions:
    """What a report covers and which thresholds it applies."""

    since_us: int | None = None
    until_us: int | None = None
    lag_threshold_s: float = DEFAULT_LAG_THRESHOLD_S
    stuck_threshold_s: float = DEFAULT_STUCK_THRESHOLD_S
    buckets: int = 24
    top: int = DEFAULT_TOP_VOLUMES
    near_full_threshold: float = NEAR_FULL

    def query(self, now_us: int | None = None) -> ReportQuery:
        """The window and thresholds as of `now_us` (default: now)."""
        return ReportQuery(
            now_us=now_us if now_us is not None else time.time_ns() // 1000,
            since_us=self.since_us,
            until_us=self.until_us,
            lag_threshold_s=self.lag_threshold_s,
            stuck_threshold_s=self.stuck_threshold_s,
            buckets=self.buckets,
            top=self.top,
            near_full_threshold=self.near_full_threshold,
        )


def snapshot_inputs(snapshot: Snapshot, query: ReportQuery) -> ReportInputs:
    """The report's aggregates over one store snapshot (DuckDB does the reducing)."""
    with StoreQuery(snapshot) as engine:
        return engine.inputs(query)


def snapshot_report(
    snapshot: Snapshot, options: ReportOptions | None = None, *, now_us: int | None = None
) -> Report:
    """The report of one store snapshot (as of `now_us`, default: now)."""
    query = (options or ReportOptions()).query(now_us)
    return build_report(snapshot_inputs(snapshot, query), query)


def store_report(
    store: AnalyticsStore, options: ReportOptions | None = None, *, now_us: int | None = None
) -> Report:
    """The report of everything in `store` (as of `now_us`, default: now)."""
    return report_and_counters(store, options, now_us=now_us)[0]


def report_and_counters(
    store: AnalyticsStore, options: ReportOptions | None = None, *, now_us: int | None = None
) -> tuple[Report, IngestCounters]:
    """The report and the aggregators' counters, of one snapshot of `store`.

    A snapshot names files a merge may delete a while later; a report that
    finds one gone is computed again on a new snapshot.
    """
    for attempt in range(3):
        snapshot = store.snapshot()
        try:
            return snapshot_report(snapshot, options, now_us=now_us), snapshot.counters
        except duckdb.IOException:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def report_document(report: Report, ingest: IngestCounters | None = None) -> dict[str, Any]:
    """The report as plain JSON-able data (the `-o json` output and `/api/report`)."""
    doc: dict[str, Any] = msgspec.to_builtins(report)
    if ingest is not None:
        doc["ingest"] = msgspec.to_builtins(ingest)
    return doc


def _s(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def print_report(report: Report, ingest: IngestCounters | None, out: TextIO | None = None) -> None:
    """The report as tables."""
    since = f" since {fmt_ts(report.since_us)}" if report.since_us is not None else ""
    until = f" until {fmt_ts(report.until_us)}" if report.until_us is not None else ""
    print_line(f"volfsm analytics report at {fmt_ts(report.generated_us)}{since}{until}", out)
    print_line(f"events: {report.events}, nodes: {len(report.nodes)}", out)
    if ingest is not None:
        print_line(
            f"ingest: {ingest.applied} applied, {ingest.duplicates} redeliveries skipped, "
            f"{ingest.undecodable} undecodable, {ingest.gaps_noticed} gaps noticed",
            out,
        )
    print_table(
        "\nOperations",
        ("DRIVER", "PHASE", "OPERATION", "COUNT", "FAILED", "P50 S", "P90 S", "P99 S"),
        [
            (
                f.driver,
                f.phase,
                f.operation,
                str(f.count),
                str(f.failed),
                _s(f.p50_s),
                _s(f.p90_s),
                _s(f.p99_s),
            )
            for f in report.latency
        ],
        out,
    )
    print_table(
        "\nFailures",
        ("DRIVER", "OPERATION", "CODE", "FINAL", "COUNT"),
        [
            (f.driver, f.operation, f.code, "final" if f.final else "non-final", str(f.count))
            for f in report.failures
        ],
        out,
    )
    print_table(
        f"\nUncertain now (stuck: longer than {report.stuck_threshold_s:g}s)",
        ("NODE", "KIND", "VOLUME", "POD", "SINCE", "SECONDS", "STUCK"),
        [
            (
                u.node,
                u.kind,
                u.volume_id,
                u.pod_uid,
                fmt_ts(u.since_us),
                f"{u.seconds:.1f}",
                "stuck" if u.stuck else "",
            )
            for u in report.uncertain_now
        ],
        out,
    )
    shown = min(20, len(report.uncertain_volumes))
    print_table(
        f"\nTime Uncertain per volume (top {shown} of {report.uncertain_volumes_total})",
        ("NODE", "KIND", "VOLUME", "SECONDS", "SPANS"),
        [
            (u.node, u.kind, u.volume_id, f"{u.seconds:.3f}", str(u.spans))
            for u in report.uncertain_volumes[:20]
        ],
        out,
    )
    print_table(
        f"\nNodes (lagging: silent longer than {report.lag_threshold_s:g}s)",
        (
            "NODE",
            "EVENTS",
            "EV/S",
            "LAST SEQ",
            "LAST EVENT",
            "SILENT S",
            "LAGGING",
            "PUBLISH LAG S",
            "RESTARTS",
            "RECONSTRUCTED",
            "GAPS",
        ),
        [
            (
                n.node,
                str(n.events),
                f"{n.rate_ev_s:g}",
                str(n.last_seq),
                fmt_ts(n.last_event_us),
                f"{n.silent_s:.1f}",
                "lagging" if n.lagging else "",
                f"{n.publish_lag_s:.3f}",
                str(n.restarts),
                str(n.reconstructions),
                f"{n.gaps} ({n.missing_events} missing)" if n.gaps else "0",
            )
            for n in report.nodes
        ],
        out,
    )
    print_table(
        "\nGaps",
        ("NODE", "FROM SEQ", "TO SEQ", "MISSING"),
        [(g.node, str(g.from_seq), str(g.to_seq), str(g.missing)) for g in report.gaps],
        out,
    )
    _print_health(report, out)
    pr = report.pod_ready
    print_line(
        f"\nPod mount-to-ready: {pr.count} pods ready, {pr.pending} pending; "
        f"p50 {_s(pr.p50_s)}s p90 {_s(pr.p90_s)}s p99 {_s(pr.p99_s)}s max {_s(pr.max_s)}s",
        out,
    )
    _print_pending(report, out)


def _print_pending(report: Report, out: TextIO | None) -> None:
    """Pods that waited for their claims: whole waits, then the time per missing object."""
    pp = report.pod_pending
    longest = f" (longest {_s(pp.waiting_longest_s)}s)" if pp.waiting_longest_s is not None else ""
    print_line(
        f"Pods waiting for their claims (no driver's time; not in mount-to-ready): {pp.pods} "
        f"waited ({pp.resolved} resolved, {pp.deleted} deleted while pending), "
        f"{pp.waiting} waiting now{longest}; p50 {_s(pp.p50_s)}s p90 {_s(pp.p90_s)}s "
        f"p99 {_s(pp.p99_s)}s max {_s(pp.max_s)}s",
        out,
    )
    if not pp.by_reason:
        return
    print_table(
        "\nWaiting for (steps of the waits above, by what was missing)",
        ("REASON", "PODS", "STEPS", "P50 S", "P90 S", "P99 S", "MAX S", "TOTAL S", "NOW"),
        [
            (
                f.reason,
                str(f.pods),
                str(f.waits),
                _s(f.p50_s),
                _s(f.p90_s),
                _s(f.p99_s),
                _s(f.max_s),
                f"{f.sum_s:.3f}",
                str(f.waiting),
            )
            for f in pp.by_reason
        ],
        out,
    )


def _print_health(report: Report, out: TextIO | None) -> None:
    """The "volumes near full" and "abnormal volumes" sections."""
    print_table(
        f"\nVolumes near full (at or above {report.near_full_threshold:.0%}; "
        f"top {len(report.near_full)} of {report.near_full_total})",
        ("NODE", "NAMESPACE", "CLAIM", "VOLUME", "USED", "CAPACITY", "USED %", "INODES %", "AT"),
        [
            (
                f.node,
                f.namespace,
                f.claim,
                f.volume_id,
                fmt_bytes(f.used_bytes),
                fmt_bytes(f.capacity_bytes),
                f"{f.share:.1%}",
                f"{f.inode_share:.1%}",
                fmt_ts(f.recorded_us),
            )
            for f in report.near_full
        ],
        out,
    )
    print_table(
        f"\nAbnormal volumes (top {len(report.abnormal)} of {report.abnormal_total})",
        ("NODE", "NAMESPACE", "CLAIM", "VOLUME", "POD", "SINCE", "MESSAGE"),
        [
            (f.node, f.namespace, f.claim, f.volume_id, f.pod_uid, fmt_ts(f.since_us), f.message)
            for f in report.abnormal
        ],
        out,
    )

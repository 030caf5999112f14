"""Report figures: latency percentiles, failures, Uncertain time, nodes, pod readiness,
latency over time.

A report is built in two steps. First the facts are reduced to aggregates
(`ReportInputs`: per (driver, operation) counts and percentiles, failure
counts, series buckets, Uncertain totals, pod readiness): the functions
here do it in Python over fact tuples (the in-memory report), and the
store does the same in SQL over its columns. Then `build_report` turns the
aggregates into figures, the same code for both.

Durations are whole microseconds (`duration_us`), so sums are exact
whichever engine adds them. Percentiles are nearest-rank: the p-th
percentile of n sorted values is the value at rank ceil(p/100 * n) (SQL's
`percentile_disc`). Latency percentiles count succeeded operations; failed
ones are counted apart (their time is usually a timeout).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from projections.analytics.fold import NodeStats, OpRow, UncertainSpan
from projections.analytics.health import (
    NEAR_FULL,
    AbnormalFigure,
    HealthFold,
    NearFullFigure,
    VolumeHealth,
)
from projections.analytics.rows import PHASE_ORDER, PHASES, phase_of
from projections.analytics.waits import DELETED, ENDS_A_WAIT, RESOLVED, OpenWait, WaitRow

FOREVER_US = 2**62
"""An open end of a window (µs), far past any event."""

PUBLISH_OPERATIONS = tuple(op for op, phase in PHASES.items() if phase == "publish")
"""Operations of the publish phase: the latency series follows them."""

# --------------------------------------------------------------------------
# Figures


Num = TypeVar("Num", int, float)


def percentile(sorted_values: Sequence[Num], p: float) -> Num | None:
    """Nearest-rank percentile of ascending values (None when there are none)."""
    n = len(sorted_values)
    if n == 0:
        return None
    rank = max(1, math.ceil(p / 100.0 * n))
    return sorted_values[min(rank, n) - 1]


@dataclass(slots=True)
class LatencyFigure:
    """Counts and latency of one (driver, operation); percentiles over succeeded ones."""

    driver: str
    operation: str
    phase: str
    count: int
    succeeded: int
    failed: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    mean_s: float | None
    max_s: float | None
    sum_s: float


@dataclass(slots=True)
class FailureFigure:
    """How often one (driver, operation) failed with one code, final or not."""

    driver: str
    operation: str
    code: str
    final: bool
    count: int


@dataclass(slots=True)
class UncertainVolume:
    """Total time one volume sat Uncertain on one node, at device or pod-volume level."""

    node: str
    volume_id: str
    kind: str
    seconds: float
    spans: int
    uncertain_now: bool


@dataclass(slots=True)
class UncertainNow:
    """A device or pod-volume Uncertain at report time; `stuck` past the threshold."""

    node: str
    stream: str
    kind: str
    volume_id: str
    pod_uid: str
    since_us: int
    seconds: float
    stuck: bool
    reconstructed: bool


@dataclass(slots=True)
class GapFigure:
    """Sequence numbers of a node never received (between two received ones)."""

    node: str
    from_seq: int
    to_seq: int
    missing: int


@dataclass(slots=True)
class NodeWindow:
    """A node's events inside the report window."""

    events: int
    first_us: int
    last_us: int


@dataclass(slots=True)
class NodeFigure:
    """One node: activity in the window, silence, publish lag, restarts, gaps."""

    node: str
    events: int
    rate_ev_s: float
    first_seq: int
    last_seq: int
    last_event_us: int
    silent_s: float
    lagging: bool
    publish_lag_s: float
    reconstructions: int
    restarts: int
    interrupted_ops: int
    gaps: int
    missing_events: int


@dataclass(slots=True)
class PodReadyFigure:
    """Mount-to-ready latency of pods (PodAdded -> all its volumes Mounted).

    A pod that waited for its claims is measured from the `PodAdded` that resolved it (its
    wait is in `PodPendingFigure`); `pending` counts pods added whose volumes are not all
    Mounted yet (not the pods waiting for their claims).
    """

    count: int
    pending: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    sum_s: float


@dataclass(slots=True)
class PendingReasonFigure:
    """Time pods waited for one kind of missing object, in steps that ended in the window."""

    reason: str
    pods: int
    """Distinct pods that waited for it."""
    waits: int
    """Steps (a pod waits one step per `PodPending`, until the next or its end)."""
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    sum_s: float
    waiting: int = 0
    """Pods waiting for it now."""


@dataclass(slots=True)
class PodPendingFigure:
    """Pods that waited for their claims (`PodPending` until `PodAdded` or `PodRemoved`).

    No volume operation runs while a pod waits, so this time is in no driver's latency
    and not in mount-to-ready. `pods`: waits that ended in the window (`resolved` by a
    `PodAdded`, `deleted` while pending); the percentiles are of those whole waits;
    `waiting`: pods waiting now, the longest for `waiting_longest_s`; `by_reason`: the time
    per kind of missing object, most time first.
    """

    pods: int = 0
    resolved: int = 0
    deleted: int = 0
    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None
    max_s: float | None = None
    sum_s: float = 0.0
    waiting: int = 0
    waiting_longest_s: float | None = None
    by_reason: list[PendingReasonFigure] = field(default_factory=list)


@dataclass(slots=True)
class SeriesPoint:
    """Publish latency of one driver in one time bucket."""

    driver: str
    bucket_us: int
    count: int
    p50_s: float
    p90_s: float


@dataclass(slots=True)
class UncertainNode:
    """Time one node's entries of one kind spent Uncertain inside the window."""

    node: str
    kind: str
    seconds: float
    volumes: int
    spans: int


@dataclass(slots=True)
class Report:
    """Every figure of an analytics report, as of `generated_us`, over events in
    [`since_us`, `until_us`) (None: open)."""

    generated_us: int
    since_us: int | None
    lag_threshold_s: float
    stuck_threshold_s: float
    events: int
    nodes: list[NodeFigure]
    latency: list[LatencyFigure]
    failures: list[FailureFigure]
    uncertain_volumes: list[UncertainVolume]
    """The `top` volumes with the most time Uncertain (all of them: `uncertain_volumes_total`)."""
    uncertain_now: list[UncertainNow]
    gaps: list[GapFigure]
    pod_ready: PodReadyFigure
    latency_series: list[SeriesPoint]
    bucket_s: float
    until_us: int | None = None
    uncertain_volumes_total: int = 0
    uncertain_by_node: list[UncertainNode] = field(default_factory=list)
    near_full_threshold: float = NEAR_FULL
    near_full: list[NearFullFigure] = field(default_factory=list)
    """The `top` fullest volumes at or above `near_full_threshold` (all: `near_full_total`)."""
    near_full_total: int = 0
    abnormal: list[AbnormalFigure] = field(default_factory=list)
    """The `top` volumes abnormal longest (all of them: `abnormal_total`)."""
    abnormal_total: int = 0
    pod_pending: PodPendingFigure = field(default_factory=PodPendingFigure)
    """Pods that waited for their claims: not in `pod_ready` nor in any latency."""


# --------------------------------------------------------------------------
# What a report covers, and the aggregates it is built from


@dataclass(frozen=True, slots=True)
class ReportQuery:
    """What a report covers: as of `now_us`, events in [`since_us`, `until_us`)."""

    now_us: int
    since_us: int | None = None
    until_us: int | None = None
    lag_threshold_s: float = 300.0
    stuck_threshold_s: float = 600.0
    buckets: int = 24
    top: int = 100
    """How many volumes `uncertain_volumes`, `near_full` and `abnormal` list."""
    near_full_threshold: float = NEAR_FULL
    """Used share (of bytes or inodes) from which a volume is near full."""

    @property
    def lo_us(self) -> int:
        """The window's start (a far past when open)."""
        return self.since_us if self.since_us is not None else -FOREVER_US

    @property
    def hi_us(self) -> int:
        """The window's end, excluded (a far future when open)."""
        return self.until_us if self.until_us is not None else FOREVER_US


@dataclass(slots=True)
class OpGroup:
    """One (driver, operation) in the window: counts, and percentiles of succeeded durations."""

    driver: str
    operation: str
    succeeded: int
    failed: int
    p50_us: int | None
    p90_us: int | None
    p99_us: int | None
    max_us: int | None
    sum_us: int


@dataclass(slots=True)
class SeriesBucket:
    """Succeeded publish operations of one driver ending in one time bucket."""

    driver: str
    bucket_us: int
    count: int
    p50_us: int
    p90_us: int


@dataclass(slots=True)
class Distribution:
    """Count, nearest-rank percentiles, max and sum of whole-µs values."""

    count: int = 0
    p50_us: int | None = None
    p90_us: int | None = None
    p99_us: int | None = None
    max_us: int | None = None
    sum_us: int = 0


@dataclass(slots=True)
class UncertainTotals:
    """Uncertain time in the window: the top volumes, how many there are, totals per node."""

    top: list[UncertainVolume]
    volumes: int
    by_node: list[UncertainNode]


@dataclass(slots=True)
class ReportInputs:
    """The aggregates a report is built from (computed in memory or by the store's engine)."""

    op_groups: list[OpGroup]
    failures: list[FailureFigure]
    series: list[SeriesBucket]
    bucket_us: int
    uncertain: UncertainTotals
    open_spans: list[UncertainSpan]
    nodes: list[NodeStats]
    windows: dict[str, NodeWindow] | None
    gaps: list[GapFigure]
    pod_ready: Distribution
    pending_pods: int
    health: list[VolumeHealth] = field(default_factory=list)
    """The latest usage and condition of each mounted pod-volume (as of now, not windowed)."""
    waits: list[WaitRow] = field(default_factory=list)
    """Steps of pods' waits for their claims that ended in the window."""
    open_waits: list[OpenWait] = field(default_factory=list)
    """Pods waiting for their claims now (not windowed)."""


def series_frame(query: ReportQuery, first_ended_us: int | None) -> tuple[int, int]:
    """(start, bucket width) of the latency series, both in µs.

    It starts at `since` (else at the first operation ended in the window,
    else now) and ends at `until` (else now), in `query.buckets` buckets.
    """
    if query.since_us is not None:
        start = query.since_us
    else:
        start = first_ended_us if first_ended_us is not None else query.now_us
    end = max(query.until_us if query.until_us is not None else query.now_us, start + 1)
    buckets = max(1, query.buckets)
    return start, max(1, -(-(end - start) // buckets))


def _sort_key_phase(item: LatencyFigure) -> tuple[str, int, str]:
    return (item.driver, PHASE_ORDER.index(item.phase), item.operation)


def in_window(query: ReportQuery, us: int) -> bool:
    """True if `us` lies in the query's window."""
    return query.lo_us <= us < query.hi_us


# --------------------------------------------------------------------------
# Aggregates in Python (the reference the store's SQL matches)


def distribution(values_us: Iterable[int]) -> Distribution:
    """Count, percentiles, max and sum of whole-µs values."""
    values = sorted(values_us)
    if not values:
        return Distribution()
    return Distribution(
        len(values),
        percentile(values, 50),
        percentile(values, 90),
        percentile(values, 99),
        values[-1],
        sum(values),
    )


def op_groups(ops: Iterable[OpRow]) -> list[OpGroup]:
    """Per (driver, operation): counts and the distribution of succeeded durations."""
    ok: dict[tuple[str, str], list[int]] = defaultdict(list)
    failed: dict[tuple[str, str], int] = defaultdict(int)
    for driver, operation, _ended, duration_us, is_failed, _code, _final in ops:
        key = (driver, operation)
        if is_failed:
            failed[key] += 1
        else:
            ok[key].append(duration_us)
    groups = []
    for key in set(ok) | set(failed):
        d = distribution(ok.get(key, ()))
        groups.append(
            OpGroup(
                *key, d.count, failed.get(key, 0), d.p50_us, d.p90_us, d.p99_us, d.max_us, d.sum_us
            )
        )
    return groups


def failure_figures(ops: Iterable[OpRow]) -> list[FailureFigure]:
    """Failed operations counted by (driver, operation, code, final)."""
    counts: dict[tuple[str, str, str, bool], int] = defaultdict(int)
    for driver, operation, _ended, _duration, is_failed, code, final in ops:
        if is_failed:
            counts[(driver, operation, code, bool(final))] += 1
    return [FailureFigure(d, o, c, f, n) for (d, o, c, f), n in counts.items()]


def series_buckets(
    ops: Iterable[OpRow], start_us: int, width_us: int, buckets: int
) -> list[SeriesBucket]:
    """Succeeded publish operations per driver and time bucket, ended at or after `start_us`."""
    grouped: dict[tuple[str, int], list[int]] = defaultdict(list)
    for driver, operation, ended, duration_us, is_failed, _code, _final in ops:
        if is_failed or ended < start_us or operation not in PUBLISH_OPERATIONS:
            continue
        bucket = min(buckets - 1, (ended - start_us) // width_us)
        grouped[(driver, start_us + bucket * width_us)].append(duration_us)
    result = []
    for (driver, bucket_us), values in grouped.items():
        d = distribution(values)
        assert d.p50_us is not None and d.p90_us is not None
        result.append(SeriesBucket(driver, bucket_us, d.count, d.p50_us, d.p90_us))
    return result


SpanRow = tuple[str, str, str, int, int]
"""(node, volume_id, kind, from_us, to_us) of a closed Uncertain span."""


def uncertain_totals(
    closed: Iterable[SpanRow], open_spans: Iterable[UncertainSpan], query: ReportQuery
) -> UncertainTotals:
    """Time Uncertain per (node, volume, kind) inside the window, open spans up to now.

    A closed span counts if it ended at or after `since` and began before
    `until`; an open one if it began before `until`.
    """
    lo, hi = query.lo_us, query.hi_us
    totals: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for node, volume_id, kind, from_us, to_us in closed:
        if to_us >= lo and from_us < hi:
            acc = totals[(node, volume_id, kind)]
            acc[0] += max(0, min(to_us, hi) - max(from_us, lo))
            acc[1] += 1
    for span in open_spans:
        if span.from_us < hi:
            acc = totals[(span.node, span.volume_id, span.kind)]
            acc[0] += max(0, min(query.now_us, hi) - max(span.from_us, lo))
            acc[1] += 1
            acc[2] = 1
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][0], kv[0]))
    top = [
        UncertainVolume(node, vid, kind, acc[0] / 1e6, acc[1], acc[2] > 0)
        for (node, vid, kind), acc in ranked[: max(0, query.top)]
    ]
    per_node: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for (node, _vid, kind), acc in totals.items():
        entry = per_node[(node, kind)]
        entry[0] += acc[0]
        entry[1] += 1
        entry[2] += acc[1]
    by_node = [
        UncertainNode(node, kind, e[0] / 1e6, e[1], e[2])
        for (node, kind), e in sorted(per_node.items())
    ]
    return UncertainTotals(top, len(totals), by_node)


# --------------------------------------------------------------------------
# Figures from aggregates (one code for both)


def _s(us: int | None) -> float | None:
    return None if us is None else us / 1e6


def latency_figures(groups: Iterable[OpGroup]) -> list[LatencyFigure]:
    """Latency figures, by driver, phase and operation."""
    result = [
        LatencyFigure(
            driver=g.driver,
            operation=g.operation,
            phase=phase_of(g.operation),
            count=g.succeeded + g.failed,
            succeeded=g.succeeded,
            failed=g.failed,
            p50_s=_s(g.p50_us),
            p90_s=_s(g.p90_us),
            p99_s=_s(g.p99_us),
            mean_s=g.sum_us / g.succeeded / 1e6 if g.succeeded else None,
            max_s=_s(g.max_us),
            sum_s=g.sum_us / 1e6,
        )
        for g in groups
    ]
    result.sort(key=_sort_key_phase)
    return result


def uncertain_now(
    open_spans: Iterable[UncertainSpan], now_us: int, stuck_threshold_s: float
) -> list[UncertainNow]:
    """What is Uncertain now, longest first; `stuck` past the threshold."""
    result = []
    for span in open_spans:
        seconds = max(0, now_us - span.from_us) / 1e6
        result.append(
            UncertainNow(
                span.node,
                span.stream,
                span.kind,
                span.volume_id,
                span.pod_uid,
                span.from_us,
                seconds,
                seconds > stuck_threshold_s,
                span.reconstructed,
            )
        )
    result.sort(key=lambda u: (-u.seconds, u.node, u.stream))
    return result


def node_figures(
    stats: Iterable[NodeStats],
    windows: dict[str, NodeWindow] | None,
    gaps: Sequence[GapFigure],
    now_us: int,
    lag_threshold_s: float,
) -> list[NodeFigure]:
    """Per node: events in the window (all when `windows` is None) and its rate, silence, lag.

    A node is lagging when its last event is older than `lag_threshold_s` at
    `now_us` (a node that is idle looks the same until nodes send heartbeats).
    """
    gap_count: dict[str, int] = defaultdict(int)
    missing: dict[str, int] = defaultdict(int)
    for gap in gaps:
        gap_count[gap.node] += 1
        missing[gap.node] += gap.missing
    result = []
    for st in sorted(stats, key=lambda s: s.node):
        if windows is None:
            win = NodeWindow(st.events, st.first_us, st.last_us)
        else:
            win = windows.get(st.node, NodeWindow(0, 0, 0))
        span_s = max(1.0, (win.last_us - win.first_us) / 1e6)
        silent_s = max(0, now_us - st.last_us) / 1e6
        result.append(
            NodeFigure(
                node=st.node,
                events=win.events,
                rate_ev_s=round(win.events / span_s, 3) if win.events else 0.0,
                first_seq=st.first_seq,
                last_seq=st.last_seq,
                last_event_us=st.last_us,
                silent_s=silent_s,
                lagging=silent_s > lag_threshold_s,
                publish_lag_s=st.publish_lag_s,
                reconstructions=st.reconstructions,
                restarts=st.restarts,
                interrupted_ops=st.interrupted_ops,
                gaps=gap_count.get(st.node, 0),
                missing_events=missing.get(st.node, 0),
            )
        )
    return result


def pod_ready_figure(ready: Distribution, pending: int) -> PodReadyFigure:
    """Percentiles of pod mount-to-ready durations."""
    return PodReadyFigure(
        count=ready.count,
        pending=pending,
        p50_s=_s(ready.p50_us),
        p90_s=_s(ready.p90_us),
        p99_s=_s(ready.p99_us),
        max_s=_s(ready.max_us),
        sum_s=ready.sum_us / 1e6,
    )


def pod_pending_figure(
    waits: Iterable[WaitRow], open_waits: Iterable[OpenWait], now_us: int
) -> PodPendingFigure:
    """Whole waits, per-reason steps and the pods waiting now (`waits`: the window's)."""
    rows = list(waits)
    ended = [r for r in rows if r[6] in ENDS_A_WAIT]
    whole = distribution(r[5] - r[3] for r in ended)
    by_reason: dict[str, list[WaitRow]] = defaultdict(list)
    for r in rows:
        by_reason[r[2]].append(r)
    now: dict[str, int] = defaultdict(int)
    waiting = list(open_waits)
    for w in waiting:
        now[w.reason] += 1
    reasons = []
    for reason in set(by_reason) | set(now):
        steps = by_reason.get(reason, [])
        d = distribution(r[5] - r[4] for r in steps)
        pods = len({(r[0], r[1]) for r in steps})
        reasons.append(
            PendingReasonFigure(
                reason,
                pods,
                d.count,
                _s(d.p50_us),
                _s(d.p90_us),
                _s(d.p99_us),
                _s(d.max_us),
                d.sum_us / 1e6,
                now.get(reason, 0),
            )
        )
    reasons.sort(key=lambda f: (-f.sum_s, -f.waiting, f.reason))
    longest = max((now_us - w.since_us for w in waiting), default=None)
    return PodPendingFigure(
        pods=len(ended),
        resolved=sum(1 for r in ended if r[6] == RESOLVED),
        deleted=sum(1 for r in ended if r[6] == DELETED),
        p50_s=_s(whole.p50_us),
        p90_s=_s(whole.p90_us),
        p99_s=_s(whole.p99_us),
        max_s=_s(whole.max_us),
        sum_s=whole.sum_us / 1e6,
        waiting=len(waiting),
        waiting_longest_s=_s(max(0, longest)) if longest is not None else None,
        by_reason=reasons,
    )


def build_report(inputs: ReportInputs, query: ReportQuery) -> Report:
    """Every figure from the aggregates of the window `query` names."""
    nodes = node_figures(
        inputs.nodes, inputs.windows, inputs.gaps, query.now_us, query.lag_threshold_s
    )
    failures = sorted(
        inputs.failures, key=lambda x: (-x.count, x.driver, x.operation, x.code, x.final)
    )
    series = [
        SeriesPoint(b.driver, b.bucket_us, b.count, b.p50_us / 1e6, b.p90_us / 1e6)
        for b in sorted(inputs.series, key=lambda b: (b.driver, b.bucket_us))
    ]
    return Report(
        generated_us=query.now_us,
        since_us=query.since_us,
        lag_threshold_s=query.lag_threshold_s,
        stuck_threshold_s=query.stuck_threshold_s,
        events=sum(n.events for n in nodes),
        nodes=nodes,
        latency=latency_figures(inputs.op_groups),
        failures=failures,
        uncertain_volumes=inputs.uncertain.top,
        uncertain_now=uncertain_now(inputs.open_spans, query.now_us, query.stuck_threshold_s),
        gaps=list(inputs.gaps),
        pod_ready=pod_ready_figure(inputs.pod_ready, inputs.pending_pods),
        latency_series=series,
        bucket_s=inputs.bucket_us / 1e6,
        until_us=query.until_us,
        uncertain_volumes_total=inputs.uncertain.volumes,
        uncertain_by_node=inputs.uncertain.by_node,
        pod_pending=pod_pending_figure(inputs.waits, inputs.open_waits, query.now_us),
        **health_figures(inputs.health, query),
    )


def health_figures(health: Iterable[VolumeHealth], query: ReportQuery) -> dict[str, Any]:
    """The report's "volumes near full" and "abnormal volumes" fields, `query.top` of each."""
    fold = HealthFold({(v.node, v.pod_uid, v.volume_name): v for v in health})
    full, abnormal = fold.near_full(query.near_full_threshold), fold.abnormal()
    top = max(0, query.top)
    return {
        "near_full_threshold": query.near_full_threshold,
        "near_full": full[:top],
        "near_full_total": len(full),
        "abnormal": abnormal[:top],
        "abnormal_total": len(abnormal),
    }

"""Report figures computed from fact tuples: latency percentiles, failures, Uncertain time,
nodes, pod readiness, latency over time.

Percentiles are nearest-rank: the p-th percentile of n sorted values is the
value at rank ceil(p/100 * n). Latency percentiles count succeeded
operations; failed ones are counted apart (their time is usually a timeout).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from projections.analytics.fold import NodeStats, OpRow, UncertainSpan
from projections.analytics.rows import PHASE_ORDER, PHASES, phase_of

# --------------------------------------------------------------------------
# Figures


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
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
    """Mount-to-ready latency of pods (PodAdded -> all its volumes Mounted)."""

    count: int
    pending: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    sum_s: float


@dataclass(slots=True)
class SeriesPoint:
    """Publish latency of one driver in one time bucket."""

    driver: str
    bucket_us: int
    count: int
    p50_s: float
    p90_s: float


@dataclass(slots=True)
class Report:
    """Every figure of an analytics report, as of `generated_us`, over events since `since_us`."""

    generated_us: int
    since_us: int | None
    lag_threshold_s: float
    stuck_threshold_s: float
    events: int
    nodes: list[NodeFigure]
    latency: list[LatencyFigure]
    failures: list[FailureFigure]
    uncertain_volumes: list[UncertainVolume]
    uncertain_now: list[UncertainNow]
    gaps: list[GapFigure]
    pod_ready: PodReadyFigure
    latency_series: list[SeriesPoint]
    bucket_s: float


def _sort_key_phase(item: LatencyFigure) -> tuple[str, int, str]:
    return (item.driver, PHASE_ORDER.index(item.phase), item.operation)


def latency_figures(ops: Iterable[OpRow]) -> list[LatencyFigure]:
    """Per (driver, operation): counts and p50/p90/p99/mean/max of succeeded durations."""
    ok: dict[tuple[str, str], list[float]] = defaultdict(list)
    failed: dict[tuple[str, str], int] = defaultdict(int)
    for driver, operation, _ended, duration, is_failed, _code, _final in ops:
        key = (driver, operation)
        if is_failed:
            failed[key] += 1
        else:
            ok[key].append(duration)
    result = []
    for key in sorted(set(ok) | set(failed)):
        values = sorted(ok.get(key, ()))
        n_fail = failed.get(key, 0)
        result.append(
            LatencyFigure(
                driver=key[0],
                operation=key[1],
                phase=phase_of(key[1]),
                count=len(values) + n_fail,
                succeeded=len(values),
                failed=n_fail,
                p50_s=percentile(values, 50),
                p90_s=percentile(values, 90),
                p99_s=percentile(values, 99),
                mean_s=math.fsum(values) / len(values) if values else None,
                max_s=values[-1] if values else None,
                sum_s=sum(values),
            )
        )
    result.sort(key=_sort_key_phase)
    return result


def failure_figures(ops: Iterable[OpRow]) -> list[FailureFigure]:
    """Failed operations counted by (driver, operation, code, final); most frequent first."""
    counts: dict[tuple[str, str, str, bool], int] = defaultdict(int)
    for driver, operation, _ended, _duration, is_failed, code, final in ops:
        if is_failed:
            counts[(driver, operation, code, bool(final))] += 1
    result = [FailureFigure(d, o, c, f, n) for (d, o, c, f), n in counts.items()]
    result.sort(key=lambda x: (-x.count, x.driver, x.operation, x.code, x.final))
    return result


def latency_series(
    ops: Iterable[OpRow], start_us: int, end_us: int, buckets: int
) -> tuple[list[SeriesPoint], float]:
    """Publish-phase latency per driver in `buckets` equal time buckets; (points, bucket_s)."""
    width = max(1, math.ceil(max(1, end_us - start_us) / max(1, buckets)))
    grouped: dict[tuple[str, int], list[float]] = defaultdict(list)
    for driver, operation, ended, duration, is_failed, _code, _final in ops:
        if is_failed or ended < start_us or PHASES.get(operation) != "publish":
            continue
        bucket = min(buckets - 1, (ended - start_us) // width)
        grouped[(driver, start_us + bucket * width)].append(duration)
    points = []
    for (driver, bucket_us), values in sorted(grouped.items()):
        values.sort()
        p50, p90 = percentile(values, 50), percentile(values, 90)
        assert p50 is not None and p90 is not None
        points.append(SeriesPoint(driver, bucket_us, len(values), p50, p90))
    return points, width / 1e6


def _overlap_s(from_us: int, to_us: int, since_us: int | None) -> float:
    start = from_us if since_us is None else max(from_us, since_us)
    return max(0, to_us - start) / 1e6


def uncertain_figures(
    closed: Iterable[tuple[str, str, str, int, int]],
    open_spans: Iterable[UncertainSpan],
    now_us: int,
    since_us: int | None,
    stuck_threshold_s: float,
) -> tuple[list[UncertainVolume], list[UncertainNow]]:
    """Time Uncertain per (node, volume, kind) inside the window, and what is Uncertain now.

    `closed` holds (node, volume_id, kind, from_us, to_us) of closed spans.
    Open spans count up to `now_us`.
    """
    totals: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for node, volume_id, kind, from_us, to_us in closed:
        if since_us is not None and to_us < since_us:
            continue
        acc = totals[(node, volume_id, kind)]
        acc[0] += _overlap_s(from_us, to_us, since_us)
        acc[1] += 1
    now_list = []
    for span in open_spans:
        acc = totals[(span.node, span.volume_id, span.kind)]
        acc[0] += _overlap_s(span.from_us, now_us, since_us)
        acc[1] += 1
        acc[2] = 1.0
        seconds = max(0, now_us - span.from_us) / 1e6
        now_list.append(
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
    volumes = [
        UncertainVolume(node, vid, kind, round(acc[0], 6), int(acc[1]), acc[2] > 0)
        for (node, vid, kind), acc in totals.items()
    ]
    volumes.sort(key=lambda v: (-v.seconds, v.node, v.volume_id, v.kind))
    now_list.sort(key=lambda u: (-u.seconds, u.node, u.stream))
    return volumes, now_list


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


def pod_ready_figure(durations_s: Iterable[float], pending: int) -> PodReadyFigure:
    """Percentiles of pod mount-to-ready durations."""
    values = sorted(durations_s)
    return PodReadyFigure(
        count=len(values),
        pending=pending,
        p50_s=percentile(values, 50),
        p90_s=percentile(values, 90),
        p99_s=percentile(values, 99),
        max_s=values[-1] if values else None,
        sum_s=sum(values),
    )


@dataclass(slots=True)
class ReportInputs:
    """The facts a report is computed from (in memory or read from a store)."""

    ops: list[OpRow]
    closed_spans: list[tuple[str, str, str, int, int]]
    open_spans: list[UncertainSpan]
    nodes: list[NodeStats]
    windows: dict[str, NodeWindow] | None
    gaps: list[GapFigure]
    pod_ready_s: list[float]
    pending_pods: int


def build_report(
    inputs: ReportInputs,
    *,
    now_us: int,
    since_us: int | None = None,
    lag_threshold_s: float = 300.0,
    stuck_threshold_s: float = 600.0,
    buckets: int = 24,
) -> Report:
    """Every figure from the facts. `inputs.ops` and `pod_ready_s` must already be cut to
    the window (ended / ready at or after `since_us`)."""
    ops = inputs.ops
    volumes, now_list = uncertain_figures(
        inputs.closed_spans, inputs.open_spans, now_us, since_us, stuck_threshold_s
    )
    nodes = node_figures(inputs.nodes, inputs.windows, inputs.gaps, now_us, lag_threshold_s)
    start = since_us if since_us is not None else min((o[2] for o in ops), default=now_us)
    series, bucket_s = latency_series(ops, start, max(now_us, start + 1), buckets)
    return Report(
        generated_us=now_us,
        since_us=since_us,
        lag_threshold_s=lag_threshold_s,
        stuck_threshold_s=stuck_threshold_s,
        events=sum(n.events for n in nodes),
        nodes=nodes,
        latency=latency_figures(ops),
        failures=failure_figures(ops),
        uncertain_volumes=volumes,
        uncertain_now=now_list,
        gaps=list(inputs.gaps),
        pod_ready=pod_ready_figure(inputs.pod_ready_s, inputs.pending_pods),
        latency_series=series,
        bucket_s=bucket_s,
    )

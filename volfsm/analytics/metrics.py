"""Prometheus text exposition (format 0.0.4) of the analytics report.

Labels stay low-cardinality: driver, operation, code, final, outcome, kind
and node. Volume ids and pod uids never become labels; they are in the
JSON report. Render a report built over the whole history (no `since`) so
counters only go up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from projections.analytics import NodeFigure, Report
from volfsm.analytics.store import IngestCounters

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "volfsm_analytics_"

Sample = tuple[dict[str, str], float]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


class Exposition:
    """Builds the text: one HELP/TYPE header per family, then its samples."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> None:
        """Add one metric family (`name` without the prefix)."""
        full = PREFIX + name
        self._lines.append(f"# HELP {full} {help_text}")
        self._lines.append(f"# TYPE {full} {kind}")
        for labels, value in samples:
            self._lines.append(f"{full}{_labels(labels)} {_number(value)}")

    def summary(
        self,
        name: str,
        help_text: str,
        series: Iterable[tuple[dict[str, str], dict[str, float | None], int, float]],
    ) -> None:
        """A summary family: (labels, {quantile: value}, count, sum) per series."""
        full = PREFIX + name
        self._lines.append(f"# HELP {full} {help_text}")
        self._lines.append(f"# TYPE {full} summary")
        for labels, quantiles, count, total in series:
            for q, value in quantiles.items():
                if value is not None:
                    ql = {**labels, "quantile": q}
                    self._lines.append(f"{full}{_labels(ql)} {_number(value)}")
            self._lines.append(f"{full}_sum{_labels(labels)} {_number(total)}")
            self._lines.append(f"{full}_count{_labels(labels)} {count}")

    def text(self) -> str:
        """The exposition text (ends with a newline)."""
        return "\n".join(self._lines) + "\n"


def _operations(exp: Exposition, report: Report) -> None:
    exp.summary(
        "operation_duration_seconds",
        "Duration of succeeded operations per driver and operation (stage derived).",
        (
            (
                {"driver": f.driver, "operation": f.operation},
                {"0.5": f.p50_s, "0.9": f.p90_s, "0.99": f.p99_s},
                f.succeeded,
                f.sum_s,
            )
            for f in report.latency
        ),
    )
    exp.family(
        "operations_total",
        "counter",
        "Finished operations per driver, operation and outcome.",
        (
            ({"driver": f.driver, "operation": f.operation, "outcome": outcome}, n)
            for f in report.latency
            for outcome, n in (("succeeded", f.succeeded), ("failed", f.failed))
        ),
    )
    exp.family(
        "operation_failures_total",
        "counter",
        "Failed operations per driver, operation, gRPC / plugin code and finality.",
        (
            (
                {
                    "driver": f.driver,
                    "operation": f.operation,
                    "code": f.code,
                    "final": "true" if f.final else "false",
                },
                f.count,
            )
            for f in report.failures
        ),
    )


def _uncertain(exp: Exposition, report: Report) -> None:
    now: dict[tuple[str, str], int] = defaultdict(int)
    stuck: dict[tuple[str, str], int] = defaultdict(int)
    for u in report.uncertain_now:
        now[(u.node, u.kind)] += 1
        stuck[(u.node, u.kind)] += u.stuck
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    for v in report.uncertain_volumes:
        seconds[(v.node, v.kind)] += v.seconds
    exp.family(
        "uncertain_now",
        "gauge",
        "Devices (kind=device) and pod-volumes (kind=podvol) Uncertain now.",
        (({"node": n, "kind": k}, c) for (n, k), c in sorted(now.items())),
    )
    exp.family(
        "uncertain_stuck",
        "gauge",
        f"Entries Uncertain for longer than {report.stuck_threshold_s:g}s.",
        (({"node": n, "kind": k}, c) for (n, k), c in sorted(stuck.items())),
    )
    exp.family(
        "uncertain_seconds",
        "gauge",
        "Total time entries spent Uncertain (open spans counted up to now).",
        (({"node": n, "kind": k}, s) for (n, k), s in sorted(seconds.items())),
    )


_NODE_FAMILIES: tuple[tuple[str, str, str, Callable[[NodeFigure], float]], ...] = (
    ("events_total", "counter", "Events applied per node.", lambda n: n.events),
    (
        "node_event_rate",
        "gauge",
        "Events per second over the node's active span.",
        lambda n: n.rate_ev_s,
    ),
    (
        "node_last_event_timestamp_seconds",
        "gauge",
        "Time of the node's last event.",
        lambda n: n.last_event_us / 1e6,
    ),
    ("node_silent_seconds", "gauge", "Seconds since the node's last event.", lambda n: n.silent_s),
    (
        "node_lagging",
        "gauge",
        "1 if the node sent no event for longer than {lag}s.",
        lambda n: float(n.lagging),
    ),
    (
        "node_publish_lag_seconds",
        "gauge",
        "Time from the node's last event to its storage in JetStream.",
        lambda n: n.publish_lag_s,
    ),
    (
        "node_restarts_total",
        "counter",
        "Restarts seen through reconstruction bursts (a lower bound).",
        lambda n: n.restarts,
    ),
    (
        "node_reconstructions_total",
        "counter",
        "Entries marked Uncertain by reconstruction.",
        lambda n: n.reconstructions,
    ),
    (
        "node_interrupted_operations_total",
        "counter",
        "Operations that never ended before the next one on their entry began.",
        lambda n: n.interrupted_ops,
    ),
    ("seq_gaps", "gauge", "Open gaps in the node's event sequence.", lambda n: n.gaps),
    (
        "seq_missing_events",
        "gauge",
        "Events missing in the node's open gaps.",
        lambda n: n.missing_events,
    ),
)


def _nodes(exp: Exposition, report: Report) -> None:
    lag = f"{report.lag_threshold_s:g}"
    for name, kind, help_text, value in _NODE_FAMILIES:
        samples = (({"node": n.node}, value(n)) for n in report.nodes)
        exp.family(name, kind, help_text.replace("{lag}", lag), samples)


def _pods(exp: Exposition, report: Report) -> None:
    pr = report.pod_ready
    exp.summary(
        "pod_ready_seconds",
        "Pod mount-to-ready latency: PodAdded to all its volumes Mounted.",
        [({}, {"0.5": pr.p50_s, "0.9": pr.p90_s, "0.99": pr.p99_s}, pr.count, pr.sum_s)],
    )
    exp.family(
        "pods_pending", "gauge", "Pods whose volumes are not all Mounted.", [({}, pr.pending)]
    )


def _ingest(exp: Exposition, ingest: IngestCounters) -> None:
    exp.family(
        "ingest_applied_total", "counter", "Events applied to the store.", [({}, ingest.applied)]
    )
    exp.family(
        "ingest_duplicates_total",
        "counter",
        "Redelivered events recognised and skipped.",
        [({}, ingest.duplicates)],
    )
    exp.family(
        "ingest_undecodable_total",
        "counter",
        "Messages no decoder read.",
        [({}, ingest.undecodable)],
    )
    exp.family(
        "ingest_gaps_noticed_total",
        "counter",
        "Gaps in node sequences ever noticed.",
        [({}, ingest.gaps_noticed)],
    )
    exp.family(
        "ingest_stream_sequence",
        "gauge",
        "JetStream sequence of the last committed batch.",
        [({}, ingest.stream_seq)],
    )


def render_metrics(report: Report, ingest: IngestCounters | None = None) -> str:
    """The Prometheus text of one report (and the aggregator's counters)."""
    exp = Exposition()
    _operations(exp, report)
    _uncertain(exp, report)
    _nodes(exp, report)
    _pods(exp, report)
    if ingest is not None:
        _ingest(exp, ingest)
    return exp.text()

"""Prometheus metrics of the analytics report, through `prometheus_client`.

`ReportCollector` builds a report when scraped (the `Collector` protocol)
and yields its figures as metric families; `report_families` is the
mapping from a report to families. Labels stay low-cardinality: driver,
operation, code, final, outcome, kind and node. Volume ids and pod uids
never become labels; they are in the JSON report. Collect a report built
over the whole history (no `since`) so counters only go up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import Metric, SummaryMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from projections.analytics import NodeFigure, Report
from volfsm.analytics.store import IngestCounters
from volfsm.web.exposition import Series, counter, gauge

PREFIX = "volfsm_analytics_"

ReportNow = Callable[[], tuple[Report, IngestCounters | None]]
"""Builds the report (and the aggregator's counters) to expose, when called."""

Quantiles = dict[str, float | None]
"""quantile ('0.5') -> value, None when there is none."""


class ReportCollector(Collector):
    """The analytics collector: builds a report at scrape time and yields its families."""

    def __init__(self, report_now: ReportNow) -> None:
        self.report_now = report_now

    def collect(self) -> Iterator[Metric]:
        """The families of a report built now."""
        report, ingest = self.report_now()
        yield from report_families(report, ingest)


def _gauge(name: str, help_text: str, labels: Sequence[str], series: Series) -> Metric:
    return gauge(PREFIX + name, help_text, labels, series)


def _counter(name: str, help_text: str, labels: Sequence[str], series: Series) -> Metric:
    return counter(PREFIX + name, help_text, labels, series)


def summary(
    name: str,
    help_text: str,
    labels: Sequence[str],
    series: Iterable[tuple[Sequence[str], Quantiles, int, float]],
) -> SummaryMetricFamily:
    """A summary family: (label values, quantiles, count, sum) per series; quantiles with
    no value are left out."""
    family = SummaryMetricFamily(PREFIX + name, help_text, labels=labels)
    for values, quantiles, count, total in series:
        base = dict(zip(labels, values, strict=True))
        for q, value in quantiles.items():
            if value is not None:
                family.samples.append(Sample(family.name, {**base, "quantile": q}, value))
        family.add_metric(values, count, total)
    return family


def _quantiles(p50: float | None, p90: float | None, p99: float | None) -> Quantiles:
    return {"0.5": p50, "0.9": p90, "0.99": p99}


def _operations(report: Report) -> Iterator[Metric]:
    yield summary(
        "operation_duration_seconds",
        "Duration of succeeded operations per driver and operation (stage derived).",
        ("driver", "operation"),
        (
            ((f.driver, f.operation), _quantiles(f.p50_s, f.p90_s, f.p99_s), f.succeeded, f.sum_s)
            for f in report.latency
        ),
    )
    yield _counter(
        "operations_total",
        "Finished operations per driver, operation and outcome.",
        ("driver", "operation", "outcome"),
        (
            ((f.driver, f.operation, outcome), n)
            for f in report.latency
            for outcome, n in (("succeeded", f.succeeded), ("failed", f.failed))
        ),
    )
    yield _counter(
        "operation_failures_total",
        "Failed operations per driver, operation, gRPC / plugin code and finality.",
        ("driver", "operation", "code", "final"),
        (
            ((f.driver, f.operation, f.code, "true" if f.final else "false"), f.count)
            for f in report.failures
        ),
    )


def _uncertain(report: Report) -> Iterator[Metric]:
    now: dict[tuple[str, str], float] = defaultdict(float)
    stuck: dict[tuple[str, str], float] = defaultdict(float)
    for u in report.uncertain_now:
        now[(u.node, u.kind)] += 1
        stuck[(u.node, u.kind)] += u.stuck
    seconds = {(u.node, u.kind): u.seconds for u in report.uncertain_by_node}
    labels = ("node", "kind")
    yield _gauge(
        "uncertain_now",
        "Devices (kind=device) and pod-volumes (kind=podvol) Uncertain now.",
        labels,
        sorted(now.items()),
    )
    yield _gauge(
        "uncertain_stuck",
        f"Entries Uncertain for longer than {report.stuck_threshold_s:g}s.",
        labels,
        sorted(stuck.items()),
    )
    yield _gauge(
        "uncertain_seconds",
        "Total time entries spent Uncertain (open spans counted up to now).",
        labels,
        sorted(seconds.items()),
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


def _nodes(report: Report) -> Iterator[Metric]:
    lag = f"{report.lag_threshold_s:g}"
    for name, kind, help_text, value in _NODE_FAMILIES:
        family = _counter if kind == "counter" else _gauge
        series = [((n.node,), value(n)) for n in report.nodes]
        yield family(name, help_text.replace("{lag}", lag), ("node",), series)


def _pods(report: Report) -> Iterator[Metric]:
    pr = report.pod_ready
    yield summary(
        "pod_ready_seconds",
        "Pod mount-to-ready latency: PodAdded to all its volumes Mounted.",
        (),
        [((), _quantiles(pr.p50_s, pr.p90_s, pr.p99_s), pr.count, pr.sum_s)],
    )
    yield _gauge("pods_pending", "Pods whose volumes are not all Mounted.", (), [((), pr.pending)])
    pp = report.pod_pending
    yield summary(
        "pod_claim_wait_seconds",
        "Pods' whole waits for their claims (first PodPending to PodAdded or PodRemoved).",
        (),
        [((), _quantiles(pp.p50_s, pp.p90_s, pp.p99_s), pp.pods, pp.sum_s)],
    )
    yield _gauge(
        "pods_waiting_for_claims",
        "Pods waiting for their claims now (PodPending), by what is missing.",
        ("reason",),
        [((f.reason,), f.waiting) for f in pp.by_reason],
    )


_INGEST_COUNTERS: tuple[tuple[str, str, Callable[[IngestCounters], float]], ...] = (
    ("ingest_applied_total", "Events applied to the store.", lambda i: i.applied),
    (
        "ingest_duplicates_total",
        "Redelivered events recognised and skipped.",
        lambda i: i.duplicates,
    ),
    ("ingest_undecodable_total", "Messages no decoder read.", lambda i: i.undecodable),
    ("ingest_gaps_noticed_total", "Gaps in node sequences ever noticed.", lambda i: i.gaps_noticed),
)


def _ingest(ingest: IngestCounters) -> Iterator[Metric]:
    for name, help_text, value in _INGEST_COUNTERS:
        yield _counter(name, help_text, (), [((), value(ingest))])
    yield _gauge(
        "ingest_stream_sequence",
        "JetStream sequence of the last committed batch.",
        (),
        [((), ingest.stream_seq)],
    )


def report_families(report: Report, ingest: IngestCounters | None = None) -> Iterator[Metric]:
    """The metric families of one report (and the aggregator's counters)."""
    yield from _operations(report)
    yield from _uncertain(report)
    yield from _nodes(report)
    yield from _pods(report)
    if ingest is not None:
        yield from _ingest(ingest)

"""/metrics: the fixed history's figures as a scraper parses them, low-cardinality labels only."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from projections.analytics import Report
from tests.analytics.feed import feed, report_from
from tests.analytics.scenario import NOW_US, E, N, node1, node2
from tests.analytics.sim import interleave
from tests.helpers.prometheus import Series, families, sample, samples, series
from volfsm.analytics.metrics import ReportCollector
from volfsm.analytics.store import AnalyticsStore, IngestCounters
from volfsm.web.exposition import exposition, registry_of

P = "volfsm_analytics_"
ALLOWED_LABELS = {
    "driver", "operation", "code", "final", "outcome", "kind", "node", "quantile", "reason",
}  # fmt: skip

_NODE_GAUGES = (
    "node_event_rate", "node_last_event_timestamp_seconds", "node_silent_seconds",
    "node_lagging", "node_publish_lag_seconds", "seq_gaps", "seq_missing_events",
)  # fmt: skip
_NODE_COUNTERS = ("events", "node_restarts", "node_reconstructions",
                  "node_interrupted_operations")  # fmt: skip
_INGEST_COUNTERS = ("ingest_applied", "ingest_duplicates", "ingest_undecodable",
                    "ingest_gaps_noticed")  # fmt: skip

ANALYTICS_FAMILIES = {
    P + "operation_duration_seconds": "summary",
    P + "operations": "counter",
    P + "operation_failures": "counter",
    P + "uncertain_now": "gauge",
    P + "uncertain_stuck": "gauge",
    P + "uncertain_seconds": "gauge",
    **{P + name: "gauge" for name in _NODE_GAUGES},
    **{P + name: "counter" for name in _NODE_COUNTERS},
    P + "pod_ready_seconds": "summary",
    P + "pods_pending": "gauge",
    **{P + name: "counter" for name in _INGEST_COUNTERS},
    P + "ingest_stream_sequence": "gauge",
    P + "pod_claim_wait_seconds": "summary",  # new with pending pods
    P + "pods_waiting_for_claims": "gauge",  # new with pending pods (no series without any)
}
"""Every family /metrics of `volfsm analytics serve` exposed before prometheus_client (parser
names: a counter's family has no `_total`, its samples do), and the two of pods' waits for
their claims."""

_OP = ("driver", "operation")
ANALYTICS_SERIES: set[Series] = {
    (P + "operation_duration_seconds", (*_OP, "quantile")),
    (P + "operation_duration_seconds_count", _OP),
    (P + "operation_duration_seconds_sum", _OP),
    (P + "operations_total", (*_OP, "outcome")),
    (P + "operation_failures_total", ("code", "driver", "final", "operation")),
    (P + "uncertain_now", ("kind", "node")),
    (P + "uncertain_stuck", ("kind", "node")),
    (P + "uncertain_seconds", ("kind", "node")),
    *((P + name, ("node",)) for name in _NODE_GAUGES),
    *((P + name + "_total", ("node",)) for name in _NODE_COUNTERS),
    (P + "pod_ready_seconds", ("quantile",)),
    (P + "pod_ready_seconds_count", ()),
    (P + "pod_ready_seconds_sum", ()),
    (P + "pods_pending", ()),
    *((P + name + "_total", ()) for name in _INGEST_COUNTERS),
    (P + "ingest_stream_sequence", ()),
    (P + "pod_claim_wait_seconds_count", ()),
    (P + "pod_claim_wait_seconds_sum", ()),
}
"""Every (sample name, label names) it exposed before prometheus_client, and the count and sum
of pods' waits for their claims (none in the fixed history)."""


def fixed_report(tmp_path: Path) -> tuple[Report, IngestCounters]:
    db = tmp_path / "a.db"
    with AnalyticsStore(db) as store:
        feed(store, interleave([node1(), node2()]))
        counters = store.counters()
    return report_from(db, NOW_US, lag_threshold_s=55.0, stuck_threshold_s=30.0), counters


def scraped(report: Report, ingest: IngestCounters | None) -> str:
    return exposition(registry_of(ReportCollector(lambda: (report, ingest)))).decode()


def metrics_text(tmp_path: Path) -> str:
    return scraped(*fixed_report(tmp_path))


def test_every_family_and_series_exposed_before_is_there(tmp_path: Path) -> None:
    text = metrics_text(tmp_path)
    assert families(text) == ANALYTICS_FAMILIES
    assert series(text) == ANALYTICS_SERIES
    assert {label for _name, labels in series(text) for label in labels} <= ALLOWED_LABELS


def test_metrics_carry_the_report_figures(tmp_path: Path) -> None:
    text = metrics_text(tmp_path)

    def s(name: str, **labels: str) -> float:
        return sample(text, P + name, **labels)

    mount = {"driver": E, "operation": "volume_mount"}
    assert s("operation_duration_seconds", **mount, quantile="0.5") == 3.0
    assert s("operation_duration_seconds", **mount, quantile="0.9") == 10.0
    assert s("operation_duration_seconds", **mount, quantile="0.99") == 10.0
    assert s("operation_duration_seconds_count", **mount) == 4
    assert s("operation_duration_seconds_sum", **mount) == 19.0
    assert s("operations_total", **mount, outcome="failed") == 2
    assert s("operations_total", driver=N, operation="volume_mount", outcome="succeeded") == 1
    assert (
        s("operation_failures_total", driver=E, operation="unmount_device", code="Internal",
          final="false")
        == 2
    )  # fmt: skip
    assert s("operation_failures_total", **mount, code="InvalidArgument", final="true") == 1
    assert s("uncertain_now", node="n1", kind="device") == 1
    assert s("uncertain_stuck", node="n1", kind="device") == 1
    assert s("uncertain_seconds", node="n1", kind="device") == 68.0
    assert s("uncertain_seconds", node="n2", kind="podvol") == 1.0
    assert s("events_total", node="n1") == 26
    assert s("events_total", node="n2") == 25
    assert s("node_lagging", node="n1") == 1
    assert s("node_lagging", node="n2") == 0
    assert s("node_silent_seconds", node="n2") == 39
    assert s("node_restarts_total", node="n2") == 1
    assert s("node_reconstructions_total", node="n2") == 2
    assert s("seq_gaps", node="n1") == 0
    assert s("pod_ready_seconds", quantile="0.5") == 5.0
    assert s("pod_ready_seconds_count") == 4
    assert s("pod_ready_seconds_sum") == 32.0
    assert s("pods_pending") == 0
    assert s("ingest_applied_total") == 51
    assert s("ingest_duplicates_total") == 0


def test_no_volume_or_pod_ids_in_labels(tmp_path: Path) -> None:
    text = metrics_text(tmp_path)
    for needle in ("^", "kubernetes.io/csi/", '"p1"', '"q2"', "podvol/", "device/"):
        assert needle not in text


def test_label_values_are_escaped(tmp_path: Path) -> None:
    report, ingest = fixed_report(tmp_path)
    odd = 'a"b\\c\nd'
    report.failures[0] = dataclasses.replace(report.failures[0], code=odd)
    codes = {
        dict(labels)["code"]
        for name, labels in samples(scraped(report, ingest))
        if name == P + "operation_failures_total"
    }
    assert odd in codes


def test_infinite_and_missing_values(tmp_path: Path) -> None:
    report, _ingest = fixed_report(tmp_path)
    report.nodes[0] = dataclasses.replace(report.nodes[0], silent_s=math.inf)
    report.nodes[1] = dataclasses.replace(report.nodes[1], rate_ev_s=-math.inf)
    report.pod_ready = dataclasses.replace(report.pod_ready, p99_s=None)
    text = scraped(report, None)
    assert sample(text, P + "node_silent_seconds", node=report.nodes[0].node) == math.inf
    assert sample(text, P + "node_event_rate", node=report.nodes[1].node) == -math.inf
    assert {q for n, lbl in samples(text) if n == P + "pod_ready_seconds" for _, q in lbl} == {
        "0.5",
        "0.9",
    }
    assert not any(name.startswith(P + "ingest_") for name, _labels in series(text))

"""/metrics: Prometheus text of the fixed history's figures, low-cardinality labels only."""

from __future__ import annotations

import re
from pathlib import Path

from tests.analytics.feed import feed, report_from
from tests.analytics.scenario import NOW_US, E, N, node1, node2
from tests.analytics.sim import interleave
from volfsm.analytics.metrics import render_metrics
from volfsm.analytics.store import AnalyticsStore

SAMPLE = re.compile(r'^([a-z_]+)(\{([a-z_]+="[^"\\]*"(,[a-z_]+="[^"\\]*")*)\})? (\S+)$')
ALLOWED_LABELS = {"driver", "operation", "code", "final", "outcome", "kind", "node", "quantile"}


def metrics_text(tmp_path: Path) -> str:
    db = tmp_path / "a.db"
    with AnalyticsStore(db) as store:
        feed(store, interleave([node1(), node2()]))
        counters = store.counters()
    report = report_from(db, NOW_US, lag_threshold_s=55.0, stuck_threshold_s=30.0)
    return render_metrics(report, counters)


def samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value for every sample line; every line must parse."""
    out: dict[str, float] = {}
    families: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name = line.split()[2]
            assert name not in families, f"family {name} declared twice"
            families.add(name)
            continue
        if line.startswith("# HELP "):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = dict(re.findall(r'([a-z_]+)="([^"]*)"', m.group(3) or ""))
        assert set(labels) <= ALLOWED_LABELS, line
        key = m.group(1) + ("{" + m.group(3) + "}" if m.group(3) else "")
        out[key] = float(m.group(5))
    return out


def test_metrics_carry_the_report_figures(tmp_path: Path) -> None:
    s = samples(metrics_text(tmp_path))
    p = "volfsm_analytics_"
    mount = f'driver="{E}",operation="volume_mount"'
    assert s[f'{p}operation_duration_seconds{{{mount},quantile="0.5"}}'] == 3.0
    assert s[f'{p}operation_duration_seconds{{{mount},quantile="0.9"}}'] == 10.0
    assert s[f'{p}operation_duration_seconds{{{mount},quantile="0.99"}}'] == 10.0
    assert s[f"{p}operation_duration_seconds_count{{{mount}}}"] == 4
    assert s[f"{p}operation_duration_seconds_sum{{{mount}}}"] == 19.0
    assert s[f'{p}operations_total{{{mount},outcome="failed"}}'] == 2
    assert (
        s[f'{p}operations_total{{driver="{N}",operation="volume_mount",outcome="succeeded"}}'] == 1
    )
    assert (
        s[
            f'{p}operation_failures_total{{driver="{E}",operation="unmount_device",'
            f'code="Internal",final="false"}}'
        ]
        == 2
    )
    assert s[f'{p}operation_failures_total{{{mount},code="InvalidArgument",final="true"}}'] == 1
    assert s[f'{p}uncertain_now{{node="n1",kind="device"}}'] == 1
    assert s[f'{p}uncertain_stuck{{node="n1",kind="device"}}'] == 1
    assert s[f'{p}uncertain_seconds{{node="n1",kind="device"}}'] == 68.0
    assert s[f'{p}uncertain_seconds{{node="n2",kind="podvol"}}'] == 1.0
    assert s[f'{p}events_total{{node="n1"}}'] == 26
    assert s[f'{p}events_total{{node="n2"}}'] == 25
    assert s[f'{p}node_lagging{{node="n1"}}'] == 1
    assert s[f'{p}node_lagging{{node="n2"}}'] == 0
    assert s[f'{p}node_silent_seconds{{node="n2"}}'] == 39
    assert s[f'{p}node_restarts_total{{node="n2"}}'] == 1
    assert s[f'{p}node_reconstructions_total{{node="n2"}}'] == 2
    assert s[f'{p}seq_gaps{{node="n1"}}'] == 0
    assert s[f'{p}pod_ready_seconds{{quantile="0.5"}}'] == 5.0
    assert s[f"{p}pod_ready_seconds_count"] == 4
    assert s[f"{p}pod_ready_seconds_sum"] == 32.0
    assert s[f"{p}pods_pending"] == 0
    assert s[f"{p}ingest_applied_total"] == 51
    assert s[f"{p}ingest_duplicates_total"] == 0


def test_no_volume_or_pod_ids_in_labels(tmp_path: Path) -> None:
    text = metrics_text(tmp_path)
    for needle in ("^", "kubernetes.io/csi/", '"p1"', '"q2"', "podvol/", "device/"):
        assert needle not in text


def test_label_values_are_escaped() -> None:
    from volfsm.analytics.metrics import Exposition

    exp = Exposition()
    exp.family("x", "gauge", "help", [({"code": 'a"b\\c\nd'}, 1.5)])
    assert 'volfsm_analytics_x{code="a\\"b\\\\c\\nd"} 1.5' in exp.text()

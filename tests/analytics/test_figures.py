"""Report figures of the fixed two-node history, against values worked out by hand."""

from __future__ import annotations

import pytest

from projections.analytics import (
    FailureFigure,
    LatencyFigure,
    Report,
    UncertainVolume,
    percentile,
    report_of,
)
from tests.analytics.scenario import NOW_US, E, N, node1, node2
from tests.analytics.sim import T0, csi_vid, interleave


def fixed_report(since_s: float | None = None) -> Report:
    envs = interleave([node1(), node2()])
    since = None if since_s is None else T0 + round(since_s * 1e6)
    return report_of(envs, now_us=NOW_US, since_us=since, lag_threshold_s=55, stuck_threshold_s=30)


def lat(driver: str, operation: str, phase: str, ok: list[float], failed: int) -> LatencyFigure:
    """The expected figure, percentiles by nearest rank worked out here."""
    values = sorted(ok)
    return LatencyFigure(
        driver=driver,
        operation=operation,
        phase=phase,
        count=len(values) + failed,
        succeeded=len(values),
        failed=failed,
        p50_s=percentile(values, 50),
        p90_s=percentile(values, 90),
        p99_s=percentile(values, 99),
        mean_s=sum(values) / len(values) if values else None,
        max_s=max(values) if values else None,
        sum_s=sum(values),
    )


def test_nearest_rank_percentiles() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([2.0, 3.0, 4.0, 10.0], 50) == 3.0  # rank ceil(2) = 2
    assert percentile([2.0, 3.0, 4.0, 10.0], 90) == 10.0  # rank ceil(3.6) = 4
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([float(i) for i in range(1, 101)], 90) == 90.0


def test_latency_per_driver_and_operation() -> None:
    report = fixed_report()
    assert report.latency == [
        lat(E, "mount_device", "stage", [1.0, 2.0, 1.0, 0.5], 0),
        lat(E, "volume_mount", "publish", [2.0, 4.0, 3.0, 10.0], 2),
        lat(E, "volume_unmount", "unpublish", [0.5], 0),
        lat(E, "unmount_device", "unstage", [], 2),
        lat(E, "volume_fs_resize", "expand", [0.25], 0),
        lat(N, "volume_mount", "publish", [1.0], 1),
    ]
    by_key = {(f.driver, f.operation): f for f in report.latency}
    mount = by_key[(E, "volume_mount")]
    assert (mount.p50_s, mount.p90_s, mount.p99_s, mount.mean_s) == (3.0, 10.0, 10.0, 4.75)
    stage = by_key[(E, "mount_device")]
    assert (stage.p50_s, stage.p90_s, stage.count) == (1.0, 2.0, 4)
    unstage = by_key[(E, "unmount_device")]
    assert (unstage.count, unstage.failed, unstage.p50_s) == (2, 2, None)


def test_failures_by_code_and_finality() -> None:
    assert fixed_report().failures == [
        FailureFigure(E, "unmount_device", "Internal", False, 2),
        FailureFigure(E, "volume_mount", "DeadlineExceeded", False, 1),
        FailureFigure(E, "volume_mount", "InvalidArgument", True, 1),
        FailureFigure(N, "volume_mount", "DeadlineExceeded", False, 1),
    ]


def test_time_uncertain_per_volume_and_uncertain_now() -> None:
    report = fixed_report()
    assert report.uncertain_volumes == [
        UncertainVolume("n1", csi_vid(E, "v1"), "device", 68.0, 1, True),
        UncertainVolume("n1", csi_vid(N, "n1"), "podvol", 2.0, 1, False),
        UncertainVolume("n2", csi_vid(E, "w2"), "device", 2.0, 1, False),
        UncertainVolume("n2", csi_vid(E, "w1"), "device", 1.0, 1, False),
        UncertainVolume("n2", csi_vid(E, "w1"), "podvol", 1.0, 1, False),
    ]
    [now] = report.uncertain_now
    assert (now.node, now.kind, now.volume_id, now.stream) == (
        "n1",
        "device",
        csi_vid(E, "v1"),
        f"device/{csi_vid(E, 'v1')}",
    )
    assert now.since_us == T0 + 32_000_000
    assert now.seconds == 68.0
    assert now.stuck  # 68 s > 30 s


def test_nodes_rates_lag_restarts() -> None:
    n1, n2 = fixed_report().nodes
    assert (n1.node, n1.events, n1.first_seq, n1.last_seq) == ("n1", 26, 1, 26)
    assert (n2.node, n2.events, n2.first_seq, n2.last_seq) == ("n2", 25, 1, 25)
    assert n1.rate_ev_s == pytest.approx(26 / 41, abs=1e-3)
    assert n2.rate_ev_s == pytest.approx(25 / 61, abs=1e-3)
    assert (n1.silent_s, n1.lagging) == (59.0, True)  # threshold 55 s
    assert (n2.silent_s, n2.lagging) == (39.0, False)
    assert (n1.restarts, n1.reconstructions) == (0, 0)
    assert (n2.restarts, n2.reconstructions) == (1, 2)  # one burst of two reconstructions
    assert n1.interrupted_ops == n2.interrupted_ops == 0
    assert n1.gaps == n2.gaps == 0


def test_pod_mount_to_ready() -> None:
    ready = fixed_report().pod_ready
    # p1 10.0, p2 5.0, q1 3.0, q2 14.0
    assert (ready.count, ready.pending) == (4, 0)
    assert (ready.p50_s, ready.p90_s, ready.p99_s, ready.max_s) == (5.0, 14.0, 14.0, 14.0)
    assert ready.sum_s == 32.0


def test_since_cuts_the_window() -> None:
    report = fixed_report(since_s=20)
    by_key = {(f.driver, f.operation): f for f in report.latency}
    assert by_key[(E, "volume_mount")].succeeded == 1  # only o4 ended at or after t20
    assert by_key[(E, "volume_mount")].p50_s == 4.0
    assert (E, "mount_device") in by_key and by_key[(E, "mount_device")].count == 1  # o4's stage
    assert (N, "volume_mount") not in by_key
    assert [(n.node, n.events) for n in report.nodes] == [("n1", 14), ("n2", 7)]
    assert report.events == 21
    assert report.pod_ready.count == 1 and report.pod_ready.p50_s == 5.0
    seconds = {(u.node, u.volume_id, u.kind): u.seconds for u in report.uncertain_volumes}
    assert seconds == {
        ("n1", csi_vid(E, "v1"), "device"): 68.0,
        ("n2", csi_vid(E, "w1"), "device"): 1.0,
        ("n2", csi_vid(E, "w1"), "podvol"): 1.0,
    }


def test_latency_series_buckets_publish_latency_per_driver() -> None:
    report = fixed_report()
    # The window runs from the first finished operation (r1's stage on n2, t1) to t100:
    # 24 buckets of 99/24 = 4.125 s. Succeeded publishes: E 2.0 (t3, n1) and 3.0 (t3, n2),
    # N 1.0 (t10), E 10.0 (t19), E 4.0 (t25).
    assert report.bucket_s == 4.125
    start, width = T0 + 1_000_000, 4_125_000
    points = {(p.driver, p.bucket_us): (p.count, p.p50_s) for p in report.latency_series}
    assert points == {
        (E, start): (2, 2.0),
        (N, start + 2 * width): (1, 1.0),
        (E, start + 4 * width): (1, 10.0),
        (E, start + 5 * width): (1, 4.0),
    }

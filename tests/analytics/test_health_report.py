"""Volume health in the aggregator: "volumes near full" and "abnormal volumes" in the report
and the dashboard, folded exactly once across restarts and redeliveries."""

from __future__ import annotations

import io
from pathlib import Path

from events.streams import podvol_stream
from events.types import Envelope, VolumeConditionChanged, VolumeUsageChanged
from projections.analytics import report_of
from tests.analytics.feed import feed, report_from
from tests.analytics.scenario import NOW_US
from tests.analytics.sim import T0, SimNode, interleave
from tests.analytics.test_dashboard import rendered_dom
from volfsm.analytics.dashboard import StoreReportSource, dashboard_server
from volfsm.analytics.report import print_report, report_document
from volfsm.analytics.store import AnalyticsStore

CAPACITY = 100 << 20
MIB = 1 << 20


def usage(pod: str, claim: str, used: int) -> VolumeUsageChanged:
    return VolumeUsageChanged(
        volume_id=f"pv-{claim}", pod_uid=pod, volume_name="data", namespace="shop", claim=claim,
        capacity_bytes=CAPACITY, used_bytes=used, available_bytes=CAPACITY - used, source="csi",
    )  # fmt: skip


def condition(pod: str, claim: str, abnormal: bool, message: str) -> VolumeConditionChanged:
    return VolumeConditionChanged(
        volume_id=f"pv-{claim}", pod_uid=pod, volume_name="data", abnormal=abnormal,
        message=message, namespace="shop", claim=claim,
    )  # fmt: skip


def history() -> tuple[list[Envelope], list[Envelope]]:
    """(before the restart, after it): db-0 on n1 fills up; logs on n2 turns abnormal."""
    n1, n2 = SimNode("n1"), SimNode("n2")
    db, logs = podvol_stream("p1", "data"), podvol_stream("p2", "data")
    n1.at(10, db, usage("p1", "data-db-0", 50 * MIB))
    n1.at(20, db, usage("p1", "data-db-0", 95 * MIB))
    n2.at(15, logs, usage("p2", "logs", 10 * MIB))
    before = interleave([n1.envs, n2.envs])
    n2.at(30, logs, condition("p2", "logs", True, "I/O errors on /dev/loop7"))
    n1.at(40, db, condition("p1", "data-db-0", True, "gone"))
    n1.at(50, db, condition("p1", "data-db-0", False, ""))
    return before, interleave([n1.envs, n2.envs])


def test_report_shows_near_full_and_abnormal_volumes_after_a_restart(tmp_path: Path) -> None:
    before, everything = history()
    db = tmp_path / "a"
    with AnalyticsStore(db) as store:
        feed(store, before, batch=2)
    after = [e for e in everything if e not in before]
    with AnalyticsStore(db) as store:  # an aggregator restart; n1's 50 % comes again, late
        ing = feed(store, [*after[:2], before[0], *after[2:]], batch=3)
    assert ing.stats.duplicates == 1
    report = report_from(db, NOW_US)
    [full] = report.near_full  # the redelivered 50 % did not undo the committed 95 %
    assert (full.node, full.namespace, full.claim, full.volume_id) == (
        "n1",
        "shop",
        "data-db-0",
        "pv-data-db-0",
    )
    assert (full.used_bytes, full.capacity_bytes, full.recorded_us) == (
        95 * MIB,
        CAPACITY,
        T0 + 20_000_000,
    )
    [bad] = report.abnormal  # data-db-0 is normal again
    assert (bad.node, bad.claim, bad.pod_uid, bad.message, bad.since_us) == (
        "n2",
        "logs",
        "p2",
        "I/O errors on /dev/loop7",
        T0 + 30_000_000,
    )
    assert (report.near_full_total, report.abnormal_total) == (1, 1)
    memory = report_of(everything, now_us=NOW_US)
    assert (memory.near_full, memory.abnormal) == (report.near_full, report.abnormal)

    doc = report_document(report)
    assert [f["claim"] for f in doc["near_full"]] == ["data-db-0"]
    assert [f["message"] for f in doc["abnormal"]] == ["I/O errors on /dev/loop7"]
    text = io.StringIO()
    print_report(report, None, text)
    full_section = text.getvalue().split("Volumes near full")[1].split("Abnormal volumes")[0]
    assert "data-db-0" in full_section and "95.0%" in full_section and "logs" not in full_section
    assert "I/O errors on /dev/loop7" in text.getvalue().split("Abnormal volumes")[1]

    assert report_from(db, NOW_US, near_full_threshold=0.05).near_full_total == 2
    assert report_from(db, NOW_US, top=0).near_full == []


async def test_the_dashboard_shows_both_health_panels(tmp_path: Path) -> None:
    db = tmp_path / "a"
    with AnalyticsStore(db) as store:
        feed(store, history()[1])
    server = dashboard_server(StoreReportSource(db, clock=lambda: NOW_US))
    await server.start()
    try:
        page = await rendered_dom(server.url, tmp_path / "chromium")
    finally:
        await server.stop()
    full = page.in_box("near-full", "rect", "bar")
    assert [(b["data-node"], b["data-claim"], b["data-value"]) for b in full] == [
        ("n1", "data-db-0", "95")
    ]
    abnormal = page.in_box("abnormal-volumes", "rect", "bar")
    assert [(b["data-node"], b["data-claim"], b["data-message"]) for b in abnormal] == [
        ("n2", "logs", "I/O errors on /dev/loop7")
    ]
    assert page.in_box("near-full", "text", "rest") == []

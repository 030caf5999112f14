"""Pods that wait for their claims in the analytics: their wait is reported apart, by reason,
and is neither mount-to-ready nor any driver's latency; the store keeps it exactly once and
reads stores written before it kept waits.

The history (node w1, seconds after T0; the report is at T0 + 30 s):
  t0   pod a pending: its claim is not found          t1  pod b pending: claim not bound
  t4   pod a pending: the claim's PV is not found     t5  pod b deleted while pending
  t10  pod a added (resolved after 10 s); its volume_mount runs t10.5-t12, Mounted at t12
  t20  pod c pending: its claim is not found (still waiting at t30)
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest

from events.streams import device_stream, pod_stream, podvol_stream
from events.types import (
    DeviceAttached,
    DeviceMounted,
    Envelope,
    OperationStarted,
    OperationSucceeded,
    PendingVolume,
    PodAdded,
    PodPending,
    PodRemoved,
    VolumeMounted,
)
from projections.analytics import report_of
from projections.analytics.figures import PendingReasonFigure, PodPendingFigure
from projections.analytics.waits import reason_of
from tests.analytics.feed import feed, report_from, without_publish_lag
from tests.analytics.sim import T0, SimNode, csi_plugin, desired
from volfsm.analytics.report import print_report
from volfsm.analytics.store import AnalyticsStore

NOW_US = T0 + 30_000_000
DRIVER = "ebs.csi.aws.com"
CLAIM_MISSING = "PersistentVolumeClaim not found yet"
PV_MISSING = "PersistentVolume not found yet"
NOT_BOUND = "PersistentVolumeClaim not bound yet"


def _pending(uid: str, waits_for: str, reason: str) -> PodPending:
    vol = PendingVolume(name="data", waits_for=waits_for, reason=reason)
    return PodPending(pod_uid=uid, namespace="ns", name=uid, waiting=(vol,))


def waits_history(node: str = "w1") -> list[Envelope]:
    """The history of the module doc on one node."""
    sim = SimNode(node)
    dv = desired("data", DRIVER, f"{node}-h")
    claim, pv = "PersistentVolumeClaim ns/a-data", "PersistentVolume pv-a"
    sim.at(0, pod_stream("a"), _pending("a", claim, "not found yet"))
    sim.at(1, pod_stream("b"), _pending("b", "PersistentVolumeClaim ns/b", "not bound yet (x)"))
    sim.at(4, pod_stream("a"), _pending("a", pv, f"not found yet ({claim} is bound to it)"))
    sim.at(5, pod_stream("b"), PodRemoved(pod_uid="b", namespace="ns", name="b"))
    sim.at(10, pod_stream("a"), PodAdded(pod_uid="a", namespace="ns", name="a", volumes=(dv,)))
    plugin = csi_plugin(DRIVER)
    mount = OperationStarted(
        op_id="m1", operation="volume_mount", volume_id=dv.volume_id, pod_uid="a", plugin=plugin
    )
    sim.at(10.5, podvol_stream("a", "data"), mount)
    sim.at(10.6, device_stream(dv.volume_id), DeviceAttached(volume_id=dv.volume_id, plugin=plugin))
    sim.at(11, device_stream(dv.volume_id), DeviceMounted(volume_id=dv.volume_id))
    mounted = VolumeMounted(volume_id=dv.volume_id, pod_uid="a", volume_name="data")
    sim.at(12, podvol_stream("a", "data"), mounted)
    ok = OperationSucceeded(op_id="m1", operation="volume_mount", duration_s=1.5)
    sim.at(12, podvol_stream("a", "data"), ok)
    sim.at(20, pod_stream("c"), _pending("c", "PersistentVolumeClaim ns/c", "not found yet"))
    return sim.envs


def _reason(reason: str, steps: list[float], waiting: int = 0) -> PendingReasonFigure:
    top = max(steps) if steps else None
    return PendingReasonFigure(
        reason, len(steps), len(steps), min(steps) if steps else None, top, top, top,
        float(sum(steps)), waiting,
    )  # fmt: skip


def test_the_wait_is_reported_apart_and_mount_to_ready_starts_when_it_ends() -> None:
    report = report_of(waits_history(), now_us=NOW_US)
    ready = report.pod_ready
    assert (ready.count, ready.p50_s, ready.max_s) == (1, 2.0, 2.0)  # t10 -> t12, not t0 -> t12
    [mount] = [f for f in report.latency if f.operation == "volume_mount"]
    assert (mount.count, mount.p50_s) == (1, 1.5)  # the driver's time only
    assert report.pod_pending == PodPendingFigure(
        pods=2,
        resolved=1,
        deleted=1,
        p50_s=4.0,  # b: t1 -> t5
        p90_s=10.0,  # a: t0 -> t10
        p99_s=10.0,
        max_s=10.0,
        sum_s=14.0,
        waiting=1,
        waiting_longest_s=10.0,  # c: t20 -> now
        by_reason=[
            _reason(PV_MISSING, [6.0]),
            _reason(CLAIM_MISSING, [4.0], waiting=1),
            _reason(NOT_BOUND, [4.0]),
        ],
    )


def test_a_window_counts_the_waits_and_steps_that_ended_in_it() -> None:
    report = report_of(waits_history(), now_us=NOW_US, since_us=T0 + 4_500_000)
    pending = report.pod_pending
    assert (pending.pods, pending.resolved, pending.deleted) == (2, 1, 1)
    assert [(f.reason, f.waits) for f in pending.by_reason] == [
        (PV_MISSING, 1),
        (NOT_BOUND, 1),
        (CLAIM_MISSING, 0),  # a's first step ended at t4, before the window; c waits now
    ]
    later = report_of(waits_history(), now_us=NOW_US, since_us=T0 + 15_000_000).pod_pending
    assert (later.pods, later.waiting, later.p50_s) == (0, 1, None)


def test_reasons_name_what_is_missing_never_which_object() -> None:
    def of(*pairs: tuple[str, str]) -> str:
        return reason_of(PendingVolume(name="v", waits_for=w, reason=r) for w, r in pairs)

    assert of(("PersistentVolumeClaim ns/x", "not found yet; the ephemeral ...")) == CLAIM_MISSING
    assert of(("PersistentVolumeClaim ns/x", "not bound yet (phase Lost)")) == NOT_BOUND
    assert of(("PersistentVolume pv-1", "not found yet (PersistentVolumeClaim ns/x is ...)")) == (
        PV_MISSING
    )
    assert of(("PersistentVolumeClaim ns/x", "PVC ns/x was not created for pod ns/p")) == (
        "PersistentVolumeClaim problem"
    )
    assert of(("", "spec.volumes[0]: bad")) == "object problem"
    assert of(("CSI driver secrets.csi.k8s.io", "not registered on this node yet")) == (
        "CSI driver not registered yet"
    )
    assert of(
        ("PersistentVolume pv-1", "not found yet"), ("PersistentVolumeClaim ns/y", "not found yet")
    ) == (f"{PV_MISSING} + {CLAIM_MISSING}")


@pytest.mark.parametrize("since_s", [None, 4.5])
def test_the_store_reports_what_memory_does_exactly_once(
    tmp_path: Path, since_s: float | None
) -> None:
    envs = waits_history("w1") + waits_history("w2")
    since = None if since_s is None else T0 + round(since_s * 1e6)
    path = tmp_path / "a"
    for part in (envs[:9], envs[:15], envs):  # each a new process; redelivers what it had
        with AnalyticsStore(path, compact_rows=5) as store:  # compacted on the way
            feed(store, part, batch=4)
    stored = report_from(path, NOW_US, since_us=since)
    memory = report_of(envs, now_us=NOW_US, since_us=since)
    assert without_publish_lag(stored) == without_publish_lag(memory)
    assert (stored.pod_pending.pods, stored.pod_pending.waiting) == (4, 2)
    with AnalyticsStore(path, read_only=True) as store:
        assert store.count("waits") == 6  # 3 ended steps a node (c still waits), once
        assert store.count("events") == len(envs)


def test_a_store_written_before_waits_were_kept_reads_and_goes_on(tmp_path: Path) -> None:
    envs = waits_history()
    path = tmp_path / "a"
    with AnalyticsStore(path) as store:
        feed(store, envs)
    _forget_waits(path)  # as an older volfsm left it: no open waits in the state blob
    report = report_from(path, NOW_US)
    assert (report.pod_pending.pods, report.pod_pending.waiting) == (2, 0)
    resolved = PodAdded(pod_uid="c", namespace="ns", name="c", volumes=())
    sim = SimNode("w1", seq=envs[-1].seq, now_us=envs[-1].ts)
    sim.at(25, pod_stream("c"), resolved)  # its wait began before: not counted, no error
    with AnalyticsStore(path) as store:
        feed(store, sim.envs)
    after = report_from(path, NOW_US)
    assert (after.pod_pending.pods, after.pod_pending.waiting, after.events) == (
        2,
        0,
        len(envs) + 1,
    )


def _forget_waits(path: Path) -> None:
    catalog = sqlite3.connect(path / "_catalog" / "part=0.sqlite")
    try:
        (blob,) = catalog.execute("SELECT data FROM state WHERE id = 1").fetchone()
        state = msgspec.msgpack.decode(blob)
        del state["waits"]
        catalog.execute("UPDATE state SET data = ? WHERE id = 1", (msgspec.msgpack.encode(state),))
        catalog.commit()
    finally:
        catalog.close()


def test_the_text_report_names_the_wait_and_its_reasons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    print_report(report_of(waits_history(), now_us=NOW_US), None)
    out = capsys.readouterr().out
    assert (
        "Pods waiting for their claims (no driver's time; not in mount-to-ready): 2 waited "
        "(1 resolved, 1 deleted while pending), 1 waiting now (longest 10.000s); "
        "p50 4.000s p90 10.000s p99 10.000s max 10.000s"
    ) in out
    rows = out.split("Waiting for (")[1].splitlines()[2:5]
    assert [r.split("  ")[0] for r in rows] == [PV_MISSING, CLAIM_MISSING, NOT_BOUND]

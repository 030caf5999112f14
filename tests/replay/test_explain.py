"""`explain pod`: verdicts, backoff relative to the moment, what the reconciler waits for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from events.streams import pod_stream, podvol_stream
from events.types import (
    DesiredVolume,
    PodAdded,
    PodRemoved,
    VolumeMountUncertain,
    VolumeSource,
)
from projections.explain import (
    MOUNTED_VERDICT,
    NOT_MOUNTED_VERDICT,
    UNCERTAIN_VERDICT,
    PodExplanation,
    PodNotFoundError,
    explain_pod,
)
from tests.projections.builders import History
from tests.replay.conftest import run_ok
from tests.replay.incident import (
    BUILDER_UID,
    METRICS_UID,
    REPORT_UID,
    WEB_UID,
    at,
    envelopes,
    until,
)
from volfsm.cli import app


def _explain(ref: str, seconds: float | None = None) -> PodExplanation:
    if seconds is None:
        return explain_pod(envelopes(), ref)
    return explain_pod(until(at(seconds)), ref, at(seconds))


def test_in_backoff_after_the_first_stage_timeout() -> None:
    exp = _explain("shop/web-0", 25.3)
    data = exp.volumes[0]
    assert (data.name, data.verdict) == ("data", NOT_MOUNTED_VERDICT)
    assert data.device.state == "Uncertain"
    assert data.backoff is not None
    assert (data.backoff.operation, data.backoff.code) == ("volume_mount", "DeadlineExceeded")
    assert data.backoff.retry_at_us == at(25.563)
    assert data.waiting_for[0] == (
        "backoff after DeadlineExceeded (non-final) on volume_mount to end at "
        "2024-05-01T03:10:25.563Z (in 0.263s); then volume_mount again"
    )
    assert data.waiting_for[1].startswith("device stage to succeed: the device is Uncertain")
    assert exp.volumes[1].verdict == MOUNTED_VERDICT


def test_after_the_backoff_the_retry_is_allowed_and_awaited() -> None:
    data = _explain("shop/web-0", 25.58).volumes[0]
    assert data.backoff is None
    assert data.waiting_for[0] == (
        "the reconciler to start volume_mount (desired and not mounted); "
        "retry allowed since 2024-05-01T03:10:25.563Z"
    )


def test_uncertain_and_desired_waits_for_a_republish() -> None:
    data = _explain(WEB_UID, 62.0).volumes[0]
    assert data.verdict == UNCERTAIN_VERDICT
    assert data.backoff is not None and data.backoff.retry_at_us == at(65.412)
    assert "Uncertain: next mount attempt will re-publish" in data.waiting_for


def test_deleted_while_uncertain_waits_for_the_unmount() -> None:
    exp = _explain("shop/web-0", 63.05)
    assert not exp.desired and exp.removed_us == at(63.0)
    data = exp.volumes[0]
    assert data.verdict == UNCERTAIN_VERDICT
    assert data.waiting_for[0] == (
        "pod removed: unmount pending; waiting for the reconciler to start volume_unmount"
    )
    # The mount's backoff does not hold back the unmount (a different operation).
    assert data.backoff is None
    assert "does not hold back volume_unmount" in data.waiting_for[1]


def test_an_unmount_in_backoff() -> None:
    data = _explain("shop/web-0", 63.6).volumes[0]
    assert data.backoff is not None
    assert (data.backoff.operation, data.backoff.code) == ("volume_unmount", "Internal")
    assert data.waiting_for[0].startswith(
        "pod removed: unmount pending; waiting for backoff after Internal (non-final)"
    )


def test_the_unstage_in_backoff_after_a_final_error() -> None:
    data = _explain("shop/web-0", 67.2).volumes[0]
    assert data.verdict == NOT_MOUNTED_VERDICT
    assert data.device.state == "Uncertain"
    assert data.backoff is not None and data.backoff.operation == "unmount_device"
    assert data.waiting_for == [
        "nothing for this pod: the volume is unmounted",
        "device unstage pending: waiting for backoff after FailedPrecondition (final) on "
        "unmount_device to end at 2024-05-01T03:11:07.501Z (in 0.301s); then unmount_device again",
    ]


def test_at_the_end_web_is_gone_report_backs_off_builder_runs_metrics_is_fine() -> None:
    web = _explain("shop/web-0")
    assert [v.verdict for v in web.volumes] == [NOT_MOUNTED_VERDICT, NOT_MOUNTED_VERDICT]
    assert web.volumes[0].waiting_for[-1] == "the device is detached from this node"
    report = _explain(REPORT_UID).volumes[0]
    assert report.backoff is not None and report.backoff.retry_at_us == at(176.1)
    assert report.backoff.final and report.backoff.backoff_s == 64.0
    assert report.waiting_for[-1].startswith("the last error is final (InvalidArgument")
    assert len(report.operations) == 5  # the latest five attempts
    builder = _explain(BUILDER_UID).volumes[0]
    assert builder.waiting_for == [
        "volume_mount to finish (running since 2024-05-01T03:11:48.100Z, 4.000s)"
    ]
    metrics = _explain(METRICS_UID).volumes[0]
    assert metrics.verdict == MOUNTED_VERDICT
    assert metrics.waiting_for == ["nothing: mounted since 2024-05-01T03:10:02.300Z"]


def test_a_wanted_expansion_is_awaited_while_mounted() -> None:
    tsdb = _explain("monitoring/metrics-0", 91.0).volumes[0]
    assert tsdb.verdict == MOUNTED_VERDICT
    assert tsdb.waiting_for == [
        "online expansion to 8GiB (the device has 5GiB): volume_fs_resize to finish "
        "(running since 2024-05-01T03:11:30.100Z, 0.900s)"
    ]


def test_an_unknown_pod_is_not_found() -> None:
    with pytest.raises(PodNotFoundError):
        _explain("shop/web-1")
    with pytest.raises(PodNotFoundError):
        _explain("ci/builder-7", 100.0)  # not added yet


def test_a_name_means_the_latest_pod_of_that_name() -> None:
    h = History()
    vol = DesiredVolume(name="v", volume_id="vol", source=VolumeSource(plugin="kubernetes.io/csi"))
    h.add(0, pod_stream("old"), PodAdded(pod_uid="old", namespace="ns", name="p", volumes=(vol,)))
    h.add(1, pod_stream("old"), PodRemoved(pod_uid="old", namespace="ns", name="p"))
    h.add(2, pod_stream("new"), PodAdded(pod_uid="new", namespace="ns", name="p", volumes=(vol,)))
    assert explain_pod(h.envs, "ns/p").pod_uid == "new"
    assert explain_pod(h.envs, "old").pod_uid == "old"
    assert explain_pod(h.envs[:2], "ns/p").pod_uid == "old"


def test_cli_json_and_errors(runner: CliRunner, incident: Path) -> None:
    doc = json.loads(
        run_ok(
            runner,
            [
                "explain",
                "pod",
                "shop/web-0",
                "--db",
                str(incident),
                "--at",
                "2024-05-01T03:10:25.300Z",
                "-o",
                "json",
            ],
        )
    )
    assert doc["at"] == "2024-05-01T03:10:25.300Z"
    assert doc["counts"] == {"mounted": 1, "uncertain": 0, "not mounted": 1}
    backoff = doc["volumes"][0]["backoff"]
    assert backoff["retry_at"] == "2024-05-01T03:10:25.563Z"
    assert backoff["retry_in_us"] == 263_000
    result = runner.invoke(app, ["explain", "pod", "shop/nope", "--db", str(incident)])
    assert result.exit_code == 2
    assert (
        "no pod shop/nope in this log; pods it has: batch/report-1, ci/builder-7" in result.stderr
    )


def test_a_reconstructed_entry_is_said_to_stay_uncertain() -> None:
    h = History()
    vol = DesiredVolume(name="v", volume_id="vol", source=VolumeSource(plugin="kubernetes.io/csi"))
    h.add(0, pod_stream("p"), PodAdded(pod_uid="p", namespace="ns", name="p", volumes=(vol,)))
    h.add(
        1,
        podvol_stream("p", "v"),
        VolumeMountUncertain(
            volume_id="vol",
            pod_uid="p",
            volume_name="v",
            reason="found on disk",
            reconstructed=True,
        ),
    )
    (v,) = explain_pod(h.envs, "ns/p").volumes
    assert v.pod_volume.reconstructed and v.verdict == UNCERTAIN_VERDICT
    assert v.waiting_for[0] == (
        "the reconciler to start volume_mount (desired and Uncertain: remount)"
    )
    assert "Uncertain: next mount attempt will re-publish" in v.waiting_for
    assert v.waiting_for[-1].startswith("the pod volume was reconstructed after a restart")

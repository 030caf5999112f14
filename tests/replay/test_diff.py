"""`diff`: added, removed, changed, touched and transient entries, with counts between."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from events.streams import device_stream, podvol_stream
from events.types import (
    DeviceAttached,
    OperationFailed,
    OperationStarted,
    VolumeMounted,
    VolumeMountUncertain,
)
from projections.diff import EntryChange, diff_log
from tests.projections.builders import History
from tests.replay.conftest import run_ok
from tests.replay.incident import DATA_PV, REPORT_UID, WEB_UID, envelopes


def _by_subject(changes: list[EntryChange]) -> dict[str, tuple[str, str | None, str | None, int]]:
    return {c.subject: (c.change, c.from_state, c.to_state, c.events) for c in changes}


def test_the_teardown_window() -> None:
    # seq 35 is 03:10:48.600Z, seq 62 is 03:11:08.900Z (the data device detached).
    d = diff_log(envelopes(), 35, 62)
    assert (d.from_seq, d.to_seq, d.events) == (35, 62, 27)
    assert [(p.change, p.pod) for p in d.pods] == [("removed", "shop/web-0")]
    devices = _by_subject(d.devices)
    assert devices[DATA_PV] == ("removed", "DeviceGloballyMounted", "Detached", 7)
    data = next(c for c in d.devices if c.subject == DATA_PV)
    assert data.via == ["Uncertain", "Attached"]
    assert "operations: 1 succeeded, 1 failed" in data.details
    pods = _by_subject(d.pod_volumes)
    assert pods["shop/web-0:cache"] == ("changed", "Mounted", "Unmounted", 3)
    assert pods["shop/web-0:data"] == ("touched", "Unmounted", "Unmounted", 9)
    assert pods["batch/report-1:input"] == ("touched", "Unmounted", "Unmounted", 6)
    assert "monitoring/metrics-0:tsdb" not in pods  # nothing happened to it
    per_stream = sum(c.events for c in d.devices + d.pod_volumes)
    pod_events = 1 + 0  # web-0's PodRemoved; report-1 and metrics-0 wrote no desired events
    assert per_stream + pod_events == d.events


def test_from_the_start_everything_is_added_or_came_and_went() -> None:
    d = diff_log(envelopes(), 0, 86)
    assert d.events == 86 and d.from_seq == 0
    assert {p.pod: p.change for p in d.pods} == {
        "batch/report-1": "added",
        "ci/builder-7": "added",
        "monitoring/metrics-0": "added",
        "shop/cart-0": "added",  # after waiting for its claim: see test_diff_pending
    }
    changes = {c.subject: c.change for c in d.devices}
    assert changes[DATA_PV] == "transient"
    assert sorted(changes.values()).count("added") == 4
    assert [(s.volume_id, s.from_bytes, s.to_bytes) for s in d.desired_sizes] == [
        ("pvc-2b7e4f10-9c3d-4a6e-8f21-c5d0a9e7b314", None, 8 * 1024**3)
    ]


def test_the_same_moment_twice_is_an_empty_diff() -> None:
    d = diff_log(envelopes(), 40, 40)
    assert d.empty and d.events == 0


def test_the_order_of_moments_is_checked() -> None:
    with pytest.raises(ValueError, match="before"):
        diff_log(envelopes(), 40, 30)


def test_a_round_trip_is_touched_with_the_states_it_passed() -> None:
    h = History()
    pv = podvol_stream("p", "v")
    h.add(0, device_stream("v1"), DeviceAttached(volume_id="v1", plugin="x"))
    h.add(1, pv, VolumeMounted(volume_id="v1", pod_uid="p", volume_name="v"))
    h.add(2, pv, OperationStarted(op_id="o", operation="volume_mount", volume_id="v1"))
    h.add(3, pv, VolumeMountUncertain(volume_id="v1", pod_uid="p", volume_name="v", reason="r"))
    failed = OperationFailed(
        op_id="o", operation="volume_mount", code="C", message="m", final=False
    )
    h.add(4, pv, failed)
    h.add(5, pv, VolumeMounted(volume_id="v1", pod_uid="p", volume_name="v"))
    d = diff_log(h.envs, 2, 6)
    (change,) = d.pod_volumes
    assert (change.change, change.from_state, change.to_state) == ("touched", "Mounted", "Mounted")
    assert change.via == ["Uncertain"] and change.events == 4
    assert change.details == ["operations: 1 failed"]
    assert d.devices == []


def test_cli_text_and_json_agree(runner: CliRunner, incident: Path) -> None:
    args = [
        "diff",
        "--db",
        str(incident),
        "--from",
        "2024-05-01T03:10:50Z",
        "--to",
        "2024-05-01T03:11:10Z",
    ]
    doc = json.loads(run_ok(runner, [*args, "-o", "json"]))
    assert (doc["from"], doc["to"], doc["from_seq"], doc["to_seq"], doc["events"]) == (
        "2024-05-01T03:10:50.000Z",
        "2024-05-01T03:11:10.000Z",
        35,
        62,
        27,
    )
    text = run_ok(runner, args)
    for change in doc["pod_volumes"] + doc["devices"]:
        assert any(
            line.split()[:2] == [change["change"], change["subject"]] for line in text.splitlines()
        )
    assert [p["pod_uid"] for p in doc["pods"]] == [WEB_UID]
    assert REPORT_UID in json.dumps(doc["pod_volumes"])


def test_cli_refuses_to_before_from(runner: CliRunner, incident: Path) -> None:
    from volfsm.cli import app

    result = runner.invoke(
        app,
        [
            "diff",
            "--db",
            str(incident),
            "--from",
            "2024-05-01T03:11:00Z",
            "--to",
            "2024-05-01T03:10:00Z",
        ],
    )
    assert result.exit_code == 2 and "--until is before --since" in result.stderr

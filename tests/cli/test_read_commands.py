"""The offline read commands on the demo log: table and JSON output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from events.log import EventLog
from events.tables import DEVICE_FSM, PODVOL_FSM
from events.types import PodAdded
from tests.cli.conftest import data_dir_args
from volfsm.cli import app
from volfsm.cli.demolog import DemoResult
from volfsm.render import fmt_ts

FIRST_TS = "2024-05-01T03:05:"  # the demo runs about five minutes up to 03:10:00Z


def _ok(runner: CliRunner, args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.stdout


def _json(runner: CliRunner, args: list[str]) -> Any:
    return json.loads(_ok(runner, [*args, "-o", "json"]))


def _demo_ids(demo: DemoResult) -> dict[str, str]:
    """Pod uids by name and volume ids by claim, read from the log itself."""
    ids: dict[str, str] = {}
    with EventLog(demo.path, readonly=True) as log:
        for env in log.read_after(0):
            if isinstance(env.body, PodAdded):
                ids[env.body.name] = env.body.pod_uid
                for v in env.body.volumes:
                    ids[v.claim_name or v.name] = v.volume_id
    return ids


def test_state_json_holds_the_final_state(runner: CliRunner, demo_log: DemoResult) -> None:
    doc = _json(runner, ["state", *data_dir_args(demo_log)])
    ids = _demo_ids(demo_log)
    assert doc["node"] == "demo-node"
    assert doc["as_of"]["seq"] == demo_log.last_seq
    assert doc["as_of"]["time"] == "2024-05-01T03:10:00.000Z"
    devices = {d["volume_id"]: d for d in doc["devices"]}
    assert {v: d["state"] for v, d in devices.items()} == {
        ids["metrics-tsdb"]: "DeviceGloballyMounted",
        ids["scratch"]: "Attached",
        ids["builder-ws"]: "DeviceGloballyMounted",
        ids["cart-data"]: "DeviceGloballyMounted",
    }
    assert devices[ids["metrics-tsdb"]]["size_bytes"] == 5 * 1024**3
    podvols = {(p["pod_uid"], p["volume_name"]): p for p in doc["pod_volumes"]}
    assert len(podvols) == 7
    ws = podvols[(ids["builder-7"], "workspace")]
    assert ws["state"] == "Uncertain"
    assert ws["last_operation"]["status"] == "running"
    assert ws["last_error"]["code"] == "DeadlineExceeded"
    assert ws["last_error"]["final"] is False
    assert podvols[(ids["web-0"], "data")]["state"] == "Unmounted"
    assert podvols[(ids["metrics-0"], "tsdb")]["state"] == "Mounted"
    assert {p["name"] for p in doc["desired_pods"]} == {"metrics-0", "builder-7", "cart-0"}
    assert doc["pending_pods"] == []  # cart-0 waited for its claim, and was resolved
    assert doc["desired_sizes"] == {ids["web-data"]: 20 * 1024**3}


def test_state_table_lists_devices_pod_volumes_and_pods(
    runner: CliRunner, demo_log: DemoResult
) -> None:
    out = _ok(runner, ["state", *data_dir_args(demo_log)])
    assert out.startswith(
        f"node demo-node, as of seq {demo_log.last_seq} (2024-05-01T03:10:00.000Z)"
    )
    for heading in ("Devices", "Pod volumes", "Desired pods"):
        assert f"\n{heading}\n" in out
    ws_line = next(line for line in out.splitlines() if "workspace" in line and "ci/" in line)
    assert "Uncertain" in ws_line and "volume_mount running" in ws_line
    assert "volume_mount: DeadlineExceeded: " in ws_line
    assert "(non-final, backoff 0.5s)" in ws_line
    assert "shop/web-0" in out  # a removed pod is still named
    assert "50GiB" in out


def test_state_at_seq_and_at_time(runner: CliRunner, demo_log: DemoResult) -> None:
    ids = _demo_ids(demo_log)
    web_data = ids["web-data"]
    with EventLog(demo_log.path, readonly=True) as log:
        envs = list(log.read_after(0))
    first_uncertain = next(e for e in envs if e.type == "DeviceMountUncertain")
    doc = _json(runner, ["state", "--seq", str(first_uncertain.seq), *data_dir_args(demo_log)])
    assert doc["as_of"]["seq"] == first_uncertain.seq
    assert doc["asked"] == f"seq {first_uncertain.seq}"
    dev = next(d for d in doc["devices"] if d["volume_id"] == web_data)
    assert dev["state"] == "Uncertain"
    assert dev["last_operation"]["operation"] == "mount_device"
    # One ms before the stage finally succeeded: still Uncertain, retry in flight.
    mounted = next(e for e in envs if e.type == "DeviceMounted" and e.stream.endswith(web_data))
    at = fmt_ts(mounted.ts - 1000)
    doc = _json(runner, ["state", "--at", at, *data_dir_args(demo_log)])
    dev = next(d for d in doc["devices"] if d["volume_id"] == web_data)
    assert dev["state"] == "Uncertain" and dev["last_operation"]["status"] == "running"
    assert doc["as_of"]["seq"] == mounted.seq - 1
    # The same instant with an offset instead of Z.
    doc = _json(
        runner, ["state", "--at", fmt_ts(mounted.ts)[:-1] + "+00:00", *data_dir_args(demo_log)]
    )
    dev = next(d for d in doc["devices"] if d["volume_id"] == web_data)
    assert dev["state"] == "DeviceGloballyMounted"
    before = _json(runner, ["state", "--at", "2024-05-01T00:00:00Z", *data_dir_args(demo_log)])
    assert before["as_of"]["seq"] == 0 and before["devices"] == []


def test_history_json_is_the_envelopes_and_filters_combine(
    runner: CliRunner, demo_log: DemoResult
) -> None:
    args = ["history", *data_dir_args(demo_log)]
    everything = _json(runner, args)
    assert [e["seq"] for e in everything] == list(range(1, demo_log.last_seq + 1))
    assert set(everything[0]) == {
        "seq",
        "stream",
        "version",
        "type",
        "schema",
        "ts",
        "node",
        "body",
    }
    failed = _json(runner, [*args, "--type", "OperationFailed"])
    assert [(e["body"]["operation"], e["body"]["code"]) for e in failed] == [
        ("mount_device", "DeadlineExceeded"),
        ("mount_device", "Unavailable"),
        ("unmount_device", "Internal"),
        ("volume_mount", "DeadlineExceeded"),
    ]
    assert [e["body"]["backoff_s"] for e in failed] == [0.5, 1.0, 0.5, 0.5]
    ids = _demo_ids(demo_log)
    by_pod = _json(runner, [*args, "--pod", ids["report-0"]])
    assert {e["stream"] for e in by_pod} == {
        f"pod/{ids['report-0']}",
        f"podvol/{ids['report-0']}/data",
    }
    by_volume = _json(runner, [*args, "--volume", ids["web-data"]])
    streams = {e["stream"] for e in by_volume}
    assert f"device/{ids['web-data']}" in streams
    assert f"podvol/{ids['web-0']}/data" in streams and f"podvol/{ids['report-0']}/data" in streams
    assert not any("cache" in s or "tsdb" in s for s in streams)
    one_stream = _json(runner, [*args, "--stream", f"device/{ids['web-data']}"])
    assert [e["version"] for e in one_stream] == list(range(1, len(one_stream) + 1))
    mid = everything[30]["ts"]
    window = _json(runner, [*args, "--since", fmt_ts(mid), "--until", fmt_ts(mid + 60_000_000)])
    assert window and all(mid <= e["ts"] <= mid + 60_000_000 for e in window)
    assert window[0]["seq"] <= 31


def test_history_table(runner: CliRunner, demo_log: DemoResult) -> None:
    out = _ok(runner, ["history", "--type", "DeviceMountUncertain", *data_dir_args(demo_log)])
    lines = out.splitlines()
    assert lines[0] == "3 events"  # two failed stages, one failed unstage
    assert lines[1].split() == ["SEQ", "TIME", "STREAM", "V", "TYPE", "DETAILS"]
    assert all("DeviceMountUncertain" in line for line in lines[2:])
    assert 'reason="NodeStageVolume: DeadlineExceeded"' in lines[2]
    assert lines[2].split()[1].startswith(FIRST_TS)


def test_history_rejects_an_unknown_type_and_a_bad_time(
    runner: CliRunner, demo_log: DemoResult
) -> None:
    result = runner.invoke(app, ["history", "--type", "Nope", *data_dir_args(demo_log)])
    assert result.exit_code == 2 and "unknown event type" in result.stderr
    result = runner.invoke(app, ["history", "--since", "yesterday", *data_dir_args(demo_log)])
    assert result.exit_code == 2 and "not a time" in result.stderr


def test_timeline_json_for_the_shared_volume(runner: CliRunner, demo_log: DemoResult) -> None:
    ids = _demo_ids(demo_log)
    doc = _json(runner, ["timeline", "--volume", ids["web-data"], *data_dir_args(demo_log)])
    assert doc["end"] == "2024-05-01T03:10:00.000Z"
    by_stream = {t["stream"]: t for t in doc["timelines"]}
    dev = by_stream[f"device/{ids['web-data']}"]
    assert [s["state"] for s in dev["segments"]] == [
        "Detached",
        "Attached",
        "Uncertain",
        "DeviceGloballyMounted",
        "Uncertain",
        "Attached",
        "Detached",
    ]
    assert dev["segments"][-1]["to"] is None
    total = sum(dev["time_in_state_us"].values())
    assert total == doc["end_us"] - dev["segments"][0]["from_us"]
    # Uncertain while staging: timeout at +15 s, 0.5 s backoff, 3 s try, 1 s backoff, ~2.4 s try.
    stage_uncertain = dev["segments"][2]
    assert 6_500_000 < stage_uncertain["duration_us"] < 7_500_000
    codes = [m["code"] for m in dev["operations"] if m["status"] == "failed"]
    assert codes == ["DeadlineExceeded", "Unavailable", "Internal"]
    assert set(by_stream) == {
        f"device/{ids['web-data']}",
        f"podvol/{ids['web-0']}/data",
        f"podvol/{ids['report-0']}/data",
    }
    assert {p["name"] for p in doc["pods"]} == {"web-0", "report-0"}


def test_timeline_table_for_a_pod(runner: CliRunner, demo_log: DemoResult) -> None:
    ids = _demo_ids(demo_log)
    out = _ok(runner, ["timeline", "--pod", ids["builder-7"], *data_dir_args(demo_log)])
    assert out.startswith("1 timelines, open segments measured to 2024-05-01T03:10:00.000Z")
    for heading in ("Segments", "Time in state", "Operations", "Pods"):
        assert f"\n{heading}\n" in out
    seg_lines = [line for line in out.splitlines() if line.startswith("podvol/") and "Z  " in line]
    assert "(open)" in seg_lines[1] and "Uncertain" in seg_lines[1]
    assert "NodePublishVolume: context deadline exceeded (non-final, backoff 0.5s)" in out
    assert "ci/builder-7" in out


def test_timeline_without_filter_covers_every_fsm_stream(
    runner: CliRunner, demo_log: DemoResult
) -> None:
    doc = _json(runner, ["timeline", *data_dir_args(demo_log)])
    kinds = [t["kind"] for t in doc["timelines"]]
    assert kinds.count("device") == 6 and kinds.count("podvol") == 7
    result = runner.invoke(
        app, ["timeline", "--volume", "a", "--pod", "b", *data_dir_args(demo_log)]
    )
    assert result.exit_code == 2


def test_validate_accepts_the_demo(runner: CliRunner, demo_log: DemoResult) -> None:
    out = _ok(runner, ["validate", *data_dir_args(demo_log)])
    assert out.strip() == f"ok: {demo_log.last_seq} events in 20 streams follow the tables"
    doc = _json(runner, ["validate", *data_dir_args(demo_log)])
    assert doc == {
        "ok": True,
        "events": demo_log.last_seq,
        "streams": 20,
        "last_valid_seq": demo_log.last_seq,
        "violation": None,
    }


def test_validate_reports_the_first_violation_with_exit_1(
    runner: CliRunner, tmp_path: Path
) -> None:
    from events.log import ANY_VERSION
    from events.types import DeviceAttached, DeviceMounted

    path = tmp_path / "volfsm.db"
    with EventLog(path) as log:  # bypasses the handler: the log itself accepts anything
        log.append("device/v1", 0, [DeviceAttached(volume_id="v1", plugin="csi")])
        log.append("device/v2", ANY_VERSION, [DeviceMounted(volume_id="v2")])
        log.append("device/v3", ANY_VERSION, [DeviceMounted(volume_id="v3")])
    result = runner.invoke(app, ["validate", "--db", str(path)])
    assert result.exit_code == 1
    assert "INVALID: seq 2: stream device/v2 in state Detached: DeviceMounted" in result.stdout
    result = runner.invoke(app, ["validate", "--db", str(path), "-o", "json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["last_valid_seq"] == 1
    assert doc["violation"]["seq"] == 2 and doc["violation"]["state"] == "Detached"


def test_export_ndjson_to_stdout_and_file(
    runner: CliRunner, demo_log: DemoResult, tmp_path: Path
) -> None:
    out = _ok(runner, ["export", "--format", "ndjson", *data_dir_args(demo_log)])
    lines = out.splitlines()
    assert len(lines) == demo_log.last_seq
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, demo_log.last_seq + 1))
    target = tmp_path / "out.ndjson"
    result = runner.invoke(app, ["export", "-o", str(target), *data_dir_args(demo_log)])
    assert result.exit_code == 0
    assert f"wrote {demo_log.last_seq} events to {target}" in result.stderr
    assert target.read_text() == out
    tail = _ok(runner, ["export", "--after-seq", "70", *data_dir_args(demo_log)]).splitlines()
    assert [json.loads(line)["seq"] for line in tail] == list(range(71, demo_log.last_seq + 1))


def test_diagram_prints_every_transition_of_both_machines(runner: CliRunner) -> None:
    out = _ok(runner, ["diagram"])
    assert out.count("stateDiagram-v2") == 2
    for table in (DEVICE_FSM, PODVOL_FSM):
        assert f"[*] --> {table.initial}" in out
        for t in table.transitions:
            for src in t.sources:
                dest = src if t.dest is None else t.dest
                assert f"{src} --> {dest}: {t.trigger} / {t.event}" in out
    device_only = _ok(runner, ["diagram", "device"])
    assert "stateDiagram-v2" in device_only and "VolumeMounted" not in device_only
    fenced = _ok(runner, ["diagram", "podvol", "--markdown"])
    assert fenced.startswith("```mermaid\nstateDiagram-v2\n") and fenced.rstrip().endswith("```")

"""`volfsm replay`: the window, its boundaries, JSON, errors, the progress bar switch."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from events.log import EventLog
from tests.replay.conftest import run_ok
from tests.replay.golden import GOLDEN_DIR
from volfsm.cli import app
from volfsm.cli import replay as replay_cli
from volfsm.cli.common import Output

SEQ_16_AT = "2024-05-01T03:10:25.062Z"  # seq 16 (DeviceMountUncertain) is stamped exactly then
SEQ_26_AT = "2024-05-01T03:10:41.930Z"  # seq 26


def _seqs(out: str) -> list[int]:
    return [int(line.split()[1][1:]) for line in out.splitlines() if line.startswith("2024-")]


def test_the_window_holds_events_at_and_between_its_bounds(
    runner: CliRunner, incident: Path
) -> None:
    out = run_ok(
        runner, ["replay", "--db", str(incident), "--from", SEQ_16_AT, "--until", SEQ_26_AT]
    )
    assert _seqs(out) == list(range(16, 27))
    assert out.splitlines()[0] == (
        f"replay of node node-7 from {SEQ_16_AT} to {SEQ_26_AT}: 11 events (seq 16-26); "
        "15 earlier events folded first"
    )
    first = out.splitlines()[1]
    # The device was Attached before the window: the first line knows it.
    assert first.endswith(
        "device pvc-7d1c0e95-3a8f-4b2d-9e64-1f5c8a2b7d03: Attached -> "
        "Uncertain: stage may be in progress (DeadlineExceeded: MountDevice "
        "did not finish within 15 s)"
    )
    assert "state at the end (seq 26, 2024-05-01T03:10:41.930Z):" in out


def test_the_end_state_is_the_state_at_until(runner: CliRunner, incident: Path) -> None:
    replay_doc = json.loads(
        run_ok(runner, ["replay", "--db", str(incident), "--until", SEQ_26_AT, "-o", "json"])
    )
    state_doc = json.loads(
        run_ok(runner, ["state", "--db", str(incident), "--at", SEQ_26_AT, "-o", "json"])
    )
    devices = {
        e["stream"][len("device/") :]: e["state"]
        for e in replay_doc["state"]["entries"]
        if e["kind"] == "device"
    }
    assert devices == {d["volume_id"]: d["state"] for d in state_doc["devices"]}
    assert replay_doc["state"]["seq"] == state_doc["as_of"]["seq"] == 26


def test_json_has_one_line_per_event_with_the_same_keys(runner: CliRunner, incident: Path) -> None:
    doc = json.loads(run_ok(runner, ["replay", "--db", str(incident), "-o", "json"]))
    assert doc["window"] == {
        "node": "node-7",
        "from": None,
        "until": None,
        "first_seq": 1,
        "last_seq": 86,
        "events": 86,
        "folded_before": 0,
    }
    lines = doc["lines"]
    assert [line["seq"] for line in lines] == list(range(1, 87))
    assert len({tuple(line) for line in lines}) == 1  # every line has the same keys
    failed = [line for line in lines if line["type"] == "OperationFailed"]
    assert {line["code"] for line in failed} == {
        "DeadlineExceeded",
        "Unavailable",
        "Internal",
        "FailedPrecondition",
        "InvalidArgument",
    }
    assert all(line["retry_at"] and line["backoff_s"] is not None for line in failed)
    started = [line for line in lines if line["type"] == "OperationStarted"]
    assert all(line["reason"] for line in started)
    moves = [(line["from_state"], line["to_state"]) for line in lines if line["from_state"]]
    assert ("Uncertain", "Unmounted") in moves and ("DeviceGloballyMounted", "Uncertain") in moves


def test_an_empty_window_still_shows_the_state(runner: CliRunner, incident: Path) -> None:
    out = run_ok(runner, ["replay", "--db", str(incident), "--from", "2024-05-01T04:00:00Z"])
    assert "0 events (no events); 86 earlier events folded first" in out.splitlines()[0]
    assert _seqs(out) == []
    assert "state at the end (seq 86, 2024-05-01T03:11:52.100Z):" in out


def test_until_before_from_is_refused(runner: CliRunner, incident: Path) -> None:
    result = runner.invoke(
        app, ["replay", "--db", str(incident), "--from", SEQ_26_AT, "--until", SEQ_16_AT]
    )
    assert result.exit_code == 2
    assert "--until is before --since" in result.stderr


def test_a_missing_log_is_a_one_line_error(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["replay", "--db", str(tmp_path / "nope.db")])
    assert result.exit_code == 2
    assert result.stderr.startswith("volfsm: error: ")
    assert "nope.db" in result.stderr


def test_no_progress_bar_when_output_is_not_a_terminal(runner: CliRunner, incident: Path) -> None:
    result = runner.invoke(app, ["replay", "--db", str(incident)])
    assert result.exit_code == 0
    assert result.stderr == ""


def test_progress_is_wanted_only_for_long_replays_on_terminals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    big = replay_cli.PROGRESS_MIN_EVENTS
    assert replay_cli.progress_wanted(True, 1) is True
    assert replay_cli.progress_wanted(False, 10 * big) is False
    assert replay_cli.progress_wanted(None, 10 * big) is False  # pytest's stdout is no terminal

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdout", Tty())
    monkeypatch.setattr(sys, "stderr", Tty())
    assert replay_cli.progress_wanted(None, big) is True
    assert replay_cli.progress_wanted(None, big - 1) is False


def test_a_forced_progress_bar_goes_to_stderr_and_leaves_stdout_alone(
    incident: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with EventLog(incident, readonly=True) as log:
        window = replay_cli.resolve_window(log, None, None)
        out = io.StringIO()
        replay_cli.run_replay(log, window, Output.table, progress=True, out=out)
        plain = io.StringIO()
        replay_cli.run_replay(log, window, Output.table, progress=False, out=plain)
    assert out.getvalue() == plain.getvalue()
    assert capsys.readouterr().out == ""


def test_a_real_process_prints_the_golden_story(incident: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "volfsm.cli", "replay", "--db", str(incident)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout == (GOLDEN_DIR / "replay_full.txt").read_text(encoding="utf-8")

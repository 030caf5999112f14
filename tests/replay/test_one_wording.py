"""One operation, one wording: `state`, `get`, `replay` and `explain` describe it alike.

The recorded incident ends with batch/report-1's `input` volume failed with a
final InvalidArgument (its last operation and its last error are the same
record). Every command that shows that record must print the same words for
it, built by `projections.textfmt`.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from projections.asw import OperationRecord
from projections.textfmt import describe_attempt, describe_error, describe_operation
from tests.replay.conftest import run_ok
from volfsm.cli.ops import print_pods
from volfsm.engine.status import operation_status

REPORT_UID = "b41d9e07-6c2a-4f85-8e3d-2a7b1c9f0d64"

OPERATION = "volume_mount failed in 0.200s"
ERROR = (
    'volume_mount: InvalidArgument: rpc error: code = InvalidArgument desc = mount option "data='
    'journal" is not supported (final, backoff 64s)'
)
ATTEMPT = (
    "volume_mount failed in 0.200s: InvalidArgument: rpc error: code = InvalidArgument desc = "
    'mount option "data=journal" is not supported (final, backoff 64s)'
)


@pytest.fixture
def record(runner: CliRunner, incident: Path) -> OperationRecord:
    """The report pod's last operation, as the log's fold holds it."""
    state = json.loads(run_ok(runner, ["state", "--db", str(incident), "-o", "json"]))
    (entry,) = (
        p
        for p in state["pod_volumes"]
        if p["pod_uid"] == REPORT_UID and p["volume_name"] == "input"
    )
    assert entry["last_operation"] == entry["last_error"]
    return msgspec.convert(entry["last_operation"], OperationRecord)


def test_the_words_themselves(record: OperationRecord) -> None:
    assert describe_operation(record) == OPERATION
    assert describe_error(record) == ERROR
    assert describe_attempt(record) == ATTEMPT


def _line(out: str, *needles: str) -> str:
    return next(line for line in out.splitlines() if all(n in line for n in needles))


def test_state_words_it(runner: CliRunner, incident: Path) -> None:
    out = run_ok(runner, ["state", "--db", str(incident)])
    line = _line(out, "batch/report-1", "input")
    assert OPERATION in line
    assert ERROR in line


def test_get_words_it(record: OperationRecord, capsys: pytest.CaptureFixture[str]) -> None:
    """`volfsm get pods` on the status the engine sends for that record."""
    status = msgspec.to_builtins(operation_status(record))
    reply = {
        "node": "n1",
        "items": [
            {
                "uid": REPORT_UID,
                "namespace": "batch",
                "name": "report-1",
                "phase": "Pending",
                "volumes": [
                    {
                        "name": "input",
                        "state": "Unmounted",
                        "last_operation": status,
                        "last_error": status,
                    }
                ],
            }
        ],
    }
    print_pods(reply)
    line = _line(capsys.readouterr().out, "batch/report-1", "input")
    assert OPERATION in line
    assert ERROR in line


def test_replay_words_it(runner: CliRunner, incident: Path) -> None:
    out = run_ok(runner, ["replay", "--db", str(incident)])
    assert f"; last op {ATTEMPT}" in _line(out, "batch/report-1:input: Unmounted since")


def test_explain_words_it(runner: CliRunner, incident: Path) -> None:
    out = run_ok(runner, ["explain", "pod", "batch/report-1", "--db", str(incident)])
    assert any(line.endswith(f"[pod volume] {ATTEMPT}") for line in out.splitlines())

"""Golden output of `replay`, `diff` and `explain` on the recorded incident (plain text, no TTY).

Regenerate with VOLFSM_UPDATE_GOLDEN=1 (see tests/replay/golden.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.replay.conftest import run_ok
from tests.replay.golden import check_golden

WEB_UID = "8c2e5d71-1a4f-4c3b-b6e2-9d0f3a7c5e18"

CASES: dict[str, list[str]] = {
    "replay_full.txt": ["replay"],
    "replay_window.txt": [
        "replay",
        "--since",
        "2024-05-01T03:11:00Z",
        "--until",
        "2024-05-01T03:11:10Z",
    ],
    "replay_window_json.txt": [
        "replay",
        "--since",
        "2024-05-01T03:10:25Z",
        "--until",
        "2024-05-01T03:10:42Z",
        "-o",
        "json",
    ],
    "diff_teardown.txt": [
        "diff",
        "--since",
        "2024-05-01T03:10:50Z",
        "--until",
        "2024-05-01T03:11:10Z",
    ],
    "diff_whole.txt": ["diff", "--since", "2024-05-01T03:09:00Z"],
    "diff_teardown_json.txt": [
        "diff",
        "--since",
        "2024-05-01T03:10:50Z",
        "--until",
        "2024-05-01T03:11:10Z",
        "-o",
        "json",
    ],
    "explain_web_staging.txt": ["explain", "pod", "shop/web-0", "--at", "2024-05-01T03:10:30Z"],
    "explain_web_deleted.txt": ["explain", "pod", "shop/web-0", "--at", "2024-05-01T03:11:04.200Z"],
    "explain_web_unstaging.txt": [
        "explain",
        "pod",
        WEB_UID,
        "--at",
        "2024-05-01T03:11:07.200Z",
    ],
    "explain_report_end.txt": ["explain", "pod", "batch/report-1"],
    "explain_builder_end.txt": ["explain", "pod", "ci/builder-7"],
    "explain_metrics_end.txt": ["explain", "pod", "monitoring/metrics-0"],
    "explain_report_json.txt": ["explain", "pod", "batch/report-1", "-o", "json"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_output(name: str, runner: CliRunner, incident: Path) -> None:
    out = run_ok(runner, [*CASES[name], "--db", str(incident)])
    check_golden(name, out)

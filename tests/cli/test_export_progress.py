"""`volfsm export --progress`: the bar goes to stderr and never changes what is exported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

INCIDENT = Path(__file__).resolve().parents[1] / "data" / "incident.db"


def export(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "volfsm.cli", "export", "--db", str(INCIDENT), *args],
        capture_output=True,
        timeout=120,
        check=True,
    )


def test_a_forced_progress_bar_leaves_the_export_identical(tmp_path: Path) -> None:
    plain = export("--no-progress")
    barred = export("--progress")
    assert barred.stdout == plain.stdout
    assert plain.stdout.count(b"\n") > 10
    to_file = tmp_path / "events.ndjson"
    result = export("--progress", "-o", str(to_file))
    assert to_file.read_bytes() == plain.stdout
    assert b"wrote " in result.stderr and str(to_file).encode() in result.stderr

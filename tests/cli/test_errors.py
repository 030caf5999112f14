"""Unusable log files: one clear line naming the path, exit code 2, no traceback, file untouched."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from events.log import EventLog
from events.types import PodAdded
from volfsm.cli import app

READ_COMMANDS = [["state"], ["history"], ["timeline"], ["validate"], ["export"]]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_clean_error(result: object, path: Path, words: str) -> None:
    exit_code = result.exit_code  # type: ignore[attr-defined]
    stderr: str = result.stderr  # type: ignore[attr-defined]
    assert exit_code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("volfsm: error: ")
    assert str(path) in lines[0] and words in lines[0]
    assert "Traceback" not in stderr


@pytest.mark.parametrize("command", READ_COMMANDS)
def test_missing_log(runner: CliRunner, tmp_path: Path, command: list[str]) -> None:
    result = runner.invoke(app, [*command, "--data-dir", str(tmp_path / "nowhere")])
    _assert_clean_error(result, tmp_path / "nowhere" / "volfsm.db", "no volfsm event log")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("command", READ_COMMANDS)
def test_foreign_text_file_is_refused_and_untouched(
    runner: CliRunner, tmp_path: Path, command: list[str]
) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n" * 100)
    before = _digest(path)
    result = runner.invoke(app, [*command, "--db", str(path)])
    _assert_clean_error(result, path, "not a volfsm event log")
    assert _digest(path) == before


def test_foreign_sqlite_database_is_refused_and_untouched(
    runner: CliRunner, tmp_path: Path
) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE things (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO things (name) VALUES ('x')")
    conn.commit()
    conn.close()
    before = _digest(path)
    result = runner.invoke(app, ["state", "--db", str(path)])
    _assert_clean_error(result, path, "not a volfsm event log")
    assert _digest(path) == before


def test_log_from_a_newer_volfsm_is_refused_and_untouched(
    runner: CliRunner, tmp_path: Path
) -> None:
    path = tmp_path / "volfsm.db"
    with EventLog(path) as log:
        log.append("pod/p", 0, [PodAdded(pod_uid="p", namespace="ns", name="p")])
    conn = sqlite3.connect(path)
    conn.execute("UPDATE volfsm_meta SET value = '99' WHERE key = 'log_schema'")
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = _digest(path)
    for command in READ_COMMANDS:
        result = runner.invoke(app, [*command, "--data-dir", str(tmp_path)])
        _assert_clean_error(result, path, "newer volfsm")
    assert _digest(path) == before


def test_empty_file_and_directory_are_refused(runner: CliRunner, tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    _assert_clean_error(runner.invoke(app, ["state", "--db", str(empty)]), empty, "empty file")
    assert empty.stat().st_size == 0
    _assert_clean_error(
        runner.invoke(app, ["history", "--db", str(tmp_path)]), tmp_path, "is a directory"
    )


def test_data_dir_comes_from_the_environment(runner: CliRunner, tmp_path: Path) -> None:
    with EventLog(tmp_path / "volfsm.db") as log:
        log.append("pod/p", 0, [PodAdded(pod_uid="p", namespace="ns", name="web")])
    result = runner.invoke(app, ["state"], env={"VOLFSM_DATA_DIR": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert "ns/web" in result.stdout
    missing = tmp_path / "elsewhere"
    result = runner.invoke(app, ["state"], env={"VOLFSM_DATA_DIR": str(missing)})
    _assert_clean_error(result, missing / "volfsm.db", "no volfsm event log")


def test_at_and_seq_together_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["state", "--at", "now", "--seq", "3", "--db", str(tmp_path)])
    assert result.exit_code == 2
    assert "not both" in result.stderr


def test_console_entry_point_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    """Through a real interpreter (`python -m volfsm.cli`), as a user runs it."""
    path = tmp_path / "junk.db"
    path.write_bytes(b"\x00garbage" * 64)
    proc = subprocess.run(
        [sys.executable, "-m", "volfsm.cli", "state", "--db", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert str(path) in proc.stderr and "Traceback" not in proc.stderr

"""tests/data/incident.db is what tests/data/make_incident.py writes, and a legal log."""

from __future__ import annotations

import importlib.util
import sqlite3
from pathlib import Path
from types import ModuleType

from events.log import EventLog
from projections.validate import validate
from tests.replay.conftest import DATA, INCIDENT


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_incident", DATA / "make_incident.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return conn.execute("SELECT * FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()


def test_the_script_writes_exactly_the_committed_log(tmp_path: Path) -> None:
    fresh = tmp_path / "incident.db"
    events = _script().write_incident(fresh)
    assert events == 86
    assert _rows(fresh) == _rows(INCIDENT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["incident.db"]  # no -wal, -shm, .lock


def test_the_committed_log_is_legal_and_needs_no_side_files() -> None:
    with EventLog(INCIDENT, readonly=True) as log:
        assert log.node == "node-7"
        report = validate(log.read_after(0))
    assert report.ok, report.violation
    assert (report.events, report.streams) == (86, 19)
    conn = sqlite3.connect(f"file:{INCIDENT}?immutable=1", uri=True)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    finally:
        conn.close()

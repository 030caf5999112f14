"""Log schema 3 (snapshot tables): older logs gain it on open, newer logs are refused untouched."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from events.errors import NewerSchemaError
from events.log import LOG_SCHEMA, EventLog
from volfsm.engine.snapshot import KIND, encode_state, restore, save_state

from .histories import StepClock, fresh_parts, full_fold, random_history, state_view, write_history


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _meta(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT key, value FROM volfsm_meta").fetchall())
    finally:
        conn.close()


def _tables(path: Path) -> set[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()


def _log_with_history(path: Path, *, snapshot: bool) -> int:
    with EventLog(path, node="n1", clock=StepClock()) as log:
        last = write_history(log, random_history(seed=8, steps=200))
        if snapshot:
            save_state(log, last, encode_state(*full_fold(log), seq=last))
    return last


def _rewrite_schema(path: Path, schema: int, *, drop_snapshots: bool = False) -> None:
    conn = sqlite3.connect(path)
    with conn:
        if drop_snapshots:
            conn.execute("DROP TABLE snapshots")
            conn.execute("DROP TABLE snapshot_chunks")
        conn.execute("UPDATE volfsm_meta SET value = ? WHERE key = 'log_schema'", (str(schema),))
    conn.close()  # the last connection: checkpointed, no -wal left


@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "readonly"])
def test_a_log_of_a_newer_schema_is_refused_and_left_untouched(
    tmp_path: Path, readonly: bool
) -> None:
    path = tmp_path / "future.db"
    _log_with_history(path, snapshot=True)
    _rewrite_schema(path, LOG_SCHEMA + 1)
    before = _sha(path)
    siblings = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(NewerSchemaError) as err:
        EventLog(path, readonly=readonly)
    message = str(err.value)
    assert f"log schema {LOG_SCHEMA + 1}" in message
    assert f"this build reads up to {LOG_SCHEMA}" in message
    assert "upgrade volfsm" in message and "not modified" in message
    assert _sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == siblings  # no -wal, -shm, .lock


def test_a_schema_2_log_gains_the_snapshot_tables_when_opened_for_writing(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    last = _log_with_history(path, snapshot=False)
    _rewrite_schema(path, 2, drop_snapshots=True)
    assert "snapshots" not in _tables(path)
    with EventLog(path, node="n1") as log:
        assert log.last_seq() == last
        parts = fresh_parts()
        report = restore(log, *parts)
        assert report.snapshot is None and report.no_snapshot_reason == "no snapshot stored"
        save_state(log, last, encode_state(*parts, seq=last))
        assert [h.seq for h in log.snapshots.headers(KIND)] == [last]
    assert _meta(path)["log_schema"] == str(LOG_SCHEMA) == "3"
    assert {"snapshots", "snapshot_chunks"} <= _tables(path)


def test_a_schema_2_log_read_only_is_unchanged_and_replayed_in_full(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    last = _log_with_history(path, snapshot=False)
    _rewrite_schema(path, 2, drop_snapshots=True)
    before = _sha(path)
    with EventLog(path, readonly=True) as log:
        parts = fresh_parts()
        report = restore(log, *parts)
        assert report.snapshot is None
        assert "no snapshot tables" in report.no_snapshot_reason
        assert report.events_replayed == last
        assert state_view(parts) == state_view(full_fold(log))
    assert _sha(path) == before


def test_snapshots_are_read_from_a_read_only_log(tmp_path: Path) -> None:
    path = tmp_path / "copy.db"
    last = _log_with_history(path, snapshot=True)
    before = _sha(path)
    with EventLog(path, readonly=True) as log:
        parts = fresh_parts()
        report = restore(log, *parts)
        assert report.snapshot is not None and report.snapshot.seq == last
        assert report.events_replayed == 0
        assert state_view(parts) == state_view(full_fold(log))
    assert _sha(path) == before

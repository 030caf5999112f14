"""The log's identity (`log_id` in volfsm_meta): made with the log, kept by copies, added to
old logs when they are first opened for writing; and the stream-prefix lookup."""

from __future__ import annotations

import shutil
import sqlite3
import uuid
from pathlib import Path

from events.log import LOG_ID_KEY, EventLog
from tests.events.helpers import attached, sha256


def _meta_id(path: Path) -> str | None:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT value FROM volfsm_meta WHERE key = ?", (LOG_ID_KEY,)).fetchone()
    finally:
        conn.close()
    return None if row is None else str(row[0])


def test_a_new_log_has_an_id_that_reopening_and_copying_keep(tmp_path: Path) -> None:
    path = tmp_path / "volfsm.db"
    with EventLog(path, node="n1") as log:
        first = log.log_id
        log.append("device/a", 0, [attached("a")])
    assert uuid.UUID(first) and _meta_id(path) == first
    with EventLog(path, node="n1") as log:
        assert log.log_id == first
    copy = tmp_path / "copy" / "volfsm.db"
    copy.parent.mkdir()
    shutil.copy2(path, copy)
    with EventLog(copy, readonly=True) as ro:
        assert ro.log_id == first
    with EventLog(tmp_path / "other.db", node="n1") as other:
        assert other.log_id not in ("", first)


def test_an_old_log_without_an_id_gets_one_when_opened_for_writing_only(tmp_path: Path) -> None:
    path = tmp_path / "volfsm.db"
    with EventLog(path, node="n1") as log:
        log.append("device/a", 0, [attached("a")])
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM volfsm_meta WHERE key = ?", (LOG_ID_KEY,))
    conn.close()
    before = sha256(path)

    with EventLog(path, readonly=True) as ro:
        assert ro.log_id == "" and ro.last_seq() == 1
    assert sha256(path) == before

    with EventLog(path, node="n1") as log:
        given = log.log_id
        assert [e.seq for e in log.read_after(0)] == [1]
    assert uuid.UUID(given) and _meta_id(path) == given
    with EventLog(path, node="n1") as log:
        assert log.log_id == given


def _check_streams(log: EventLog) -> None:
    assert log.has_stream("pod/u1") and not log.has_stream("pod/u2")
    assert log.has_stream("podvol/u2/", prefix=True)
    assert not log.has_stream("podvol/u1/", prefix=True)
    assert not log.has_stream("podvol/u", prefix=False)
    assert log.has_stream("podvol/u", prefix=True)


def test_has_stream_finds_a_stream_or_any_stream_under_a_prefix(tmp_path: Path) -> None:
    path = tmp_path / "volfsm.db"
    with EventLog(path, node="n1") as log:
        log.append("pod/u1", 0, [attached("x")])
        log.append("podvol/u2/data", 0, [attached("y")])
        _check_streams(log)  # from the unindexed tail
    with EventLog(path, node="n1") as log:
        _check_streams(log)  # from the stream index (indexed on open)

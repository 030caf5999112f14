"""The stream index: kept off the append path, merged with the unindexed tail on reads.

Also: logs written by schema 1 (unique index on events) are read in place and
upgraded when opened for writing.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from events import log as log_module
from events.codec import encode_body
from events.errors import ConflictError
from events.log import LOG_SCHEMA, EventLog
from tests.events.helpers import T0, assert_valid_log, attached, ops, sha256, started


def _indexed_seq(path: Path) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT indexed_seq FROM index_state").fetchone()[0])
    finally:
        conn.close()


def _index_rows(path: Path) -> list[tuple[str, int, int]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT stream, version, seq FROM stream_index ORDER BY seq").fetchall()
    finally:
        conn.close()


@pytest.fixture
def no_idle_indexing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the writer from indexing while idle: the tail stays until close."""
    monkeypatch.setattr(log_module, "_INDEX_IDLE_S", 3600.0)


@pytest.mark.usefixtures("no_idle_indexing")
def test_reads_merge_the_index_and_the_unindexed_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_module, "_INDEX_FLUSH_EVENTS", 5)
    path = tmp_path / "events.db"
    with EventLog(path) as log:
        log.append("device/a", 0, ops("a", 3))  # 3 unindexed: below the threshold
        assert _indexed_seq(path) == 0
        assert [e.version for e in log.read_stream("device/a")] == [1, 2, 3]
        log.append("device/b", 0, ops("b", 2))  # 5: the writer indexes seq 1..5
        log.append("device/a", 3, ops("a2", 2))  # 6, 7 stay in the tail
        assert _indexed_seq(path) == 5
        assert [e.seq for e in log.read_stream("device/a")] == [1, 2, 3, 6, 7]
        assert [e.version for e in log.read_stream("device/a", after_version=2)] == [3, 4, 5]
        assert [e.version for e in log.read_stream("device/a", after_version=4)] == [5]
        assert log.stream_version("device/a") == 5
        assert log.stream_version("device/b") == 2
        log.append("device/c", 0, ops("c", 1))
        assert log.streams() == ["device/a", "device/b", "device/c"]
        with EventLog(path, readonly=True) as ro:  # another reader sees the same
            assert [e.seq for e in ro.read_stream("device/a")] == [1, 2, 3, 6, 7]
            assert ro.stream_version("device/c") == 1
        with pytest.raises(ConflictError):  # conflicts are checked across index and tail
            log.append("device/a", 4, ops("x", 1))
    # close() indexes the rest.
    assert _indexed_seq(path) == 8
    assert [r[2] for r in _index_rows(path)] == list(range(1, 9))


def test_idle_writer_indexes_the_tail(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with EventLog(path) as log:
        log.append("device/a", 0, ops("a", 2))
        deadline = time.monotonic() + 30
        while _indexed_seq(path) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # the writer has nothing else to do: it indexes soon
        assert _indexed_seq(path) == 2
        assert [e.seq for e in log.read_stream("device/a")] == [1, 2]


@pytest.mark.usefixtures("no_idle_indexing")
def test_a_crash_leaves_an_unindexed_tail_that_reopening_indexes(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    crashed = tmp_path / "crashed.db"
    with EventLog(path) as log:
        log.append("device/a", 0, ops("a", 4))
        log.append("device/b", 0, ops("b", 1))
        # A copy of the files taken now is what a SIGKILL would leave behind.
        crashed.write_bytes(path.read_bytes())
        Path(f"{crashed}-wal").write_bytes(Path(f"{path}-wal").read_bytes())
    assert _indexed_seq(crashed) == 0
    with EventLog(crashed, readonly=True) as ro:
        assert [e.version for e in ro.read_stream("device/a")] == [1, 2, 3, 4]
        assert ro.streams() == ["device/a", "device/b"]
    with EventLog(crashed) as log:
        assert _indexed_seq(crashed) == 5
        with pytest.raises(ConflictError):
            log.append("device/a", 3, ops("x", 1))
        assert log.append("device/a", 4, ops("x", 1))[0].seq == 6
    assert _index_rows(crashed)[:5] == [
        ("device/a", 1, 1),
        ("device/a", 2, 2),
        ("device/a", 3, 3),
        ("device/a", 4, 4),
        ("device/b", 1, 5),
    ]
    assert_valid_log(crashed)


SCHEMA_1 = [
    "CREATE TABLE volfsm_meta (key TEXT PRIMARY KEY, value TEXT)",
    "CREATE TABLE events (seq INTEGER PRIMARY KEY, stream TEXT NOT NULL, "
    "version INTEGER NOT NULL, type TEXT NOT NULL, schema INTEGER NOT NULL, "
    "ts INTEGER NOT NULL, node TEXT NOT NULL, body BLOB NOT NULL)",
    "CREATE UNIQUE INDEX idx_events_stream_version ON events (stream, version)",
    "CREATE INDEX idx_events_ts ON events (ts)",
    "CREATE TABLE cursors (name TEXT PRIMARY KEY, seq INTEGER, updated_us INTEGER)",
]


def _schema_1_log(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    for ddl in SCHEMA_1:
        conn.execute(ddl)
    conn.executemany(
        "INSERT INTO volfsm_meta VALUES (?, ?)",
        [("format", "volfsm-event-log"), ("log_schema", "1"), ("node", "old-node")],
    )
    rows = [
        (1, "device/a", 1, "DeviceAttached", 1, T0, "old-node", encode_body(attached("a"))),
        (2, "podvol/u/d", 1, "OperationStarted", 1, T0, "old-node", encode_body(started("o"))),
        (3, "device/a", 2, "OperationStarted", 1, T0 + 1, "old-node", encode_body(started("p"))),
    ]
    conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.execute("INSERT INTO cursors VALUES ('publisher', 2, 0)")
    conn.close()


def test_schema_1_log_is_read_in_place_without_changes(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _schema_1_log(path)
    before = sha256(path)
    with EventLog(path, readonly=True) as ro:
        assert ro.node == "old-node"
        assert [e.seq for e in ro.read_stream("device/a")] == [1, 3]
        assert ro.stream_version("device/a") == 2
        assert ro.streams() == ["device/a", "podvol/u/d"]
        assert [e.seq for e in ro.read_after(0)] == [1, 2, 3]
        assert ro.get_cursor("publisher") == 2
    assert sha256(path) == before


def test_schema_1_log_is_upgraded_when_opened_for_writing(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _schema_1_log(path)
    with EventLog(path) as log:
        with pytest.raises(ConflictError):
            log.append("device/a", 1, ops("x", 1))
        envs = log.append("device/a", 2, ops("x", 1))
        assert (envs[0].seq, envs[0].version, envs[0].node) == (4, 3, "old-node")
        assert [e.seq for e in log.read_stream("device/a")] == [1, 3, 4]
    conn = sqlite3.connect(path)
    meta = dict(conn.execute("SELECT key, value FROM volfsm_meta").fetchall())
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert meta["log_schema"] == str(LOG_SCHEMA)
    assert {"snapshots", "snapshot_chunks"} <= tables  # 1 -> 2 -> 3 in one open
    assert "idx_events_stream_version" not in indexes
    assert _indexed_seq(path) == 4
    assert_valid_log(path)

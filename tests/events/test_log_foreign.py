"""Files that are not volfsm logs (or are from a newer volfsm) are refused untouched."""

from __future__ import annotations

import os
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from events.errors import LogOpenError, NewerSchemaError, NotAVolfsmLogError
from events.log import EventLog
from tests.events.helpers import ops, sha256


def _text_file(path: Path) -> None:
    path.write_text("# not a database\nkey = value\n" * 50)


def _binary_file(path: Path) -> None:
    path.write_bytes(random.Random(7).randbytes(64 * 1024))


def _other_app_db(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    conn.executemany("INSERT INTO notes (text) VALUES (?)", [(f"note {i}",) for i in range(100)])
    conn.commit()
    conn.close()


def _other_app_wal_db(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE events (seq INTEGER PRIMARY KEY, stream TEXT)")  # a lookalike
    conn.execute("CREATE TABLE volfsm_meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO volfsm_meta VALUES ('format', 'someone-else')")
    conn.commit()
    conn.close()


def _newer_volfsm_log(path: Path) -> None:
    with EventLog(path, node="future") as log:
        log.append("device/v", 0, ops("a", 3))
    conn = sqlite3.connect(path)
    conn.execute("UPDATE volfsm_meta SET value = '99' WHERE key = 'log_schema'")
    conn.commit()
    conn.close()  # the last connection: checkpoints and removes the -wal


CASES: list[tuple[str, Callable[[Path], None], type[LogOpenError], str]] = [
    ("notes.txt", _text_file, NotAVolfsmLogError, "not a volfsm event log"),
    ("blob.bin", _binary_file, NotAVolfsmLogError, "not a volfsm event log"),
    ("other.sqlite", _other_app_db, NotAVolfsmLogError, "no volfsm_meta table"),
    ("other-wal.sqlite", _other_app_wal_db, NotAVolfsmLogError, "format 'someone-else'"),
    ("future.db", _newer_volfsm_log, NewerSchemaError, "newer volfsm (log schema 99"),
]


@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "readonly"])
@pytest.mark.parametrize(("name", "make", "error", "words"), CASES, ids=[c[0] for c in CASES])
def test_foreign_file_is_refused_and_left_byte_identical(
    tmp_path: Path,
    name: str,
    make: Callable[[Path], None],
    error: type[LogOpenError],
    words: str,
    readonly: bool,
) -> None:
    path = tmp_path / name
    make(path)
    before = sha256(path)
    siblings = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(error) as err:
        EventLog(path, readonly=readonly)
    assert type(err.value) is error
    assert str(path) in str(err.value)
    assert words in str(err.value)
    assert sha256(path) == before
    # Nothing was created beside it either: no -wal, -shm or .lock file.
    assert sorted(p.name for p in tmp_path.iterdir()) == siblings


def test_newer_schema_message_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    _newer_volfsm_log(path)
    with pytest.raises(NewerSchemaError, match="upgrade volfsm"):
        EventLog(path)
    with pytest.raises(NewerSchemaError, match="not modified"):
        EventLog(path, readonly=True)


def test_text_file_gets_no_sqlite_side_files(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    _text_file(path)
    for readonly in (False, True):
        with pytest.raises(NotAVolfsmLogError, match="not an SQLite database"):
            EventLog(path, readonly=readonly)
    assert not Path(f"{path}-wal").exists()
    assert not Path(f"{path}-shm").exists()
    assert not Path(f"{path}.lock").exists()


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(NotAVolfsmLogError, match="empty file"):
        EventLog(path, readonly=True)
    assert path.stat().st_size == 0


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LogOpenError, match="does not exist"):
        EventLog(tmp_path / "no" / "such" / "events.db")


def test_a_log_left_with_its_wal_still_opens(tmp_path: Path) -> None:
    """A writer killed before its WAL was checkpointed leaves a valid log, not a foreign file."""
    path = tmp_path / "events.db"
    log = EventLog(path)
    log.append("device/v", 0, ops("a", 2))
    # Simulate the crash: copy the database and its WAL while the writer still runs.
    copy = tmp_path / "copy.db"
    copy.write_bytes(path.read_bytes())
    Path(f"{copy}-wal").write_bytes(Path(f"{path}-wal").read_bytes())
    log.close()
    assert os.path.getsize(f"{copy}-wal") > 0
    with EventLog(copy, readonly=True) as ro:
        assert ro.last_seq() == 2
    with EventLog(copy) as rw:
        assert rw.append("device/v", 2, ops("b", 1))[0].seq == 3

"""A damaged or foreign snapshot is ignored, never trusted: the next older one, else a replay.

The log holds a fixed history with two good snapshots (seq 200 and 400,
stored in 128-byte chunks). Each case damages the newest as a disk, an
operator or a restore from backup could; the start must refuse it with a
warning naming why, use the one at 200 plus the tail, and end with exactly
the state of a full fold.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import zlib
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from events.log import EventLog
from volfsm.engine.snapshot import (
    FORMAT_VERSION,
    KIND,
    SnapshotPolicy,
    decode_state,
    encode_state,
    install_state,
    restore,
    save_state,
)

from .histories import StepClock, fresh_parts, full_fold, random_history, state_view, write_history

SMALL_CHUNKS = SnapshotPolicy(chunk_bytes=128)
OLD, NEW = 200, 400


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    """A log of 600 events or so with good snapshots at seq 200 and 400."""
    path = tmp_path / "volfsm.db"
    with EventLog(path, node="n1", clock=StepClock()) as log:
        write_history(log, random_history(seed=21, steps=450))
        assert log.last_seq() > NEW + 50
        for at in (OLD, NEW):
            header = save_state(
                log, at, encode_state(*full_fold(log, until=at), seq=at), SMALL_CHUNKS
            )
            assert header.chunks > 2
    return path


def _sql(path: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    conn = sqlite3.connect(path)
    try:
        with conn:
            for sql, args in statements:
                conn.execute(sql, args)
    finally:
        conn.close()


def _newest_id(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT id FROM snapshots WHERE seq = ?", (NEW,)).fetchone()[0])
    finally:
        conn.close()


def _set_body(path: Path, body: bytes) -> None:
    """Replace the newest snapshot's body by `body`, with a matching size and checksum."""
    sid = _newest_id(path)
    _sql(
        path,
        ("DELETE FROM snapshot_chunks WHERE snapshot_id = ?", (sid,)),
        ("INSERT INTO snapshot_chunks VALUES (?, 0, ?)", (sid, body)),
        (
            "UPDATE snapshots SET chunks = 1, size = ?, sha256 = ? WHERE id = ?",
            (len(body), hashlib.sha256(body).digest(), sid),
        ),
    )


def flip_bytes(path: Path) -> None:
    sid = _newest_id(path)
    conn = sqlite3.connect(path)
    data = bytearray(
        conn.execute(
            "SELECT data FROM snapshot_chunks WHERE snapshot_id = ? AND n = 1", (sid,)
        ).fetchone()[0]
    )
    conn.close()
    for i in (3, 60, 120):
        data[i] ^= 0xFF
    _sql(
        path,
        (
            "UPDATE snapshot_chunks SET data = ? WHERE snapshot_id = ? AND n = 1",
            (bytes(data), sid),
        ),
    )


def truncate_body(path: Path) -> None:
    sid = _newest_id(path)
    _sql(
        path,
        (
            "UPDATE snapshot_chunks SET data = substr(data, 1, length(data) - 10) "
            "WHERE snapshot_id = ? AND n = (SELECT max(n) FROM snapshot_chunks "
            "WHERE snapshot_id = ?)",
            (sid, sid),
        ),
    )


def drop_last_chunk(path: Path) -> None:
    sid = _newest_id(path)
    _sql(
        path,
        (
            "DELETE FROM snapshot_chunks WHERE snapshot_id = ? AND n = (SELECT max(n) "
            "FROM snapshot_chunks WHERE snapshot_id = ?)",
            (sid, sid),
        ),
    )


def wrong_seq(path: Path) -> None:
    _sql(path, ("UPDATE snapshots SET seq = ? WHERE seq = ?", (NEW - 1, NEW)))


def seq_past_the_end(path: Path) -> None:
    _sql(path, ("UPDATE snapshots SET seq = 1000000 WHERE seq = ?", (NEW,)))


def hash_mismatch(path: Path) -> None:
    _sql(path, ("UPDATE snapshots SET event_hash = zeroblob(32) WHERE seq = ?", (NEW,)))


def newer_format(path: Path) -> None:
    _sql(path, ("UPDATE snapshots SET format_version = ? WHERE seq = ?", (FORMAT_VERSION + 1, NEW)))


def other_fold_code(path: Path) -> None:
    _sql(path, ("UPDATE snapshots SET fingerprint = 'deadbeefdeadbeef' WHERE seq = ?", (NEW,)))


def garbage_with_good_checksum(path: Path) -> None:
    _set_body(path, zlib.compress(b"\xc1not msgpack at all"))


def not_zlib(path: Path) -> None:
    _set_body(path, b"plain bytes, not zlib")


def state_of_another_seq(path: Path) -> None:
    with EventLog(path, readonly=True) as log:
        other = encode_state(*full_fold(log, until=NEW - 10), seq=NEW - 10)
    _set_body(path, zlib.compress(other))


def podvol_part_cut_short(path: Path) -> None:
    """A good first part, the pod-volume part's last chunk cut: found once the rest is in."""
    with EventLog(path, readonly=True) as log:
        body = encode_state(*full_fold(log, until=NEW), seq=NEW)
    _set_body(path, zlib.compress(body[:-3]))


def wrong_shape(path: Path) -> None:
    _set_body(path, zlib.compress(msgspec.msgpack.encode({"seq": NEW, "asw": [1, 2]})))


CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("flipped-bytes", flip_bytes, "body checksum (sha256) mismatch"),
    ("truncated-body", truncate_body, "bytes recorded"),
    ("missing-chunk", drop_last_chunk, "chunks are stored"),
    ("wrong-seq", wrong_seq, "is not the one the snapshot was taken after"),
    ("seq-past-end", seq_past_the_end, "but the log ends at seq"),
    ("hash-mismatch", hash_mismatch, "is not the one the snapshot was taken after"),
    (
        "newer-format",
        newer_format,
        f"format version {FORMAT_VERSION + 1}, this build reads {FORMAT_VERSION}",
    ),
    ("other-fold-code", other_fold_code, "written by a build with other fold code"),
    ("garbage-body", garbage_with_good_checksum, "body does not decode"),
    ("not-zlib", not_zlib, "body does not decode"),
    ("wrong-shape", wrong_shape, "body does not decode"),
    ("podvol-part-cut-short", podvol_part_cut_short, "body does not decode"),
    ("body-of-other-seq", state_of_another_seq, f"body is the state at seq {NEW - 10}"),
]


@pytest.mark.parametrize(("damage", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_snapshot_is_ignored_and_the_older_one_used(
    log_path: Path,
    damage: Callable[[Path], None],
    words: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    damage(log_path)
    caplog.set_level(logging.WARNING, logger="volfsm.engine.snapshot")
    with EventLog(log_path, node="n1") as log:
        parts = fresh_parts()
        report = restore(log, *parts)
        assert report.snapshot is not None and report.snapshot.seq == OLD
        assert len(report.refused) == 1 and words in report.refused[0]
        assert report.events_replayed == log.last_seq() - OLD
        assert state_view(parts) == state_view(full_fold(log))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("snapshot ignored, not trusted" in w and words in w for w in warnings), warnings
    assert "1 newer snapshot(s) refused" in report.summary()


def test_when_every_snapshot_is_bad_the_log_is_replayed(log_path: Path) -> None:
    _sql(log_path, ("UPDATE snapshot_chunks SET data = zeroblob(length(data))", ()))
    with EventLog(log_path, node="n1") as log:
        parts = fresh_parts()
        report = restore(log, *parts)
        assert report.snapshot is None
        assert report.no_snapshot_reason == "all 2 stored snapshot(s) refused"
        assert len(report.refused) == 2
        assert report.events_replayed == log.last_seq()
        assert state_view(parts) == state_view(full_fold(log))
    assert "snapshot: none: all 2 stored snapshot(s) refused" in report.summary()


def test_a_log_cut_below_the_snapshot_refuses_it(log_path: Path) -> None:
    """A log restored from an older backup: the newest snapshot covers events it lacks."""
    _sql(log_path, ("DELETE FROM events WHERE seq > ?", (NEW - 50,)))
    with EventLog(log_path, node="n1") as log:
        parts = fresh_parts()
        report = restore(log, *parts)
        assert report.snapshot is not None and report.snapshot.seq == OLD
        assert f"covers seq {NEW} but the log ends at seq {NEW - 50}" in report.refused[0]
        assert state_view(parts) == state_view(full_fold(log))


def test_a_snapshot_of_another_log_is_refused(log_path: Path, tmp_path: Path) -> None:
    """Snapshot rows copied into a log with other events (another node's, say)."""
    other = tmp_path / "other.db"
    with EventLog(other, node="n2", clock=StepClock()) as log:
        write_history(log, random_history(seed=99, steps=450))
    conn = sqlite3.connect(other)
    with conn:
        conn.execute("ATTACH DATABASE ? AS src", (str(log_path),))
        conn.execute("INSERT INTO snapshots SELECT * FROM src.snapshots")
        conn.execute("INSERT INTO snapshot_chunks SELECT * FROM src.snapshot_chunks")
    conn.execute("DETACH DATABASE src")
    conn.close()
    with EventLog(other, node="n2") as log:
        parts = fresh_parts()
        report = restore(log, *parts)
        assert report.snapshot is None
        assert all("is not the one the snapshot was taken after" in r for r in report.refused)
        assert state_view(parts) == state_view(full_fold(log))


def test_keep_prunes_old_snapshots_and_orphan_chunks(log_path: Path) -> None:
    with EventLog(log_path, node="n1") as log:
        sid = _newest_id(log_path)
        _sql(log_path, ("INSERT INTO snapshot_chunks VALUES (?, 0, x'00')", (sid + 50,)))
        for at in (450, 500, 550):
            save_state(
                log, at, encode_state(*full_fold(log, until=at), seq=at), SnapshotPolicy(keep=2)
            )
        assert [h.seq for h in log.snapshots.headers(KIND)] == [550, 500]
    conn = sqlite3.connect(log_path)
    owners = {r[0] for r in conn.execute("SELECT DISTINCT snapshot_id FROM snapshot_chunks")}
    ids = {r[0] for r in conn.execute("SELECT id FROM snapshots")}
    conn.close()
    assert owners == ids


def test_decoded_state_is_what_was_encoded(log_path: Path) -> None:
    with EventLog(log_path, readonly=True) as log:
        header = log.snapshots.headers(KIND)[0]
        state = decode_state(log.snapshots.load(header))
        assert state.seq == header.seq == NEW
        parts = fresh_parts()
        install_state(state, *parts)
        assert state_view(parts) == state_view(full_fold(log, until=NEW))

"""EventLog append semantics, reads, cursors and reopening, on real log files."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from events import log as log_module
from events.codec import encode_body
from events.errors import ConflictError, LogClosedError, LogMissingError
from events.log import ANY_VERSION, EventLog
from events.types import DeviceAttached, DeviceMounted, Envelope, OperationStarted
from tests.events.helpers import (
    T0,
    FakeClock,
    assert_valid_log,
    attached,
    failed,
    ops,
    started,
)

DEV = "device/vol-1"
POD = "podvol/uid-1/data"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def log(tmp_path: Path, clock: FakeClock) -> Iterator[EventLog]:
    opened = EventLog(tmp_path / "events.db", node="node-a", clock=clock)
    yield opened
    opened.close()


def test_multi_event_append_is_one_atomic_run_of_seq_and_versions(
    log: EventLog, clock: FakeClock
) -> None:
    envs = log.append(DEV, 0, [started("op-1"), attached("vol-1"), failed("op-2")])
    assert [(e.seq, e.version) for e in envs] == [(1, 1), (2, 2), (3, 3)]
    assert [e.type for e in envs] == ["OperationStarted", "DeviceAttached", "OperationFailed"]
    assert [e.schema for e in envs] == [1, 1, 2]
    assert {(e.stream, e.ts, e.node) for e in envs} == {(DEV, T0, "node-a")}
    assert envs[1].body == attached("vol-1")
    assert list(log.read_after(0)) == envs
    assert log.last_seq() == 3
    assert log.stream_version(DEV) == 3


def test_stale_expected_version_raises_conflict_and_writes_nothing(log: EventLog) -> None:
    log.append(DEV, 0, [attached("vol-1")])
    with pytest.raises(ConflictError) as err:
        log.append(DEV, 0, [started("op-1"), started("op-2")])
    assert (err.value.stream, err.value.expected, err.value.actual) == (DEV, 0, 1)
    assert "expected version 0 but the log is at 1" in str(err.value)
    with pytest.raises(ConflictError):
        log.append(DEV, 5, [started("op-3")])
    assert log.last_seq() == 1
    assert log.stream_version(DEV) == 1
    assert [e.type for e in log.read_stream(DEV)] == ["DeviceAttached"]
    # The next correct append takes the very next seq: nothing was reserved.
    assert log.append(DEV, 1, [started("op-4")])[0].seq == 2


def test_any_version_appends_without_a_check(log: EventLog) -> None:
    log.append(DEV, ANY_VERSION, ops("a", 2))
    envs = log.append(DEV, ANY_VERSION, ops("b", 1))
    assert (envs[0].seq, envs[0].version) == (3, 3)
    with pytest.raises(ValueError, match="not a version"):
        log.append(DEV, -2, ops("c", 1))


def test_append_refuses_nonsense(log: EventLog) -> None:
    with pytest.raises(ValueError, match="at least one event"):
        log.append(DEV, 0, [])
    with pytest.raises(ValueError, match="stream"):
        log.append("", 0, ops("a", 1))
    with pytest.raises(TypeError, match="not an event type"):
        log.append(DEV, 0, [{"op_id": "x"}])  # type: ignore[list-item]
    assert log.last_seq() == 0


async def test_conflicting_appends_in_one_group_commit(log: EventLog) -> None:
    """Requests that land in the same batch are checked against each other, in order."""
    results = await asyncio.gather(
        log.append_async(DEV, 0, [attached("vol-1")]),
        log.append_async(DEV, 0, [attached("vol-1", "/dev/vdc")]),
        log.append_async(POD, 0, ops("p", 2)),
        log.append_async(DEV, 1, [started("op-after")]),
        return_exceptions=True,
    )
    conflicts = [r for r in results if isinstance(r, ConflictError)]
    assert len(conflicts) == 1
    assert conflicts[0].actual >= 1
    assert log.stream_version(DEV) == 2
    assert log.stream_version(POD) == 2
    assert log.last_seq() == 4
    assert_valid_log(log.path)


def test_reads_after_until_and_by_stream(log: EventLog) -> None:
    log.append(DEV, 0, [attached("vol-1")])
    log.append(POD, 0, ops("p", 2))
    log.append(DEV, 1, [DeviceMounted(volume_id="vol-1", device_mount_path="/stage")])
    log.append("device/vol-2", 0, [attached("vol-2")])
    assert [e.seq for e in log.read_after(0)] == [1, 2, 3, 4, 5]
    assert [e.seq for e in log.read_after(2)] == [3, 4, 5]
    assert [e.seq for e in log.read_after(1, until_seq=3)] == [2, 3]
    assert [e.seq for e in log.read_after(5)] == []
    assert [e.seq for e in log.read_after(3, until_seq=3)] == []
    rows = list(log.rows_after(1, until_seq=4))
    assert [r[0] for r in rows] == [2, 3, 4]
    assert rows[0][1:5] == (POD, 1, "OperationStarted", 1)
    assert log_module.row_to_envelope(rows[2]).body == DeviceMounted(
        volume_id="vol-1", device_mount_path="/stage"
    )
    assert [(e.seq, e.version) for e in log.read_stream(DEV)] == [(1, 1), (4, 2)]
    assert [e.version for e in log.read_stream(DEV, after_version=1)] == [2]
    assert log.read_stream("device/none") == []
    assert log.streams() == ["device/vol-1", "device/vol-2", POD]
    assert log.stream_version("device/vol-2") == 1


def test_replay_applies_every_event_in_order(log: EventLog) -> None:
    for i in range(5):
        log.append(f"device/vol-{i}", 0, [attached(f"vol-{i}"), started(f"op-{i}")])
    seen: list[Envelope] = []
    assert log.replay(seen.append) == 10  # the last seq applied
    assert seen == list(log.read_after(0))
    seen.clear()
    assert log.replay(seen.append, after=3, until_seq=7) == 7
    assert [e.seq for e in seen] == [4, 5, 6, 7]
    assert log.replay(seen.append, after=10) == 10  # nothing new: where it started


def test_chunked_reads_cross_chunk_boundaries(
    log: EventLog, monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    monkeypatch.setattr(log_module, "_READ_CHUNK", 3)
    for i in range(4):
        clock.advance(10)
        log.append(f"device/vol-{i}", 0, [attached(f"vol-{i}"), started(f"op-{i}")])
    assert [e.seq for e in log.read_after(0)] == list(range(1, 9))
    assert [r[0] for r in log.rows_after(2, until_seq=7)] == [3, 4, 5, 6, 7]
    assert [e.seq for e in log.read_after(0, until_seq=6)] == list(range(1, 7))
    seen: list[int] = []
    assert log.replay(lambda e: seen.append(e.seq), after=1) == 8
    assert seen == list(range(2, 9))
    assert [e.seq for e in log.read_time_range(T0 + 20, T0 + 40)] == [3, 4, 5, 6]
    assert [e.seq for e in log.read_time_range(0, T0 + 1000)] == list(range(1, 9))


def test_time_range_and_seq_at_time_with_a_fake_clock(log: EventLog, clock: FakeClock) -> None:
    first = log.append(DEV, 0, [attached("vol-1")])
    clock.advance(1_000)
    second = log.append(POD, 0, ops("p", 2))
    clock.advance(1_000)
    third = log.append(DEV, 1, [started("op-x")])
    assert [e.ts for e in first + second + third] == [T0, T0 + 1000, T0 + 1000, T0 + 2000]
    assert [e.seq for e in log.read_time_range(T0, T0 + 1000)] == [1]
    assert [e.seq for e in log.read_time_range(T0 + 1000, T0 + 2001)] == [2, 3, 4]
    assert [e.seq for e in log.read_time_range(T0 + 1, T0 + 1000)] == []
    assert log.seq_at_time(T0 - 1) == 0
    assert log.seq_at_time(T0) == 1
    assert log.seq_at_time(T0 + 1999) == 3
    assert log.seq_at_time(T0 + 10**9) == 4


def test_timestamps_never_go_backwards(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "events.db"
    with EventLog(path, clock=clock) as log:
        clock.advance(5_000)
        log.append(DEV, 0, [attached("vol-1")])
        clock.now = T0  # the wall clock stepped back
        assert log.append(DEV, 1, ops("a", 1))[0].ts == T0 + 5_000
    with EventLog(path, clock=FakeClock(T0 - 10**6)) as log:  # and across a restart
        assert log.append(DEV, 2, ops("b", 1))[0].ts == T0 + 5_000


def test_cursors_persist_across_reopen(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "events.db"
    with EventLog(path, clock=clock) as log:
        log.append(DEV, 0, ops("a", 3))
        assert log.get_cursor("publisher") == 0
        log.set_cursor("publisher", 2)
        log.set_cursor("asw", 3)
        log.set_cursor("publisher", 3)
        assert log.cursors() == {"publisher": 3, "asw": 3}
    with EventLog(path, clock=clock) as log:
        assert log.get_cursor("publisher") == 3
        assert log.cursors() == {"publisher": 3, "asw": 3}
    with EventLog(path, readonly=True) as ro:
        assert ro.get_cursor("asw") == 3
        with pytest.raises(LogClosedError, match="read-only"):
            ro.set_cursor("asw", 1)


def test_reopen_continues_seq_and_versions(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "events.db"
    with EventLog(path, node="node-a", clock=clock) as log:
        log.append(DEV, 0, ops("a", 2))
        log.append(POD, 0, ops("b", 1))
    with EventLog(path, clock=clock) as log:
        assert log.node == "node-a"  # taken from the log's metadata
        with pytest.raises(ConflictError):
            log.append(DEV, 0, ops("c", 1))
        envs = log.append(DEV, 2, ops("c", 1))
        assert (envs[0].seq, envs[0].version, envs[0].node) == (4, 3, "node-a")
    with EventLog(path, readonly=True) as ro:
        assert ro.node == "node-a"
        assert ro.last_seq() == 4
        assert [e.version for e in ro.read_stream(DEV)] == [1, 2, 3]
    assert_valid_log(path)


def test_readonly_and_closed_logs_refuse_appends(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    log = EventLog(path)
    log.append(DEV, 0, ops("a", 1))
    with EventLog(path, readonly=True) as ro:
        assert [e.seq for e in ro.read_after(0)] == [1]
        with pytest.raises(LogClosedError, match="read-only"):
            ro.append(DEV, 1, ops("b", 1))
    log.close()
    log.close()  # idempotent
    with pytest.raises(LogClosedError, match="closed"):
        log.append(DEV, 1, ops("b", 1))
    with pytest.raises(LogClosedError, match="closed"):
        log.set_cursor("x", 1)


async def test_async_appends_and_close_drains_the_queue(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.db")
    tasks = [
        asyncio.ensure_future(log.append_async(f"device/v{i}", 0, ops(str(i), 2)))
        for i in range(50)
    ]
    await asyncio.sleep(0)
    results = await asyncio.gather(*tasks)
    log.close()
    assert sorted(e.seq for envs in results for e in envs) == list(range(1, 101))
    with EventLog(tmp_path / "events.db", readonly=True) as ro:
        assert ro.last_seq() == 100


def test_missing_log_without_create(tmp_path: Path) -> None:
    with pytest.raises(LogMissingError, match="no volfsm event log"):
        EventLog(tmp_path / "nope.db", create=False)
    with pytest.raises(LogMissingError, match="no volfsm event log"):
        EventLog(tmp_path / "nope.db", readonly=True)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_commit_is_not_acknowledged_and_the_log_recovers(tmp_path: Path) -> None:
    """An insert the database refuses fails the whole batch; later appends still work."""
    path = tmp_path / "events.db"
    with EventLog(path) as log:
        log.append(DEV, 0, ops("a", 1))
        # Someone else (not volfsm) wrote the next row behind the writer's back.
        other = sqlite3.connect(path, isolation_level=None)
        other.execute(
            "INSERT INTO events (seq, stream, version, type, schema, ts, node, body) "
            "VALUES (2, ?, 2, 'OperationStarted', 1, 0, '', ?)",
            (DEV, encode_body(started("intruder"))),
        )
        other.close()
        with pytest.raises(sqlite3.IntegrityError):
            log.append("device/vol-2", 0, [attached("vol-2")])
        # The writer re-reads the database after a failed batch.
        with pytest.raises(ConflictError):
            log.append(DEV, 1, ops("b", 1))
        envs = log.append("device/vol-2", 0, [attached("vol-2")])
        assert envs[0].seq == 3
    assert_valid_log(path)


def test_bodies_round_trip_through_the_log(log: EventLog) -> None:
    bodies = [
        attached("vol-1"),
        DeviceMounted(volume_id="vol-1", device_mount_path="/stage", mount_found=True),
        OperationStarted(op_id="x", operation="attach", volume_id="vol-1", reason="über"),
        failed("x"),
    ]
    envs = log.append(DEV, 0, bodies)
    assert [e.body for e in log.read_stream(DEV)] == bodies
    assert list(log.read_after(0)) == envs
    assert isinstance(envs[0].body, DeviceAttached)

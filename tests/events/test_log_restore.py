"""EventLog.restore: a lost tail put back with its own seq, versions and times, or refused."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from events.errors import RestoreError
from events.log import EventLog
from events.types import Envelope
from tests.events.helpers import FakeClock, assert_valid_log, attached, failed, started

DEV = "device/vol-1"
OTHER = "device/vol-2"


def recorded(path: Path) -> list[Envelope]:
    """A node's history: 6 events on two streams, at distinct times."""
    clock = FakeClock()
    with EventLog(path, node="node-a", clock=clock) as log:
        log.append(DEV, 0, [attached("vol-1"), started("op-1")])
        clock.advance(1_000)
        log.append(OTHER, 0, [attached("vol-2")])
        clock.advance(1_000)
        log.append(DEV, 2, [failed("op-1"), started("op-2")])
        clock.advance(1_000)
        log.append(OTHER, 1, [started("op-3", "vol-2")])
        return list(log.read_after(0))


def test_a_lost_log_is_put_back_event_for_event_then_appends_continue(tmp_path: Path) -> None:
    history = recorded(tmp_path / "original.db")

    with EventLog(tmp_path / "new.db", node="node-a") as log:
        assert log.restore(history[:4]) == 4  # in two parts, as a fetch would
        assert log.restore(history[4:]) == 2
        assert list(log.read_after(0)) == history
        assert log.stream_version(DEV) == 4 and log.stream_version(OTHER) == 2
        [appended] = log.append(DEV, 4, [failed("op-2")])
    assert (appended.seq, appended.version) == (7, 5)
    assert appended.ts >= history[-1].ts
    assert_valid_log(tmp_path / "new.db")


def test_an_older_backup_gets_its_missing_tail(tmp_path: Path) -> None:
    history = recorded(tmp_path / "original.db")
    with EventLog(tmp_path / "backup.db", node="node-a") as log:
        log.restore(history[:3])
        assert log.restore(history[3:]) == 3
        assert list(log.read_after(0)) == history


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"seq": 3},
            "event seq 3 (DeviceAttached on device/vol-1) does not continue the log:"
            " the next seq is 1",
        ),
        ({"node": "node-b"}, "is of node 'node-b', not of 'node-a'"),
        ({"version": 2}, "has version 2; the stream is at version 0"),
    ],
)
def test_events_that_do_not_continue_the_log_are_refused_and_nothing_is_written(
    tmp_path: Path, change: dict[str, object], says: str
) -> None:
    history = recorded(tmp_path / "original.db")
    first = msgspec.structs.replace(history[0], **change)
    with EventLog(tmp_path / "new.db", node="node-a") as log:
        with pytest.raises(RestoreError, match=re.escape(says)):
            log.restore([first, *history[1:]])
        assert log.last_seq() == 0


def test_time_going_backwards_is_refused(tmp_path: Path) -> None:
    history = recorded(tmp_path / "original.db")
    late = msgspec.structs.replace(history[4], ts=history[0].ts - 1)
    with EventLog(tmp_path / "new.db", node="node-a") as log:
        with pytest.raises(RestoreError, match="is older"):
            log.restore([*history[:4], late])
        assert log.last_seq() == 0  # the first four were not written either
        assert log.restore(history) == 6


def test_a_readonly_log_refuses(tmp_path: Path) -> None:
    history = recorded(tmp_path / "original.db")
    ro = EventLog(tmp_path / "original.db", readonly=True)
    try:
        with pytest.raises(Exception, match="read-only"):
            ro.restore(history)
    finally:
        ro.close()

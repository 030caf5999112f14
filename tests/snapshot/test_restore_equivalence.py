"""A good snapshot plus the events after it folds to exactly the full replay.

Property: for any history and any cut, encoding the engine state (ASW,
DSW, index) folded up to the cut, storing it, and restoring it with
`restore()` (which then folds the tail) gives the state a full fold gives;
so does folding more events into a restored state (it keeps folding like
the original).
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from events.log import EventLog
from events.types import OperationStarted
from projections.asw import Asw, fold
from projections.snapshot import decode_asw, encode_asw
from volfsm.engine.snapshot import encode_state, restore, save_state

from .histories import (
    Step,
    StepClock,
    fold_settings,
    fresh_parts,
    full_fold,
    histories,
    random_history,
    state_view,
    temp_log,
    write_history,
)

SETTINGS = fold_settings(60)


@SETTINGS
@given(history=histories(), cut=st.floats(min_value=0.0, max_value=1.0))
def test_snapshot_plus_tail_equals_full_fold(history: list[Step], cut: float) -> None:
    with temp_log() as log:
        last = write_history(log, history)
        at = max(1, round(cut * last))
        before = full_fold(log, until=at)
        save_state(log, at, encode_state(*before, seq=at))

        restored = fresh_parts()
        report = restore(log, *restored)

        assert report.snapshot is not None and report.snapshot.seq == at
        assert report.refused == ()
        assert report.events_replayed == last - at
        assert state_view(restored) == state_view(full_fold(log))


@SETTINGS
@given(history=histories(max_steps=40), more=histories(max_steps=40))
def test_a_restored_state_keeps_folding_like_the_original(
    history: list[Step], more: list[Step]
) -> None:
    """Snapshot at the end of `history`; then `more` events are folded into both."""
    with temp_log() as log:
        at = write_history(log, history)
        save_state(log, at, encode_state(*full_fold(log), seq=at))
        write_history(log, more)
        restored = fresh_parts()
        report = restore(log, *restored)
        assert report.snapshot is not None and report.snapshot.seq == at
        assert state_view(restored) == state_view(full_fold(log))


@SETTINGS
@given(history=histories())
def test_the_fast_fold_folds_like_the_live_engine(history: list[Step]) -> None:
    """`fold_log` (rows, views of operation records, hooks) versus envelopes fed one by one
    as the live engine feeds its appended envelopes (`VolumeEngine._on_envelopes`)."""
    with temp_log() as log:
        write_history(log, history)
        live = fresh_parts()
        asw, dsw, index = live
        for env in log.read_after(0):
            asw.apply(env)
            kind = type(env.body).KIND
            if kind == "desired":
                index.apply(env)
                dsw.observe(env)
            elif kind == "podvol" or env.type == "DeviceDetached":
                index.apply(env)
        assert state_view(full_fold(log)) == state_view(live)
        assert full_fold(log)[0] == fold(log.read_after(0))


def test_a_hook_on_an_operation_event_gets_the_full_body(tmp_path: Path) -> None:
    """fold_rows decodes operation records as views unless a hook wants them: then in full."""
    with EventLog(tmp_path / "volfsm.db", node="n1", clock=StepClock()) as log:
        write_history(log, random_history(seed=7, steps=300))
        want = [e.body for e in log.read_after(0) if e.type == "OperationStarted"]
        seen: list[object] = []
        hooked = Asw()
        with log.scan_fold() as rows:
            hooked.fold_rows(rows, {OperationStarted: lambda body, _v: seen.append(body)})
        plain = Asw()
        with log.scan_fold() as rows:
            plain.fold_rows(rows)
        assert want and seen == want
        assert hooked == plain == fold(log.read_after(0))


def test_asw_codec_round_trips_a_long_history(tmp_path: Path) -> None:
    with EventLog(tmp_path / "volfsm.db", node="n1", clock=StepClock()) as log:
        write_history(log, random_history(seed=11, steps=2000))
        asw, dsw, index = full_fold(log)
    again = decode_asw(encode_asw(asw))
    assert again == asw
    assert state_view((again, dsw, index)) == state_view((asw, dsw, index))


def test_without_snapshots_start_is_a_full_replay(tmp_path: Path) -> None:
    with EventLog(tmp_path / "volfsm.db", node="n1", clock=StepClock()) as log:
        last = write_history(log, random_history(seed=3, steps=300))
        parts = fresh_parts()
        report = restore(log, *parts)
    assert report.snapshot is None
    assert report.no_snapshot_reason == "no snapshot stored"
    assert report.events_replayed == last
    assert "snapshot: none: no snapshot stored" in report.summary()


def test_the_newest_snapshot_is_used(tmp_path: Path) -> None:
    with EventLog(tmp_path / "volfsm.db", node="n1", clock=StepClock()) as log:
        write_history(log, random_history(seed=5, steps=400))
        for at in (100, 300, 200):  # written out of order: the highest seq wins
            save_state(log, at, encode_state(*full_fold(log, until=at), seq=at))
        last = log.last_seq()
        parts = fresh_parts()
        report = restore(log, *parts)
        assert report.snapshot is not None and report.snapshot.seq == 300
        assert report.events_replayed == last - 300
        assert state_view(parts) == state_view(full_fold(log))
        assert "state from snapshot #2 at seq 300" in report.summary()

"""The check every engine suite runs at the end: the log is legal and folds to the live state."""

from __future__ import annotations

from projections.asw import fold
from projections.validate import validate
from volfsm.engine import VolumeEngine


def assert_log_matches(engine: VolumeEngine) -> None:
    """The log is a legal story and folds to the engine's live ASW, field by field."""
    report = validate(engine.log.read_after(0))
    assert report.ok, str(report.violation)
    folded = fold(engine.log.read_after(0))
    live = engine.asw
    assert folded.devices == live.devices
    assert folded.podvols == live.podvols
    assert folded.desired_pods == live.desired_pods
    assert folded.desired_sizes == live.desired_sizes
    assert folded.last_seq == live.last_seq
    assert engine.reconciler.columns.stale() == []  # the screen's facts kept in step

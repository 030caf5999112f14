"""A full replay split over two processes folds exactly like one process.

`volfsm.engine.splitfold` folds the pod-volume entries in a child process
(`python -m projections.podvolfold`) and everything else here; the merged
state must be the one-process fold's, entry order, shared error records,
last seq and count included. When the child fails the pod-volume part is
folded here, with the same result.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import given

from events.log import EventLog
from projections.asw import PodVolumeState
from projections.podvolfold import fold_podvols
from projections.snapshot import encode_podvol_part, read_podvol_part
from volfsm.engine import splitfold
from volfsm.engine.snapshot import fold_hooks, fold_log
from volfsm.engine.splitfold import fold_split

from .histories import (
    Step,
    StepClock,
    fold_settings,
    fresh_parts,
    histories,
    random_history,
    state_view,
    temp_log,
    write_history,
)

SETTINGS = fold_settings(15)


@SETTINGS
@given(history=histories())
def test_split_fold_equals_one_process_fold(history: list[Step]) -> None:
    with temp_log() as log:
        write_history(log, history)
        one = fresh_parts()
        want = fold_log(log, *one, split_over=None)
        two = fresh_parts()
        got = fold_log(log, *two, split_over=0)
        assert got == want
        assert state_view(two) == state_view(one)


def test_split_fold_of_a_long_history_with_a_bound(tmp_path: Path) -> None:
    """A fold up to `until` in the middle of a log: both halves stop at the same seq."""
    from .histories import write_history

    with EventLog(tmp_path / "volfsm.db", node="n1", clock=StepClock()) as log:
        last = write_history(log, random_history(seed=21, steps=1500))
        until = last * 2 // 3
        one, two = fresh_parts(), fresh_parts()
        want = fold_log(log, *one, until=until, split_over=None)
        got = fold_log(log, *two, until=until, split_over=0)
    assert got == want == (until, until)
    assert two[0].podvols, "the history has pod-volume entries to merge"
    assert state_view(two) == state_view(one)


def test_a_pod_volume_part_decodes_chunk_by_chunk_to_the_same_entries() -> None:
    with temp_log() as log:
        last = write_history(log, random_history(seed=5, steps=600))
        asw = fold_podvols(log, 0, last)
    assert len(asw.podvols) > 4, "the history has entries for several chunks"
    head, chunks = read_podvol_part(encode_podvol_part(asw, chunk=2))
    got: list[tuple[tuple[str, str], PodVolumeState]] = []
    for chunk in chunks:
        assert len(chunk.entries) <= 2
        got.extend(zip(chunk.keys, chunk.entries, strict=True))
    assert (head.last_seq, head.last_ts) == (asw.last_seq, asw.last_ts)
    assert got == list(asw.podvols.items())
    assert _one_object_errors(got) == _one_object_errors(asw.podvols.items())
    assert _one_object_errors(got), "the history has an entry whose error is its operation"


def _one_object_errors(
    entries: Iterable[tuple[tuple[str, str], PodVolumeState]],
) -> list[tuple[str, str]]:
    return [
        key
        for key, pv in entries
        if pv.last_error is not None and pv.last_error is pv.last_operation
    ]


def test_the_split_folds_entries_share_the_desired_state_keys() -> None:
    """Each desired pod-volume's ASW key is the DSW's key object, and every entry's strings
    are its key's: the child's decoded copies are freed as they are read."""
    with temp_log() as log:
        write_history(log, random_history(seed=1, steps=200))
        asw, dsw, index = fresh_parts()
        fold_log(log, asw, dsw, index, split_over=0)
    dsw_keys = {key: key for key in dsw.desired_entries()}
    desired = [key for key in asw.podvols if key in dsw_keys]
    assert desired and len(desired) < len(asw.podvols), "entries desired and not"
    for key in desired:
        assert key is dsw_keys[key]
    for key, pv in asw.podvols.items():
        assert pv.pod_uid is key[0] and pv.volume_name is key[1]


def test_a_part_cut_short_is_folded_here_from_scratch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Entries of the chunks read before the bad one (here a made-up first entry) are not
    kept: the fold here gives every entry, in order."""
    with temp_log() as log:
        last = write_history(log, random_history(seed=4, steps=400))
        script = (
            "import sys; from pathlib import Path; from events.log import EventLog; "
            "from projections.podvolfold import fold_podvols; "
            "from projections.snapshot import encode_podvol_part; "
            "from projections.asw import PodVolumeState; "
            f"log = EventLog(Path({str(log.path)!r}), readonly=True); "
            f"asw = fold_podvols(log, 0, {last}); "
            "asw.podvols = {('made', 'up'): PodVolumeState('made', 'up'), **asw.podvols}; "
            "out = encode_podvol_part(asw, chunk=2); "
            "sys.stdout.buffer.write(out[: len(out) * 2 // 3])"
        )
        one, two = fresh_parts(), fresh_parts()
        want = fold_log(log, *one, split_over=None)
        asw, dsw, index = two
        with caplog.at_level(logging.WARNING, logger="volfsm.engine.splitfold"):
            got = fold_split(
                log, asw, fold_hooks(dsw, index), 0, last,
                child=[sys.executable, "-c", script], shared_with=dsw.desired_entries(),
            )  # fmt: skip
        assert got == want
        assert state_view(two) == state_view(one)
        assert "runs past its end" in caplog.text and "folding it here" in caplog.text


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (
            [sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"],
            "exited with 3 (boom)",
        ),
        (
            [sys.executable, "-c", "import sys; sys.stdout.write('not msgpack')"],
            "11 unreadable bytes",
        ),
        (["/nonexistent/python"], "cannot start the pod-volume fold"),
        ([sys.executable, "-c", "import time; time.sleep(600)"], "sent nothing 1 s after"),
    ],
)
def test_a_failing_child_is_replaced_by_folding_here(
    command: list[str],
    says: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(splitfold, "CHILD_WAIT_MIN_S", 1.0)  # the hung child is given 1 s
    with temp_log() as log:
        last = write_history(log, random_history(seed=4, steps=400))
        one, two = fresh_parts(), fresh_parts()
        want = fold_log(log, *one, split_over=None)
        asw, dsw, index = two
        with caplog.at_level(logging.WARNING, logger="volfsm.engine.splitfold"):
            got = fold_split(log, asw, fold_hooks(dsw, index), 0, last, child=command)
        assert got == want
        assert state_view(two) == state_view(one)
        assert says in caplog.text and "folding it here" in caplog.text


def test_a_split_fold_needs_an_empty_podvol_state() -> None:
    with temp_log() as log:
        last = write_history(log, random_history(seed=8, steps=200))
        asw, dsw, index = fresh_parts()
        fold_log(log, asw, dsw, index, split_over=None)
        assert asw.podvols
        with pytest.raises(ValueError, match="without pod-volume entries"):
            fold_split(log, asw, fold_hooks(dsw, index), 0, last)

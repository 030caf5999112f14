"""State as of a seq or a time, on hand-built envelopes and on a real log."""

from __future__ import annotations

from pathlib import Path

from events.log import EventLog
from events.streams import device_stream, pod_stream
from events.types import DeviceAttached, DeviceMounted, DeviceMountUncertain, PodAdded
from projections.asof import state_at_seq, state_at_time, until_seq, until_time
from projections.asw import fold
from tests.projections.builders import T0, History
from volfsm.engine.handler import CommandHandler

S = 1_000_000
DEV = device_stream("vol-1")


def _history() -> History:
    h = History()
    h.add(0, pod_stream("p"), PodAdded(pod_uid="p", namespace="ns", name="p"))
    h.add(1, DEV, DeviceAttached(volume_id="vol-1", plugin="csi"))
    h.add(2, DEV, DeviceMountUncertain(volume_id="vol-1", reason="timeout"))
    h.add(2, DEV, DeviceMounted(volume_id="vol-1"))  # same timestamp as the one before
    return h


def test_state_at_seq_applies_everything_up_to_and_including_it() -> None:
    h = _history()
    assert state_at_seq(h.envs, 0).devices == {}
    assert state_at_seq(h.envs, 2).devices["vol-1"].state == "Attached"
    at3 = state_at_seq(h.envs, 3)
    assert (at3.devices["vol-1"].state, at3.last_seq) == ("Uncertain", 3)
    assert state_at_seq(h.envs, 99).devices["vol-1"].state == "DeviceGloballyMounted"


def test_state_at_time_includes_every_event_stamped_at_that_time() -> None:
    h = _history()
    assert state_at_time(h.envs, T0 - 1).last_seq == 0
    assert state_at_time(h.envs, T0).desired_pods.keys() == {"p"}
    assert state_at_time(h.envs, T0 + 1 * S + 999_999).devices["vol-1"].state == "Attached"
    at2 = state_at_time(h.envs, T0 + 2 * S)
    assert (at2.devices["vol-1"].state, at2.last_seq) == ("DeviceGloballyMounted", 4)


def test_stop_conditions_stop_reading_early() -> None:
    h = _history()
    consumed: list[int] = []

    def source() -> object:
        for env in h.envs:
            consumed.append(env.seq)
            yield env

    assert [e.seq for e in until_seq(source(), 2)] == [1, 2]  # type: ignore[arg-type]
    assert consumed == [1, 2, 3]  # one look past the stop, never the rest
    consumed.clear()
    assert [e.seq for e in until_time(source(), T0 + 1 * S)] == [1, 2]  # type: ignore[arg-type]
    assert consumed == [1, 2, 3]


class _Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def test_as_of_time_on_a_real_log_agrees_with_seq_at_time(tmp_path: Path) -> None:
    clock = _Clock()
    log = EventLog(tmp_path / "volfsm.db", clock=clock)
    try:
        handler = CommandHandler(log)
        handler.fire(DEV, "attach", DeviceAttached(volume_id="vol-1", plugin="csi"))
        clock.now += 10 * S
        handler.fire(DEV, "mount_device", DeviceMounted(volume_id="vol-1"))
        for probe in (T0 - 1, T0, T0 + 5 * S, T0 + 10 * S, T0 + 60 * S):
            by_time = state_at_time(log.read_after(0), probe)
            by_index = fold(log.read_after(0, until_seq=log.seq_at_time(probe)))
            assert by_time == by_index
        assert state_at_time(log.read_after(0), T0 + 5 * S).devices["vol-1"].state == "Attached"
    finally:
        log.close()

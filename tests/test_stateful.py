"""Stateful property test: random legal and illegal commands across many streams.

A hypothesis state machine drives the real `CommandHandler` on a real
`EventLog` in a temp dir. A shadow model, written here by hand from the
state rules in DESIGN.md (not from `events.tables`), predicts every state
and stream version. After every step:

* folding the whole log (`projections.asw.fold`) equals the handler's live
  state and the shadow model;
* the log validates (`projections.validate`);
* an illegal command raised `IllegalTransitionError` and appended nothing.

Snapshots of the live state taken after every command check the prefix
property: folding the log cut at that `seq` (or at that command's time)
gives exactly the state the system had then.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from events.log import EventLog
from events.streams import device_stream, pod_stream, podvol_stream, stream_kind
from events.types import (
    Body,
    DeviceAttached,
    DeviceDetached,
    DeviceMounted,
    DeviceMountUncertain,
    DeviceUnmounted,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    PodRemoved,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeResized,
    VolumeUnmounted,
)
from projections.asof import state_at_time
from projections.asw import Asw, fold
from projections.validate import validate
from volfsm.engine.handler import CommandHandler
from volfsm.errors import IllegalTransitionError

# ----------------------------------------------------------------- shadow model

DEVICE_STATES = ("Detached", "Attached", "DeviceGloballyMounted", "Uncertain")
PODVOL_STATES = ("Unmounted", "Mounted", "Uncertain")
INITIAL = {"device": "Detached", "podvol": "Unmounted"}

Transitions = dict[tuple[str, str], str]
"""(state, trigger) -> next state; anything missing is illegal."""

SHADOW_DEVICE: Transitions = {
    ("Detached", "attach"): "Attached",
    ("Attached", "mount_device"): "DeviceGloballyMounted",
    ("Uncertain", "mount_device"): "DeviceGloballyMounted",
    ("DeviceGloballyMounted", "mount_device"): "DeviceGloballyMounted",
    ("DeviceGloballyMounted", "unmount_device"): "Attached",
    ("Uncertain", "unmount_device"): "Attached",
    ("Attached", "detach"): "Detached",
    **{(s, "mark_device_uncertain"): "Uncertain" for s in DEVICE_STATES},
    **{(s, "resize"): s for s in ("Attached", "DeviceGloballyMounted", "Uncertain")},
}
SHADOW_PODVOL: Transitions = {
    ("Unmounted", "mount"): "Mounted",
    ("Uncertain", "mount"): "Mounted",
    ("Mounted", "mount"): "Mounted",
    ("Mounted", "unmount"): "Unmounted",
    ("Uncertain", "unmount"): "Unmounted",
    **{(s, "mark_uncertain"): "Uncertain" for s in PODVOL_STATES},
}
DEVICE_TRIGGERS = tuple(sorted({t for _s, t in SHADOW_DEVICE}))

VOLUMES = ("vol-a", "vol-b", "vol-c")
PODS = ("pod-1", "pod-2", "pod-3")
PODVOLS = (*itertools.product(PODS[:2], ("data", "cache")), (PODS[2], "data"))


def device_body(trigger: str, volume_id: str, flag: bool) -> Body:
    """A body recording `trigger` on a device."""
    if trigger == "attach":
        return DeviceAttached(volume_id=volume_id, plugin="csi", attachable=flag)
    if trigger == "mount_device":
        return DeviceMounted(volume_id=volume_id, device_mount_path=f"/stage/{volume_id}")
    if trigger == "mark_device_uncertain":
        return DeviceMountUncertain(volume_id=volume_id, reason="timeout", reconstructed=flag)
    if trigger == "unmount_device":
        return DeviceUnmounted(volume_id=volume_id)
    if trigger == "detach":
        return DeviceDetached(volume_id=volume_id)
    return VolumeResized(volume_id=volume_id, size_bytes=1024 if flag else 2048)


def podvol_body(trigger: str, pod_uid: str, name: str, flag: bool) -> Body:
    """A body recording `trigger` on a pod-volume."""
    vid = f"vol-of-{name}"
    if trigger == "mount":
        return VolumeMounted(volume_id=vid, pod_uid=pod_uid, volume_name=name, mount_path="/m")
    if trigger == "mark_uncertain":
        return VolumeMountUncertain(
            volume_id=vid, pod_uid=pod_uid, volume_name=name, reason="t", reconstructed=flag
        )
    return VolumeUnmounted(volume_id=vid, pod_uid=pod_uid, volume_name=name)


View = dict[str, tuple[str, int]]
"""stream -> (state, version)."""


def asw_view(asw: Asw) -> View:
    """The (state, version) of every entry the ASW holds, keyed by stream."""
    view = {device_stream(v): (d.state, d.version) for v, d in asw.devices.items()}
    for (uid, name), pv in asw.podvols.items():
        view[podvol_stream(uid, name)] = (pv.state, pv.version)
    return view


def assert_asw_matches(asw: Asw, expected: View, pods: set[str]) -> None:
    """The ASW holds exactly `expected` (streams back in their initial state may be absent)."""
    got = asw_view(asw)
    for stream, entry in got.items():
        assert expected.get(stream) == entry, stream
    for stream, (state, _version) in expected.items():
        kind = stream_kind(stream)
        if kind in INITIAL and state != INITIAL[kind]:
            assert stream in got, stream
    assert set(asw.desired_pods) == pods


class StepClock:
    """Fake UTC µs clock: every commit is 1 ms after the previous one."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000_000

    def __call__(self) -> int:
        self.now += 1000
        return self.now


# ---------------------------------------------------------------- the machine


class LogMachine(RuleBasedStateMachine):
    """Commands through the handler versus a hand-written shadow model."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="volfsm-stateful-"))
        self.clock = StepClock()
        self.log = EventLog(self.dir / "volfsm.db", node="n1", clock=self.clock)
        self.handler = CommandHandler(self.log)
        self.states: dict[str, str] = {}
        self.versions: dict[str, int] = {}
        self.open_ops: dict[str, list[str]] = {}
        self.pods: set[str] = set()
        self.op_ids = itertools.count(1)
        # seq -> (ts of that seq, shadow view, desired pods) right after the command.
        self.snapshots: dict[int, tuple[int, View, set[str]]] = {}

    # ------------------------------------------------------------ helpers

    def _state(self, stream: str) -> str:
        return self.states.get(stream, INITIAL[stream_kind(stream)])

    def _view(self) -> View:
        return {s: (self._state(s), v) for s, v in self.versions.items() if stream_kind(s) != "pod"}

    def _appended(self, stream: str, count: int) -> None:
        self.versions[stream] = self.versions.get(stream, 0) + count
        seq = self.log.last_seq()
        ts = self.log.read_stream(stream)[-1].ts
        self.snapshots[seq] = (ts, self._view(), set(self.pods))

    def _fire(self, stream: str, trigger: str, body: Body, table: Transitions) -> None:
        before_seq = self.log.last_seq()
        nxt = table.get((self._state(stream), trigger))
        if nxt is None:
            with pytest.raises(IllegalTransitionError) as err:
                self.handler.fire(stream, trigger, body)
            assert (err.value.stream, err.value.state, err.value.trigger) == (
                stream,
                self._state(stream),
                trigger,
            )
            assert self.log.last_seq() == before_seq
            assert self.log.stream_version(stream) == self.versions.get(stream, 0)
            event(f"illegal {stream_kind(stream)} {trigger}")
            return
        envs = self.handler.fire(stream, trigger, body)
        assert [e.seq for e in envs] == [before_seq + 1]
        self.states[stream] = nxt
        self._appended(stream, 1)
        event(f"reached {stream_kind(stream)} {nxt}")

    # -------------------------------------------------------------- rules

    def _trigger(self, data: st.DataObject, stream: str, table: Transitions) -> str:
        """Mostly a trigger legal in the stream's state (to reach deep states), else any."""
        all_triggers = sorted({t for _s, t in table})
        legal = sorted(t for s, t in table if s == self._state(stream))
        if data.draw(st.integers(0, 3), label="pick_legal") > 0:
            return data.draw(st.sampled_from(legal), label="trigger")
        return data.draw(st.sampled_from(all_triggers), label="trigger")

    def _fire_device(self, data: st.DataObject, vol: str, flag: bool) -> None:
        stream = device_stream(vol)
        trigger = self._trigger(data, stream, SHADOW_DEVICE)
        self._fire(stream, trigger, device_body(trigger, vol, flag), SHADOW_DEVICE)

    def _fire_podvol(self, data: st.DataObject, pv: tuple[str, str], flag: bool) -> None:
        uid, name = pv
        stream = podvol_stream(uid, name)
        trigger = self._trigger(data, stream, SHADOW_PODVOL)
        self._fire(stream, trigger, podvol_body(trigger, uid, name, flag), SHADOW_PODVOL)

    # Rules are picked uniformly: each transition rule is registered twice so that
    # runs reach deep states (DeviceGloballyMounted after attach + stage) more often.
    fire_device = rule(data=st.data(), vol=st.sampled_from(VOLUMES), flag=st.booleans())(
        _fire_device
    )
    fire_device_again = rule(data=st.data(), vol=st.sampled_from(VOLUMES), flag=st.booleans())(
        _fire_device
    )
    fire_podvol = rule(data=st.data(), pv=st.sampled_from(PODVOLS), flag=st.booleans())(
        _fire_podvol
    )
    fire_podvol_again = rule(data=st.data(), pv=st.sampled_from(PODVOLS), flag=st.booleans())(
        _fire_podvol
    )

    @rule(
        vol=st.sampled_from(VOLUMES),
        pod=st.sampled_from(PODS),
        trigger=st.sampled_from((*DEVICE_TRIGGERS, "no_such_trigger")),
        other=st.sampled_from(DEVICE_TRIGGERS),
    )
    def refused_commands_leave_no_trace(self, vol: str, pod: str, trigger: str, other: str) -> None:
        """A trigger with another trigger's body, an unknown trigger, a transition passed to
        record(), a trigger on a desired-state stream: all refused, nothing appended."""
        before = self.log.last_seq()
        if trigger != other:
            with pytest.raises(IllegalTransitionError):
                self.handler.fire(device_stream(vol), trigger, device_body(other, vol, False))
        with pytest.raises(ValueError, match="use fire"):
            self.handler.record(device_stream(vol), [device_body(other, vol, True)])
        with pytest.raises(ValueError, match="no state machine"):
            self.handler.fire(pod_stream(pod), other, device_body(other, vol, False))
        assert self.log.last_seq() == before

    @rule(
        stream=st.sampled_from(
            [device_stream(v) for v in VOLUMES] + [podvol_stream(u, n) for u, n in PODVOLS]
        )
    )
    def start_operation(self, stream: str) -> None:
        op_id = f"op-{next(self.op_ids)}"
        body = OperationStarted(op_id=op_id, operation="mount_device", volume_id="v")
        self.handler.record(stream, [body])
        self.open_ops.setdefault(stream, []).append(op_id)
        self._appended(stream, 1)

    @precondition(lambda self: any(self.open_ops.values()))
    @rule(data=st.data(), failed=st.booleans(), final=st.booleans())
    def finish_operation(self, data: st.DataObject, failed: bool, final: bool) -> None:
        stream = data.draw(st.sampled_from(sorted(s for s, ops in self.open_ops.items() if ops)))
        op_id = data.draw(st.sampled_from(self.open_ops[stream]))
        body: Body
        if failed:
            body = OperationFailed(
                op_id=op_id, operation="mount_device", code="Internal", message="m", final=final
            )
        else:
            body = OperationSucceeded(op_id=op_id, operation="mount_device", duration_s=0.1)
        self.handler.record(stream, [body])
        self.open_ops[stream].remove(op_id)
        self._appended(stream, 1)

    @rule(pod=st.sampled_from(PODS))
    def add_pod(self, pod: str) -> None:
        self.handler.record(pod_stream(pod), [PodAdded(pod_uid=pod, namespace="ns", name=pod)])
        self.pods.add(pod)
        self._appended(pod_stream(pod), 1)

    @precondition(lambda self: bool(self.pods))
    @rule(data=st.data())
    def remove_pod(self, data: st.DataObject) -> None:
        pod = data.draw(st.sampled_from(sorted(self.pods)))
        self.handler.record(pod_stream(pod), [PodRemoved(pod_uid=pod, namespace="ns", name=pod)])
        self.pods.discard(pod)
        self._appended(pod_stream(pod), 1)

    @rule()
    def restart_handler(self) -> None:
        """A new handler has no cache: it must load every aggregate from the log."""
        self.handler = CommandHandler(self.log)

    @rule()
    def reopen_log(self) -> None:
        self.log.close()
        self.log = EventLog(self.dir / "volfsm.db", node="n1", clock=self.clock)
        self.handler = CommandHandler(self.log)

    @precondition(lambda self: bool(self.snapshots))
    @rule(data=st.data())
    def prefix_fold_equals_the_state_at_that_seq(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.snapshots)))
        _ts, view, pods = self.snapshots[seq]
        asw = fold(self.log.read_after(0, until_seq=seq))
        assert asw.last_seq == seq
        assert_asw_matches(asw, view, pods)

    # --------------------------------------------------------- invariants

    @invariant()
    def fold_equals_live_state_and_shadow(self) -> None:
        asw = fold(self.log.read_after(0))
        assert asw.last_seq == self.log.last_seq()
        live: View = {}
        for stream in self._view():
            model = self.handler.load(stream)
            live[stream] = (model.state, model.version)
        assert live == self._view()
        assert_asw_matches(asw, live, self.pods)

    @invariant()
    def log_validates(self) -> None:
        report = validate(self.log.read_after(0))
        assert report.ok, report.violation
        assert report.events == self.log.last_seq()

    def teardown(self) -> None:
        event(f"appends {self.log.last_seq() // 10 * 10}+")
        try:
            for seq, (ts, view, pods) in self.snapshots.items():
                assert_asw_matches(fold(self.log.read_after(0, until_seq=seq)), view, pods)
                by_time = state_at_time(self.log.read_after(0), ts)
                assert by_time.last_seq == seq
                assert_asw_matches(by_time, view, pods)
        finally:
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)


LogMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLogMachine = LogMachine.TestCase

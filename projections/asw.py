"""The actual state of world (ASW): a pure fold of the event log.

The same fold serves the live engine (it applies each envelope as it is
appended), crash recovery (fold the whole log), and offline replay of a
copied log (fold up to a `seq` or a time). It reads the transition tables
from `events.tables` and never imports `transitions`.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from events.codec import CURRENT_SCHEMAS, decode_body, decode_current_body
from events.streams import DEVICE_PREFIX, POD_PREFIX, PODVOL_PREFIX
from events.tables import DEVICE_FSM, PODVOL_FSM, FsmTable
from events.types import (
    EVENT_TYPES,
    Body,
    DesiredSizeChanged,
    DeviceAttached,
    DeviceMounted,
    DeviceMountUncertain,
    DeviceUnmounted,
    Envelope,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    PodCleanedUp,
    PodRemoved,
    VolumeConditionChanged,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeResized,
    VolumeUnmounted,
    VolumeUsageChanged,
)

StoredRow = tuple[int, str, int, str, int, int, bytes]
"""(seq, stream, version, type, schema, ts, body bytes) as `EventLog.scan_rows` gives them."""

Hook = Callable[[Any, int], object]
"""Called with (body, stream version) after an event of its type (`Asw.fold_rows`)."""


class OperationRecord(msgspec.Struct, gc=False):
    """The last operation on an entry: what ran, how it ended, what follows."""

    op_id: str
    operation: str
    started_us: int
    status: str = "running"
    ended_us: int | None = None
    code: str = ""
    message: str = ""
    final: bool | None = None
    backoff_s: float = 0.0

    @property
    def retry_at_us(self) -> int | None:
        """When the executor allows the next try after this failure (None if not failed)."""
        if self.status != "failed" or self.ended_us is None:
            return None
        return self.ended_us + int(self.backoff_s * 1_000_000)


class DeviceState(msgspec.Struct, gc=False):
    """One volume on the node: the device FSM state and what is known about it."""

    volume_id: str
    state: str = DEVICE_FSM.initial
    version: int = 0
    plugin: str = ""
    attachable: bool = False
    device_path: str = ""
    device_mount_path: str = ""
    size_bytes: int | None = None
    reconstructed: bool = False
    reason: str = ""
    since_us: int = 0
    last_operation: OperationRecord | None = None
    last_error: OperationRecord | None = None


class PodVolumeState(msgspec.Struct, gc=False):
    """One (pod, volume): the pod-volume FSM state and its mount."""

    pod_uid: str
    volume_name: str
    volume_id: str = ""
    state: str = PODVOL_FSM.initial
    version: int = 0
    mount_path: str = ""
    reconstructed: bool = False
    reason: str = ""
    since_us: int = 0
    last_operation: OperationRecord | None = None
    last_error: OperationRecord | None = None
    abnormal: bool = False
    """The driver's last reported volume condition was abnormal (VolumeConditionChanged)."""
    condition: str = ""
    """The condition's message while abnormal."""
    capacity_bytes: int = 0
    """Capacity at the last recorded usage step (VolumeUsageChanged; 0: none recorded)."""
    used_bytes: int = 0
    """Bytes used at the last recorded usage step."""


@dataclass(slots=True)
class Asw:
    """Devices, pod-volumes, desired pods and the last op per entry, as of `last_seq`."""

    devices: dict[str, DeviceState] = field(default_factory=dict)
    podvols: dict[tuple[str, str], PodVolumeState] = field(default_factory=dict)
    desired_pods: dict[str, PodAdded] = field(default_factory=dict)
    desired_sizes: dict[str, int] = field(default_factory=dict)
    last_seq: int = 0
    last_ts: int = 0

    def apply(self, env: Envelope) -> None:
        """Fold one envelope into the state. Envelopes must come in `seq` order."""
        self.fold_event(env.seq, env.stream, env.version, env.type, env.ts, env.body)

    def fold_event(
        self, seq: int, stream: str, version: int, type_name: str, ts: int, body: Body
    ) -> None:
        """`apply` of an event given field by field: big folds need no envelope per event."""
        self.last_seq = seq
        self.last_ts = ts
        if stream.startswith(DEVICE_PREFIX):
            volume_id = stream[_DEVICE_CUT:]
            devices = self.devices
            dev = devices.get(volume_id)
            if dev is None:
                dev = devices[volume_id] = DeviceState(volume_id, since_us=ts)
            dev.version = version
            cls = type(body)
            op = _OPERATIONS.get(cls)
            if op is not None:
                op(dev, body, ts)
                return
            moves = _DEVICE_NEXT.get(type_name)
            if moves is not None:
                new_state = moves.get(dev.state)
                if new_state is not None and new_state != dev.state:
                    dev.state = new_state
                    dev.since_us = ts
            update = _DEVICE_UPDATES.get(cls)
            if update is not None:
                update(dev, body)
            elif type_name == "DeviceDetached":
                del devices[volume_id]
        elif stream.startswith(PODVOL_PREFIX):
            pod_uid, _, name = stream[_PODVOL_CUT:].partition("/")
            key = (pod_uid, name)
            podvols = self.podvols
            pv = podvols.get(key)
            if pv is None:
                pv = podvols[key] = PodVolumeState(pod_uid, name, since_us=ts)
            pv.version = version
            cls = type(body)
            op = _PODVOL_OPERATIONS.get(cls)
            if op is not None:
                op(pv, body, ts)
                return
            moves = _PODVOL_NEXT.get(type_name)
            if moves is not None:
                new_state = moves.get(pv.state)
                if new_state is not None and new_state != pv.state:
                    pv.state = new_state
                    pv.since_us = ts
            pv_update = _PODVOL_UPDATES.get(cls)
            if pv_update is not None:
                pv_update(pv, body)
        elif stream.startswith(POD_PREFIX):
            self._apply_desired(body)

    def fold_rows(
        self,
        rows: Iterable[StoredRow],
        hooks: Mapping[type, Hook] | None = None,
        *,
        with_podvols: bool = True,
    ) -> tuple[int, int]:
        """Fold stored rows, decoding each body; (last seq folded, rows folded).

        The fast path of a big fold (engine start): `fold_event` written
        out in one loop, with everything an event type needs found by one
        lookup of its name (`_fold_plans`), operation records decoded
        into views holding only what the ASW keeps of them, a device
        stream's entry found by one lookup of the stream after its first
        event, and no cyclic GC while it runs. After an event
        whose body type is in `hooks`, `hooks[type](body, version)` is
        called (the engine feeds its DSW and index this way; a hooked type
        is always decoded in full). With `with_podvols` False, rows of pod-volume
        streams only run their hooks (another fold builds those entries:
        `volfsm.engine.splitfold`). tests/snapshot checks that this folds
        exactly like `apply`.
        """
        plans = _fold_plans(hooks or {})
        devices, podvols = self.devices, self.podvols
        device_cut, podvol_cut = _DEVICE_CUT, _PODVOL_CUT
        device_prefix, podvol_prefix, pod_prefix = DEVICE_PREFIX, PODVOL_PREFIX, POD_PREFIX
        new_device, new_podvol = DeviceState, PodVolumeState
        # device stream -> its entry, for the events after the stream's first: no slice
        # of the stream name. Dropped when the fold deletes the entry (detach).
        seen_devices: dict[str, DeviceState] = {}
        count = 0
        seq = ts = -1
        body: Any
        with _gc_paused():  # the fold makes no cycles: a collection would only rescan it
            for count, (seq, stream, version, type_name, schema, ts, data) in enumerate(rows, 1):  # noqa: B007
                plan = plans.get(type_name)
                if plan is not None and plan.schema == schema:
                    body = plan.decode(data)
                else:  # an older schema (upcast), or a type this build does not know (raises)
                    body = decode_body(type_name, schema, data)
                    plan = plans[type_name]
                if stream.startswith(device_prefix):
                    dev = seen_devices.get(stream)
                    if dev is None:
                        volume_id = stream[device_cut:]
                        dev = devices.get(volume_id)
                        if dev is None:
                            dev = devices[volume_id] = new_device(volume_id, since_us=ts)
                        seen_devices[stream] = dev
                    dev.version = version
                    op = plan.device_op
                    if op is not None:
                        op(dev, body, ts)
                    else:
                        moves = plan.device_moves
                        if moves is not None:
                            new_state = moves.get(dev.state)
                            if new_state is not None and new_state != dev.state:
                                dev.state = new_state
                                dev.since_us = ts
                        update = plan.device_update
                        if update is not None:
                            update(dev, body)
                        elif plan.detaches:
                            del devices[dev.volume_id]
                            del seen_devices[stream]
                elif stream.startswith(podvol_prefix):
                    if not with_podvols:
                        hook = plan.hook
                        if hook is not None:
                            hook(body, version)
                        continue
                    pod_uid, _, name = stream[podvol_cut:].partition("/")
                    key = (pod_uid, name)
                    pv = podvols.get(key)
                    if pv is None:
                        pv = podvols[key] = new_podvol(pod_uid, name, since_us=ts)
                    pv.version = version
                    op = plan.podvol_op
                    if op is not None:
                        op(pv, body, ts)
                    else:
                        moves = plan.podvol_moves
                        if moves is not None:
                            new_state = moves.get(pv.state)
                            if new_state is not None and new_state != pv.state:
                                pv.state = new_state
                                pv.since_us = ts
                        pv_update = plan.podvol_update
                        if pv_update is not None:
                            pv_update(pv, body)
                elif stream.startswith(pod_prefix):
                    desired = plan.desired
                    if desired is not None:
                        desired(self, body)
                hook = plan.hook
                if hook is not None:
                    hook(body, version)
        if count:
            self.last_seq, self.last_ts = seq, ts
        return seq, count

    # ----------------------------------------------------------------- kinds

    def _apply_desired(self, body: Body) -> None:
        fold = _DESIRED_FOLDS.get(type(body))
        if fold is not None:
            fold(self, body)

    # --------------------------------------------------------------- queries

    def pod_volumes(self, pod_uid: str) -> list[PodVolumeState]:
        """Every known pod-volume entry of one pod (any state)."""
        return [pv for (uid, _), pv in self.podvols.items() if uid == pod_uid]

    def mounted_pods_on(self, volume_id: str) -> list[PodVolumeState]:
        """Pod-volumes on `volume_id` that are Mounted or Uncertain (may be mounted)."""
        return [
            pv
            for pv in self.podvols.values()
            if pv.volume_id == volume_id and pv.state != PODVOL_FSM.initial
        ]


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic collection inside the block (a big fold allocates and keeps objects)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _next_states(table: FsmTable) -> dict[str, dict[str, str]]:
    """event type -> {state: next state}: `table.next_state` as two dict lookups."""
    out: dict[str, dict[str, str]] = {}
    for t in table.transitions:
        moves = out.setdefault(t.event, {})
        for source in t.sources:
            moves.setdefault(source, source if t.dest is None else t.dest)
    return out


intern = sys.intern
"""Operation and plugin names are few: entries share one copy of each."""

_DEVICE_NEXT = _next_states(DEVICE_FSM)
_PODVOL_NEXT = _next_states(PODVOL_FSM)
_DEVICE_CUT = len(DEVICE_PREFIX)
_PODVOL_CUT = len(PODVOL_PREFIX)

Entry = DeviceState | PodVolumeState


def _op_started(entry: Entry, body: Any, ts: int) -> None:
    entry.last_operation = OperationRecord(body.op_id, intern(body.operation), ts)


def _op_succeeded(entry: Entry, body: Any, ts: int) -> None:
    op = entry.last_operation
    if op is not None and op.op_id == body.op_id:
        op.status = "succeeded"
        op.ended_us = ts


def _op_failed(entry: Entry, body: Any, ts: int) -> None:
    op = entry.last_operation
    if op is None or op.op_id != body.op_id:
        op = entry.last_operation = OperationRecord(body.op_id, body.operation, ts)
    op.status = "failed"
    op.ended_us = ts
    op.code = body.code
    op.message = body.message
    op.final = body.final
    op.backoff_s = body.backoff_s
    entry.last_error = op


def _podvol_op_started(entry: Entry, body: Any, ts: int) -> None:
    entry.last_operation = OperationRecord(body.op_id, intern(body.operation), ts)
    if body.volume_id:
        entry.volume_id = body.volume_id


class _StartedView(msgspec.Struct, frozen=True, gc=False):
    """What the ASW keeps of an OperationStarted (a big fold decodes only this)."""

    op_id: str
    operation: str
    volume_id: str = ""


class _SucceededView(msgspec.Struct, frozen=True, gc=False):
    """What the ASW keeps of an OperationSucceeded."""

    op_id: str


_VIEWS: dict[str, type] = {
    "OperationStarted": _StartedView,
    "OperationSucceeded": _SucceededView,
}
"""Current-schema bodies `fold_rows` decodes as views (the rest: the full union)."""

_OPERATIONS: dict[type, Callable[[Entry, Any, int], None]] = {
    OperationStarted: _op_started,
    OperationSucceeded: _op_succeeded,
    OperationFailed: _op_failed,
    _StartedView: _op_started,
    _SucceededView: _op_succeeded,
}
"""Operation records on a device stream."""

_PODVOL_OPERATIONS: dict[type, Callable[[Entry, Any, int], None]] = {
    **_OPERATIONS,
    OperationStarted: _podvol_op_started,
    _StartedView: _podvol_op_started,
}
"""Operation records on a pod-volume stream (a start also says which volume)."""


def _device_attached(dev: DeviceState, body: Any) -> None:
    dev.plugin = intern(body.plugin)  # one copy per plugin, not per device
    dev.attachable = body.attachable
    dev.device_path = body.device_path
    dev.reconstructed = False
    dev.reason = ""


def _device_mounted(dev: DeviceState, body: Any) -> None:
    dev.device_mount_path = body.device_mount_path
    dev.reconstructed = False
    dev.reason = ""


def _device_uncertain(dev: DeviceState, body: Any) -> None:
    dev.reason = body.reason
    dev.reconstructed = dev.reconstructed or body.reconstructed
    if body.device_mount_path:
        dev.device_mount_path = body.device_mount_path


def _device_unmounted(dev: DeviceState, body: Any) -> None:
    dev.device_mount_path = ""
    dev.reconstructed = False
    dev.reason = body.reason


def _volume_resized(dev: DeviceState, body: Any) -> None:
    dev.size_bytes = body.size_bytes


_DEVICE_UPDATES: dict[type, Callable[[DeviceState, Any], None]] = {
    DeviceAttached: _device_attached,
    DeviceMounted: _device_mounted,
    DeviceMountUncertain: _device_uncertain,
    DeviceUnmounted: _device_unmounted,
    VolumeResized: _volume_resized,
}


def _volume_mounted(pv: PodVolumeState, body: Any) -> None:
    pv.volume_id = body.volume_id
    pv.mount_path = body.mount_path
    pv.reconstructed = False
    pv.reason = ""


def _volume_uncertain(pv: PodVolumeState, body: Any) -> None:
    pv.volume_id = body.volume_id
    pv.reason = body.reason
    pv.reconstructed = pv.reconstructed or body.reconstructed


def _volume_unmounted(pv: PodVolumeState, body: Any) -> None:
    pv.volume_id = body.volume_id
    pv.reason = body.reason
    pv.reconstructed = False
    pv.mount_path = ""
    pv.abnormal, pv.condition = False, ""
    pv.capacity_bytes = pv.used_bytes = 0


def _condition_changed(pv: PodVolumeState, body: Any) -> None:
    pv.abnormal = body.abnormal
    pv.condition = body.message if body.abnormal else ""


def _usage_changed(pv: PodVolumeState, body: Any) -> None:
    pv.capacity_bytes = body.capacity_bytes
    pv.used_bytes = body.used_bytes


_PODVOL_UPDATES: dict[type, Callable[[PodVolumeState, Any], None]] = {
    VolumeMounted: _volume_mounted,
    VolumeMountUncertain: _volume_uncertain,
    VolumeUnmounted: _volume_unmounted,
    VolumeConditionChanged: _condition_changed,
    VolumeUsageChanged: _usage_changed,
}


def _pod_added(asw: Asw, body: PodAdded) -> None:
    asw.desired_pods[body.pod_uid] = body


def _pod_removed(asw: Asw, body: PodRemoved) -> None:
    asw.desired_pods.pop(body.pod_uid, None)


def _pod_cleaned_up(asw: Asw, body: PodCleanedUp) -> None:
    podvols = asw.podvols
    for name in body.volume_names:
        pv = podvols.get((body.pod_uid, name))
        if pv is not None and pv.state == PODVOL_FSM.initial:
            del podvols[(body.pod_uid, name)]


def _desired_size_changed(asw: Asw, body: DesiredSizeChanged) -> None:
    asw.desired_sizes[body.volume_id] = body.size_bytes


_DESIRED_FOLDS: dict[type, Callable[[Asw, Any], None]] = {
    PodAdded: _pod_added,
    PodRemoved: _pod_removed,
    PodCleanedUp: _pod_cleaned_up,
    DesiredSizeChanged: _desired_size_changed,
}
"""What each event of a pod stream does to the ASW."""


@dataclass(slots=True, frozen=True)
class _FoldPlan:
    """Everything `Asw.fold_rows` does with one event type (None: nothing of that kind).

    A slotted class, not a NamedTuple: the fold reads several fields per
    event, and a slot read is the interpreter's fastest attribute access.
    """

    schema: int
    decode: Callable[[bytes], Any]
    device_op: Callable[[Entry, Any, int], None] | None
    device_moves: dict[str, str] | None
    device_update: Callable[[DeviceState, Any], None] | None
    detaches: bool
    podvol_op: Callable[[Entry, Any, int], None] | None
    podvol_moves: dict[str, str] | None
    podvol_update: Callable[[PodVolumeState, Any], None] | None
    desired: Callable[[Asw, Any], None] | None
    hook: Hook | None


def _fold_plans(hooks: Mapping[type, Hook]) -> dict[str, _FoldPlan]:
    """Event type name -> its fold plan, with `hooks` (by body class) built in.

    The view of an operation record is used only where no hook wants the
    event: hooks always get the full body.
    """
    plans: dict[str, _FoldPlan] = {}
    for name, cls in EVENT_TYPES.items():
        hook = hooks.get(cls)
        view = _VIEWS.get(name) if hook is None else None
        op_key = view or cls
        plans[name] = _FoldPlan(
            schema=CURRENT_SCHEMAS[name],
            decode=msgspec.msgpack.Decoder(view).decode if view else decode_current_body,
            device_op=_OPERATIONS.get(op_key),
            device_moves=_DEVICE_NEXT.get(name),
            device_update=_DEVICE_UPDATES.get(cls),
            detaches=name == "DeviceDetached",
            podvol_op=_PODVOL_OPERATIONS.get(op_key),
            podvol_moves=_PODVOL_NEXT.get(name),
            podvol_update=_PODVOL_UPDATES.get(cls),
            desired=_DESIRED_FOLDS.get(cls),
            hook=hook,
        )
    return plans


def fold(envelopes: Iterable[Envelope], asw: Asw | None = None) -> Asw:
    """Fold envelopes (in `seq` order) into an ASW, starting empty or from `asw`."""
    state = asw if asw is not None else Asw()
    apply = state.apply
    for env in envelopes:
        apply(env)
    return state

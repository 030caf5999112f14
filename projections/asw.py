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
from typing import Any, Union

import msgspec

from events.codec import decode_body
from events.errors import UnknownEventError
from events.foldrows import FoldRows
from events.streams import DEVICE_PREFIX, POD_PREFIX, PODVOL_PREFIX
from events.tables import DEVICE_FSM, PODVOL_FSM, FsmTable
from events.types import EVENT_TYPES, Envelope, PodAdded

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
        stream, version, ts, body = env.stream, env.version, env.ts, env.body
        self.last_seq = env.seq
        self.last_ts = ts
        plan = _PLANS.get(env.type, _NO_PLAN)
        if stream.startswith(DEVICE_PREFIX):
            volume_id = stream[_DEVICE_CUT:]
            devices = self.devices
            dev = devices.get(volume_id)
            if dev is None:
                dev = devices[volume_id] = DeviceState(volume_id, since_us=ts)
            dev.version = version
            moves = plan.device_moves
            if moves is not None:
                state = dev.state
                new_state = moves.get(state)
                if new_state is not None and new_state != state:
                    dev.state = new_state
                    dev.since_us = ts
            fold = plan.device
            if fold is not None:
                fold(dev, body, ts)
            elif plan.detaches:
                del devices[volume_id]
        elif stream.startswith(PODVOL_PREFIX):
            pod_uid, _, name = stream[_PODVOL_CUT:].partition("/")
            key = (pod_uid, name)
            podvols = self.podvols
            pv = podvols.get(key)
            if pv is None:
                pv = podvols[key] = PodVolumeState(pod_uid, name, since_us=ts)
            pv.version = version
            moves = plan.podvol_moves
            if moves is not None:
                state = pv.state
                new_state = moves.get(state)
                if new_state is not None and new_state != state:
                    pv.state = new_state
                    pv.since_us = ts
            fold = plan.podvol
            if fold is not None:
                fold(pv, body, ts)
        elif stream.startswith(POD_PREFIX):
            desired = plan.desired
            if desired is not None:
                desired(self, body)

    def fold_rows(
        self,
        rows: FoldRows,
        hooks: Mapping[type, Hook] | None = None,
        *,
        with_podvols: bool = True,
    ) -> tuple[int, int]:
        """Fold the rows of one `EventLog.scan_fold`; (last seq folded, rows folded).

        The fast path of a big fold (engine start): `apply` written out
        in one loop. A body is decoded by its own tag into a view of
        only the fields the ASW reads (`_VIEW_FIELDS`), and the view's class
        finds everything its type needs (`_fold_plans`); an entry is found
        by one lookup of its stream after the stream's first event; no
        cyclic GC runs meanwhile. After an event whose body type is in
        `hooks`, `hooks[type](body, version)` is called (the engine feeds its
        DSW and index this way; a hooked type is always decoded in full).
        With `with_podvols` False, rows of pod-volume streams only run their
        hooks (another fold builds those entries: `volfsm.engine.splitfold`).
        tests/projections/test_fast_fold.py and tests/snapshot check that
        this folds exactly like `apply`.
        """
        plans, decode = _fold_plans(hooks or {})
        hooked = bool(hooks)
        devices, podvols = self.devices, self.podvols
        device_cut, podvol_cut = _DEVICE_CUT, _PODVOL_CUT
        device_prefix, podvol_prefix, pod_prefix = DEVICE_PREFIX, PODVOL_PREFIX, POD_PREFIX
        new_device, new_podvol = DeviceState, PodVolumeState
        # stream -> its entry, for the events after the stream's first: no slicing of
        # stream names. Forgotten when the fold deletes entries (detach, cleanup).
        seen_devices: dict[str, DeviceState] = {}
        seen_podvols: dict[str, PodVolumeState] = {}
        count = ts = 0
        data = b""
        body: Any
        try:
            with _gc_paused():  # the fold makes no cycles: a collection would only rescan it
                for count, (stream, version, ts, data, legacy) in enumerate(rows.rows, 1):  # noqa: B007
                    if legacy is None:
                        body = decode(data)
                    else:  # written with an older schema: upcast ("type:schema")
                        type_name, _, schema = legacy.rpartition(":")
                        body = decode_body(type_name, int(schema), data)
                    plan = plans[body.__class__]
                    dev = seen_devices.get(stream)
                    if dev is None and stream.startswith(device_prefix):
                        volume_id = stream[device_cut:]
                        dev = devices.get(volume_id)
                        if dev is None:
                            dev = devices[volume_id] = new_device(volume_id, since_us=ts)
                        seen_devices[stream] = dev
                    if dev is not None:
                        dev.version = version
                        moves = plan.device_moves
                        if moves is not None:
                            state = dev.state
                            new_state = moves.get(state)
                            if new_state is not None and new_state != state:
                                dev.state = new_state
                                dev.since_us = ts
                        fold = plan.device
                        if fold is not None:
                            fold(dev, body, ts)
                        elif plan.detaches:
                            del devices[dev.volume_id]
                            del seen_devices[stream]
                    else:
                        pv = seen_podvols.get(stream)
                        if pv is None and with_podvols and stream.startswith(podvol_prefix):
                            pod_uid, _, name = stream[podvol_cut:].partition("/")
                            key = (pod_uid, name)
                            pv = podvols.get(key)
                            if pv is None:
                                pv = podvols[key] = new_podvol(pod_uid, name, since_us=ts)
                            seen_podvols[stream] = pv
                        if pv is not None:
                            pv.version = version
                            moves = plan.podvol_moves
                            if moves is not None:
                                state = pv.state
                                new_state = moves.get(state)
                                if new_state is not None and new_state != state:
                                    pv.state = new_state
                                    pv.since_us = ts
                            fold = plan.podvol
                            if fold is not None:
                                fold(pv, body, ts)
                        elif stream.startswith(pod_prefix):
                            desired = plan.desired
                            if desired is not None:
                                before = len(podvols)
                                desired(self, body)
                                if len(podvols) != before:  # a cleanup forgot entries
                                    seen_podvols.clear()
                    if hooked:
                        hook = plan.hook
                        if hook is not None:
                            hook(body, version)
        except msgspec.ValidationError:
            _raise_if_unknown(data)
            raise
        if count:
            self.last_seq, self.last_ts = rows.last_seq, ts
        return rows.last_seq, count

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
Fold = Callable[[Any, Any, int], None]
"""What one event type does to an entry besides its state move: (entry, body, ts)."""

# The folds below leave a field alone where it already holds the value (a
# Struct field store costs more than a read): same result, fewer stores.


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
        op = entry.last_operation = OperationRecord(
            body.op_id,
            body.operation,
            ts,
            "failed",
            ts,
            body.code,
            body.message,
            body.final,
            body.backoff_s,
        )
    else:
        op.status = "failed"
        op.ended_us = ts
        op.code = body.code
        op.message = body.message
        op.final = body.final
        op.backoff_s = body.backoff_s
    entry.last_error = op


def _podvol_op_started(pv: PodVolumeState, body: Any, ts: int) -> None:
    pv.last_operation = OperationRecord(body.op_id, intern(body.operation), ts)
    if body.volume_id:
        pv.volume_id = body.volume_id


def _device_attached(dev: DeviceState, body: Any, _ts: int) -> None:
    dev.plugin = intern(body.plugin)  # one copy per plugin, not per device
    dev.attachable = body.attachable
    dev.device_path = body.device_path
    if dev.reconstructed:
        dev.reconstructed = False
    if dev.reason:
        dev.reason = ""


def _device_mounted(dev: DeviceState, body: Any, _ts: int) -> None:
    dev.device_mount_path = body.device_mount_path
    if dev.reconstructed:
        dev.reconstructed = False
    if dev.reason:
        dev.reason = ""


def _device_uncertain(dev: DeviceState, body: Any, _ts: int) -> None:
    dev.reason = body.reason
    dev.reconstructed = dev.reconstructed or body.reconstructed
    if body.device_mount_path:
        dev.device_mount_path = body.device_mount_path


def _device_unmounted(dev: DeviceState, body: Any, _ts: int) -> None:
    if dev.device_mount_path:
        dev.device_mount_path = ""
    if dev.reconstructed:
        dev.reconstructed = False
    dev.reason = body.reason


def _volume_resized(dev: DeviceState, body: Any, _ts: int) -> None:
    dev.size_bytes = body.size_bytes


_DEVICE_FOLDS: dict[str, Fold] = {
    "OperationStarted": _op_started,
    "OperationSucceeded": _op_succeeded,
    "OperationFailed": _op_failed,
    "DeviceAttached": _device_attached,
    "DeviceMounted": _device_mounted,
    "DeviceMountUncertain": _device_uncertain,
    "DeviceUnmounted": _device_unmounted,
    "VolumeResized": _volume_resized,
}
"""Event type -> what it does to a device entry (after its state move)."""


def _volume_mounted(pv: PodVolumeState, body: Any, _ts: int) -> None:
    pv.volume_id = body.volume_id
    pv.mount_path = body.mount_path
    if pv.reconstructed:
        pv.reconstructed = False
    if pv.reason:
        pv.reason = ""


def _volume_uncertain(pv: PodVolumeState, body: Any, _ts: int) -> None:
    pv.volume_id = body.volume_id
    pv.reason = body.reason
    pv.reconstructed = pv.reconstructed or body.reconstructed


def _volume_unmounted(pv: PodVolumeState, body: Any, _ts: int) -> None:
    pv.volume_id = body.volume_id
    pv.reason = body.reason
    if pv.reconstructed:
        pv.reconstructed = False
    if pv.mount_path:
        pv.mount_path = ""
    if pv.abnormal or pv.condition:
        pv.abnormal, pv.condition = False, ""
    if pv.capacity_bytes or pv.used_bytes:
        pv.capacity_bytes = pv.used_bytes = 0


def _condition_changed(pv: PodVolumeState, body: Any, _ts: int) -> None:
    pv.abnormal = body.abnormal
    pv.condition = body.message if body.abnormal else ""


def _usage_changed(pv: PodVolumeState, body: Any, _ts: int) -> None:
    pv.capacity_bytes = body.capacity_bytes
    pv.used_bytes = body.used_bytes


_PODVOL_FOLDS: dict[str, Fold] = {
    "OperationStarted": _podvol_op_started,  # a start also says which volume
    "OperationSucceeded": _op_succeeded,
    "OperationFailed": _op_failed,
    "VolumeMounted": _volume_mounted,
    "VolumeMountUncertain": _volume_uncertain,
    "VolumeUnmounted": _volume_unmounted,
    "VolumeConditionChanged": _condition_changed,
    "VolumeUsageChanged": _usage_changed,
}
"""Event type -> what it does to a pod-volume entry (after its state move)."""


def _pod_added(asw: Asw, body: PodAdded) -> None:
    asw.desired_pods[body.pod_uid] = body


def _pod_removed(asw: Asw, body: Any) -> None:
    asw.desired_pods.pop(body.pod_uid, None)


def _pod_cleaned_up(asw: Asw, body: Any) -> None:
    podvols = asw.podvols
    for name in body.volume_names:
        pv = podvols.get((body.pod_uid, name))
        if pv is not None and pv.state == PODVOL_FSM.initial:
            del podvols[(body.pod_uid, name)]


def _desired_size_changed(asw: Asw, body: Any) -> None:
    asw.desired_sizes[body.volume_id] = body.size_bytes


_DESIRED_FOLDS: dict[str, Callable[[Asw, Any], None]] = {
    "PodAdded": _pod_added,
    "PodRemoved": _pod_removed,
    "PodCleanedUp": _pod_cleaned_up,
    "DesiredSizeChanged": _desired_size_changed,
}
"""What each event of a pod stream does to the ASW."""

_VIEW_FIELDS: dict[str, tuple[str, ...]] = {
    "PodRemoved": ("pod_uid",),
    "PodCleanedUp": ("pod_uid", "volume_names"),
    "DesiredSizeChanged": ("volume_id", "size_bytes"),
    "PodPending": (),
    "ObjectApplied": (),
    "ObjectDeleted": (),
    "DeviceAttached": ("plugin", "attachable", "device_path"),
    "DeviceMounted": ("device_mount_path",),
    "DeviceMountUncertain": ("reason", "reconstructed", "device_mount_path"),
    "DeviceUnmounted": ("reason",),
    "DeviceDetached": (),
    "VolumeResized": ("size_bytes",),
    "VolumeMounted": ("volume_id", "mount_path"),
    "VolumeMountUncertain": ("volume_id", "reason", "reconstructed"),
    "VolumeUnmounted": ("volume_id", "reason"),
    "OperationStarted": ("op_id", "operation", "volume_id"),
    "OperationSucceeded": ("op_id",),
    "OperationFailed": ("op_id", "operation", "code", "message", "final", "backoff_s"),
    "VolumeConditionChanged": ("abnormal", "message"),
    "VolumeUsageChanged": ("capacity_bytes", "used_bytes"),
}
"""Event type -> the body fields the ASW reads; `fold_rows` decodes only these.

A type not listed (PodAdded: the ASW keeps the whole body) is decoded in
full; so is a type a hook wants."""


def _view(name: str, fields: tuple[str, ...]) -> type:
    """A Struct of only `fields` of event type `name` (same types, defaults and tag)."""
    info = {f.name: f for f in msgspec.structs.fields(EVENT_TYPES[name])}
    spec: list[Any] = []
    for field_name in fields:
        f = info[field_name]
        if f.encode_name != f.name:
            raise TypeError(f"{name}.{f.name} is renamed: a view would not find it")
        if f.default is not msgspec.NODEFAULT:
            spec.append((f.name, f.type, f.default))
        elif f.default_factory is not msgspec.NODEFAULT:
            spec.append((f.name, f.type, msgspec.field(default_factory=f.default_factory)))
        else:
            spec.append((f.name, f.type))
    return msgspec.defstruct(
        f"{name}View",
        spec,
        module=__name__,
        kw_only=True,
        frozen=True,
        gc=False,
        tag_field="type",
        tag=name,
    )


_VIEWS: dict[str, type] = {name: _view(name, fields) for name, fields in _VIEW_FIELDS.items()}


@dataclass(slots=True, frozen=True)
class _FoldPlan:
    """Everything a fold does with one event type (None: nothing of that kind).

    A slotted class: the fold reads several fields per event, and a slot
    read is the interpreter's fastest attribute access.
    """

    device_moves: dict[str, str] | None
    device: Fold | None
    detaches: bool
    podvol_moves: dict[str, str] | None
    podvol: Fold | None
    desired: Callable[[Asw, Any], None] | None
    hook: Hook | None


def _plan(name: str, hook: Hook | None) -> _FoldPlan:
    return _FoldPlan(
        device_moves=_DEVICE_NEXT.get(name),
        device=_DEVICE_FOLDS.get(name),
        detaches=name == "DeviceDetached",
        podvol_moves=_PODVOL_NEXT.get(name),
        podvol=_PODVOL_FOLDS.get(name),
        desired=_DESIRED_FOLDS.get(name),
        hook=hook,
    )


_PLANS: dict[str, _FoldPlan] = {name: _plan(name, None) for name in EVENT_TYPES}
"""Event type name -> its plan (`Asw.fold_event`)."""
_NO_PLAN = _plan("", None)


Decoder = Callable[[bytes], Any]
"""bytes -> body."""


def _fold_plans(hooks: Mapping[type, Hook]) -> tuple[dict[type, _FoldPlan], Decoder]:
    """Body class -> fold plan (views and full classes), and the decoder of the bodies.

    The decoder reads a body's tag and decodes it as its type's view, or in
    full where a hook wants the type or the ASW keeps the whole body.
    """
    plans: dict[type, _FoldPlan] = {}
    members: list[type] = []
    for name, cls in EVENT_TYPES.items():
        hook = hooks.get(cls)
        plan = plans[cls] = _plan(name, hook) if hook is not None else _PLANS[name]
        view = _VIEWS.get(name) if hook is None else None
        if view is not None:
            plans[view] = plan
        members.append(view or cls)
    union: Any = Union[tuple(members)]  # noqa: UP007 (built at run time)
    return plans, msgspec.msgpack.Decoder(union).decode


class _Tag(msgspec.Struct):
    type: str = ""


_tag = msgspec.msgpack.Decoder(_Tag)


def _raise_if_unknown(data: bytes) -> None:
    """UnknownEventError if `data`'s tag names no event type of this build (else nothing)."""
    try:
        name = _tag.decode(data).type
    except msgspec.MsgspecError:
        return
    if name not in EVENT_TYPES:
        raise UnknownEventError(f"unknown event type {name!r}")


def fold(envelopes: Iterable[Envelope], asw: Asw | None = None) -> Asw:
    """Fold envelopes (in `seq` order) into an ASW, starting empty or from `asw`."""
    state = asw if asw is not None else Asw()
    apply = state.apply
    for env in envelopes:
        apply(env)
    return state

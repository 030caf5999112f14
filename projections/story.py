"""The story of a log: one plain sentence per event, told with the state before it.

`Story` folds envelopes (in `seq` order) into the ASW and, for each one it
is asked to `tell`, returns a `StoryLine`: who it is about (a pod, a
device, a pod's volume), what happened in words, and the same facts as
fields (the transition's from/to states, the operation, why it started,
which driver calls it makes, the error and the backoff until when).
Events before a replay window are `absorb`ed silently, so the first line
of the window shows the right from-state and attempt number.

Driver calls are inferred, not logged: an `OperationStarted` names the
operation and the plugin, and the plugin's calls for that operation are
fixed (a CSI `volume_mount` on a device that is not staged yet calls
NodeStageVolume then NodePublishVolume).

Imports only `events` (and the standard library).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from events.streams import DEVICE_PREFIX, OBJECT_PREFIX, POD_PREFIX, PODVOL_PREFIX
from events.tables import DEVICE_FSM, GLOBALLY_MOUNTED, PODVOL_FSM, UNMOUNTED
from events.types import (
    DesiredSizeChanged,
    DeviceAttached,
    DeviceMounted,
    DeviceMountUncertain,
    DeviceUnmounted,
    Envelope,
    ObjectApplied,
    ObjectDeleted,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
    PodCleanedUp,
    PodPending,
    PodRemoved,
    VolumeConditionChanged,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeResized,
    VolumeUnmounted,
    VolumeUsageChanged,
)
from projections.asw import Asw, DeviceState, PodVolumeState
from projections.objects import object_text
from projections.pending import DELETED, RESOLVED, PendingPods, waited_text, waits_text
from projections.textfmt import (
    ERROR_MESSAGE_LIMIT,
    describe_attempt,
    duration_text,
    iso_time,
    seconds_text,
    size_text,
)

# ---------------------------------------------------------------- driver calls

CSI_PLUGIN = "kubernetes.io/csi"
EMPTY_DIR_PLUGIN = "kubernetes.io/empty-dir"

_MOUNTS = frozenset({"volume_mount", "map_volume"})
_CSI_CALLS: dict[str, tuple[str, ...]] = {
    "mount_device": ("NodeStageVolume",),
    "volume_unmount": ("NodeUnpublishVolume",),
    "unmap_volume": ("NodeUnpublishVolume",),
    "unmount_device": ("NodeUnstageVolume",),
    "unmap_device": ("NodeUnstageVolume",),
    "volume_fs_resize": ("NodeExpandVolume",),
    "expand_volume": ("NodeExpandVolume",),
    "expand_in_use_volume": ("NodeExpandVolume",),
}
_PLUGIN_CALLS: dict[str, tuple[str, ...]] = {
    "mount_device": ("MountDevice",),
    "volume_unmount": ("TearDown",),
    "unmap_volume": ("UnmapPodDevice",),
    "unmount_device": ("UnmountDevice",),
    "unmap_device": ("TearDownDevice",),
    "volume_fs_resize": ("NodeExpand",),
    "expand_volume": ("NodeExpand",),
    "expand_in_use_volume": ("NodeExpand",),
}


def driver_calls(operation: str, plugin: str, device_state: str) -> tuple[str, ...]:
    """The plugin calls `operation` makes, given the device state when it starts.

    CSI plugins (`kubernetes.io/csi...`) are named by their gRPC calls, other
    plugins by kubelet's volume plugin methods. Operations that call no
    plugin (attach verification, mark detached) give ().
    """
    csi = plugin.startswith(CSI_PLUGIN)
    if operation in _MOUNTS:
        if plugin.startswith(EMPTY_DIR_PLUGIN):
            return ("SetUp",)
        staged = device_state == GLOBALLY_MOUNTED
        if csi:
            return ("NodePublishVolume",) if staged else ("NodeStageVolume", "NodePublishVolume")
        block = operation == "map_volume"
        last = "MapPodDevice" if block else "SetUp"
        return (last,) if staged else ("SetUpDevice" if block else "MountDevice", last)
    if csi:
        return _CSI_CALLS.get(operation, ())
    if plugin.startswith(EMPTY_DIR_PLUGIN) and operation == "volume_unmount":
        return ("TearDown",)
    return _PLUGIN_CALLS.get(operation, ())


def usage_text(body: VolumeUsageChanged) -> str:
    """'412.0 MiB of 1.0 GiB used (40%), inodes 12 of 65536'."""
    share = f" ({100 * body.used_bytes // body.capacity_bytes}%)" if body.capacity_bytes else ""
    text = f"{size_text(body.used_bytes)} of {size_text(body.capacity_bytes)} used{share}"
    if body.inodes:
        text += f", inodes {body.inodes_used} of {body.inodes}"
    return text


# ---------------------------------------------------------------------- lines


@dataclass(slots=True)
class OperationFacts:
    """What an operation record says, beyond its words: set on operation lines only."""

    operation: str
    op_id: str
    reason: str | None = None
    calls: tuple[str, ...] = ()
    attempt: int | None = None
    code: str | None = None
    message: str | None = None
    final: bool | None = None
    backoff_s: float | None = None
    retry_at_us: int | None = None


@dataclass(slots=True)
class StoryLine:
    """One event of the story: its place in the log, its subject, and what happened.

    Transitions carry `from_state` / `to_state` (equal when the state stays);
    operation records carry `op`.
    """

    seq: int
    ts: int
    stream: str
    type: str
    subject: str
    text: str
    from_state: str | None = None
    to_state: str | None = None
    op: OperationFacts | None = None


@dataclass(slots=True)
class EntrySummary:
    """One device or pod-volume in the end-of-story summary."""

    kind: str
    stream: str
    subject: str
    state: str
    since_us: int
    reason: str
    reconstructed: bool
    last_operation: str
    retry_at_us: int | None


@dataclass(slots=True)
class StateSummary:
    """The state at the end of a story: counts per state, desired pods, notable entries.

    `entries` holds every device and every pod-volume that is not Unmounted
    or whose pod is desired (the Unmounted volumes of pods long gone are
    counted, not listed).
    """

    seq: int
    ts: int
    devices: dict[str, int]
    pod_volumes: dict[str, int]
    desired_pods: list[str]
    entries: list[EntrySummary] = field(default_factory=list)


# ---------------------------------------------------------------------- story


def _count(states: Iterable[str], order: tuple[str, ...]) -> dict[str, int]:
    counts = dict.fromkeys(order, 0)
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    return {k: v for k, v in counts.items() if v}


class Story:
    """The ASW fold, plus the words for each event. Feed envelopes in `seq` order."""

    def __init__(self) -> None:
        self.asw = Asw()
        self.pending = PendingPods()
        """Every wait of a pod for its claims (`PodPending` until `PodAdded` / `PodRemoved`)."""
        self.pod_names: dict[str, str] = {}
        """'namespace/name' of every pod seen (removed pods included), by UID."""
        self._failures: dict[tuple[str, str], int] = {}
        self._subjects: dict[str, str] = {}
        self._tellers: dict[str, Callable[[Envelope], StoryLine]] = {
            "PodAdded": self._pod_added,
            "PodPending": self._pod_pending,
            "PodRemoved": self._pod_removed,
            "PodCleanedUp": self._pod_cleaned_up,
            "DesiredSizeChanged": self._size_wanted,
            "ObjectApplied": self._object_changed,
            "ObjectDeleted": self._object_changed,
            "OperationStarted": self._op_started,
            "OperationSucceeded": self._op_succeeded,
            "OperationFailed": self._op_failed,
            "VolumeConditionChanged": self._condition_changed,
            "VolumeUsageChanged": self._usage_changed,
        }
        for event in DEVICE_FSM.event_types():
            self._tellers[event] = self._device_transition
        for event in PODVOL_FSM.event_types():
            self._tellers[event] = self._podvol_transition

    # ------------------------------------------------------------- folding

    def absorb(self, env: Envelope) -> None:
        """Fold one envelope without telling it (events before the window)."""
        body = env.body
        if isinstance(body, OperationFailed | OperationSucceeded):
            self._count_outcome(env.stream, body)
        elif isinstance(body, PodAdded | PodPending):
            self._learn_pod(body)
        if env.stream.startswith(POD_PREFIX):
            self.pending.apply(env)
        self.asw.apply(env)

    def tell(self, env: Envelope) -> StoryLine:
        """Fold one envelope and say what it means."""
        teller = self._tellers.get(env.type)
        if teller is not None:
            return teller(env)
        return self._other(env)

    def _other(self, env: Envelope) -> StoryLine:
        """An event on a stream it does not belong to (the validator's business): just named."""
        self.asw.apply(env)
        stream = env.stream
        return StoryLine(env.seq, env.ts, stream, env.type, self.subject(stream), env.type)

    # ------------------------------------------------------------- subjects

    def subject(self, stream: str) -> str:
        """Who a stream is about: 'device <id>', 'pod ns/name', 'ns/name:volume'."""
        found = self._subjects.get(stream)
        if found is not None:
            return found
        return self._new_subject(stream)

    def _new_subject(self, stream: str) -> str:
        if stream.startswith(DEVICE_PREFIX):
            text = "device " + stream[len(DEVICE_PREFIX) :]
        elif stream.startswith(PODVOL_PREFIX):
            uid, _, name = stream[len(PODVOL_PREFIX) :].partition("/")
            text = f"{self.pod_names.get(uid, 'pod ' + uid)}:{name}"
        elif stream.startswith(OBJECT_PREFIX):
            kind, _, rest = stream[len(OBJECT_PREFIX) :].partition("/")
            text = f"{kind.lower()} {rest}"
        elif stream.startswith(POD_PREFIX):
            uid = stream[len(POD_PREFIX) :]
            text = "pod " + self.pod_names.get(uid, uid)
        else:
            text = stream
        self._subjects[stream] = text
        return text

    def _learn_pod(self, body: PodAdded | PodPending) -> None:
        name = f"{body.namespace}/{body.name}"
        if self.pod_names.get(body.pod_uid) != name:
            self.pod_names[body.pod_uid] = name
            self._subjects.clear()

    # -------------------------------------------------------------- desired

    def _pod_added(self, env: Envelope) -> StoryLine:
        body = env.body
        assert isinstance(body, PodAdded)
        self._learn_pod(body)
        again = body.pod_uid in self.asw.desired_pods
        waited = self.pending.apply(env)
        self.asw.apply(env)
        vols = ", ".join(f"{v.name}={v.volume_id}" for v in body.volumes) or "none"
        verb = "updated" if again else "added"
        text = f"desired: pod {verb} (uid {body.pod_uid}); volumes: {vols}"
        if waited is not None and waited.outcome == RESOLVED:
            text += f"; no longer pending ({waited_text(waited)})"
        return StoryLine(env.seq, env.ts, env.stream, env.type, self.subject(env.stream), text)

    def _pod_pending(self, env: Envelope) -> StoryLine:
        body = env.body
        assert isinstance(body, PodPending)
        self._learn_pod(body)
        self.pending.apply(env)
        self.asw.apply(env)
        waits = waits_text(body.waiting)
        text = f"desired: pod pending (uid {body.pod_uid}), nothing mounted yet: {waits}"
        return StoryLine(env.seq, env.ts, env.stream, env.type, self.subject(env.stream), text)

    def _pod_removed(self, env: Envelope) -> StoryLine:
        body = env.body
        assert isinstance(body, PodRemoved)
        held = sorted(
            (name, state)
            for name, state in self._pod_volume_states(body.pod_uid)
            if state != UNMOUNTED
        )
        waited = self.pending.apply(env)
        self.asw.apply(env)
        if held:
            todo = ", ".join(f"{name} ({state})" for name, state in held)
            rest = f"unmount pending for {todo}"
        elif waited is not None and waited.outcome == DELETED:
            rest = f"deleted while pending ({waited_text(waited)}), nothing mounted"
        else:
            rest = "nothing mounted"
        text = f"desired: pod removed (uid {body.pod_uid}); {rest}"
        return StoryLine(env.seq, env.ts, env.stream, env.type, self.subject(env.stream), text)

    def _pod_volume_states(self, pod_uid: str) -> list[tuple[str, str]]:
        """(volume name, state) of the pod's volumes: the ones it asked for, looked up directly."""
        pod = self.asw.desired_pods.get(pod_uid)
        podvols = self.asw.podvols
        found = []
        for vol in pod.volumes if pod is not None else ():
            pv = podvols.get((pod_uid, vol.name))
            found.append((vol.name, pv.state if pv is not None else UNMOUNTED))
        return found

    def _pod_cleaned_up(self, env: Envelope) -> StoryLine:
        body = env.body
        assert isinstance(body, PodCleanedUp)
        self.asw.apply(env)
        forgot = ", ".join(body.volume_names) or "no volume entries"
        text = f"pod cleaned up: volumes unmounted, pod dir removed; forgets {forgot}"
        return StoryLine(env.seq, env.ts, env.stream, env.type, self.subject(env.stream), text)

    def _object_changed(self, env: Envelope) -> StoryLine:
        body = env.body
        assert isinstance(body, ObjectApplied | ObjectDeleted)
        self.asw.apply(env)
        text = object_text(body)
        return StoryLine(env.seq, env.ts, env.stream, env.type, self.subject(env.stream), text)

    def _size_wanted(self, env: Envelope) -> StoryLine:
        body = env.body
        assert isinstance(body, DesiredSizeChanged)
        dev = self.asw.devices.get(body.volume_id)
        self.asw.apply(env)
        has = f" (device has {size_text(dev.size_bytes)})" if dev is not None else ""
        text = f"desired: volume {body.volume_id} should be {size_text(body.size_bytes)}{has}"
        return StoryLine(env.seq, env.ts, env.stream, env.type, self.subject(env.stream), text)

    # ----------------------------------------------------------- operations

    def _count_outcome(self, stream: str, body: OperationFailed | OperationSucceeded) -> None:
        key = (stream, body.operation)
        if isinstance(body, OperationFailed):
            self._failures[key] = self._failures.get(key, 0) + 1
        else:
            self._failures.pop(key, None)

    def _op_started(self, env: Envelope) -> StoryLine:
        body = env.body
        assert isinstance(body, OperationStarted)
        stream = env.stream
        dev = self.asw.devices.get(body.volume_id)
        plugin = body.plugin or (dev.plugin if dev is not None else "")
        calls = driver_calls(body.operation, plugin, dev.state if dev is not None else "")
        attempt = self._failures.get((stream, body.operation), 0) + 1
        self.asw.apply(env)
        detail = f"op {body.op_id}, attempt {attempt}" if attempt > 1 else f"op {body.op_id}"
        text = f"{body.operation} started ({detail})"
        if body.reason:
            text += f": {body.reason}"
        if calls:
            text += f"; calls {' -> '.join(calls)} via {plugin}"
        facts = OperationFacts(body.operation, body.op_id, body.reason or None, calls, attempt)
        subject = self._subjects.get(stream) or self._new_subject(stream)
        return StoryLine(env.seq, env.ts, stream, env.type, subject, text, op=facts)

    def _op_succeeded(self, env: Envelope) -> StoryLine:
        body = env.body
        assert isinstance(body, OperationSucceeded)
        stream = env.stream
        self._failures.pop((stream, body.operation), None)
        self.asw.apply(env)
        took = duration_text(round(body.duration_s * 1_000_000))
        text = f"{body.operation} succeeded in {took} (op {body.op_id})"
        subject = self._subjects.get(stream) or self._new_subject(stream)
        facts = OperationFacts(body.operation, body.op_id)
        return StoryLine(env.seq, env.ts, stream, env.type, subject, text, op=facts)

    def _op_failed(self, env: Envelope) -> StoryLine:
        body = env.body
        assert isinstance(body, OperationFailed)
        stream = env.stream
        self._count_outcome(stream, body)
        self.asw.apply(env)
        retry_at = env.ts + round(body.backoff_s * 1_000_000)
        took = duration_text(round(body.duration_s * 1_000_000))
        kind = "final" if body.final else "non-final"
        text = (
            f"{body.operation} failed after {took} (op {body.op_id}): {body.code}: "
            f"{body.message} ({kind}); backoff {seconds_text(body.backoff_s)} "
            f"until {iso_time(retry_at)}"
        )
        facts = OperationFacts(
            operation=body.operation,
            op_id=body.op_id,
            code=body.code,
            message=body.message,
            final=body.final,
            backoff_s=body.backoff_s,
            retry_at_us=retry_at,
        )
        subject = self._subjects.get(stream) or self._new_subject(stream)
        return StoryLine(env.seq, env.ts, stream, env.type, subject, text, op=facts)

    # --------------------------------------------------------- observations

    def _condition_changed(self, env: Envelope) -> StoryLine:
        body = env.body
        assert isinstance(body, VolumeConditionChanged)
        self.asw.apply(env)
        if body.abnormal:
            text = f"volume condition abnormal: {body.message or 'no message'}"
        else:
            text = "volume condition normal again"
        return StoryLine(env.seq, env.ts, env.stream, env.type, self.subject(env.stream), text)

    def _usage_changed(self, env: Envelope) -> StoryLine:
        body = env.body
        assert isinstance(body, VolumeUsageChanged)
        self.asw.apply(env)
        text = f"usage {usage_text(body)} (claim {body.namespace}/{body.claim}, {body.source})"
        return StoryLine(env.seq, env.ts, env.stream, env.type, self.subject(env.stream), text)

    # ---------------------------------------------------------- transitions

    def _device_transition(self, env: Envelope) -> StoryLine:
        if not env.stream.startswith(DEVICE_PREFIX):
            return self._other(env)
        volume_id = env.stream[len(DEVICE_PREFIX) :]
        dev = self.asw.devices.get(volume_id)
        before = dev.state if dev is not None else DEVICE_FSM.initial
        old_size = dev.size_bytes if dev is not None else None
        self.asw.apply(env)
        after_dev = self.asw.devices.get(volume_id)
        after = after_dev.state if after_dev is not None else DEVICE_FSM.initial
        body = env.body
        if isinstance(body, DeviceAttached):
            how = "attachable" if body.attachable else "not attachable"
            where = f", device {body.device_path}" if body.device_path else ""
            detail = f"plugin {body.plugin}, {how}{where}"
        elif isinstance(body, DeviceMounted):
            detail = f"staged at {body.device_mount_path}" if body.device_mount_path else "staged"
            if body.mount_found is False:
                detail += " (but no mount found there)"
        elif isinstance(body, DeviceMountUncertain):
            detail = body.reason + (" (reconstructed)" if body.reconstructed else "")
        elif isinstance(body, DeviceUnmounted):
            detail = body.reason or "not staged"
        elif isinstance(body, VolumeResized):
            was = "first recorded" if old_size is None else f"was {size_text(old_size)}"
            detail = f"size {size_text(body.size_bytes)} ({was})"
        elif env.type == "DeviceDetached":
            detail = "no longer on this node"
        else:
            detail = env.type
        return self._transition_line(env, before, after, detail)

    def _podvol_transition(self, env: Envelope) -> StoryLine:
        if not env.stream.startswith(PODVOL_PREFIX):
            return self._other(env)
        uid, _, name = env.stream[len(PODVOL_PREFIX) :].partition("/")
        pv = self.asw.podvols.get((uid, name))
        before = pv.state if pv is not None else PODVOL_FSM.initial
        self.asw.apply(env)
        after = self.asw.podvols[(uid, name)].state
        body = env.body
        if isinstance(body, VolumeMounted):
            detail = f"mounted at {body.mount_path}" if body.mount_path else "mounted"
            if body.mount_found is False:
                detail += " (but no mount found there)"
            if body.contents:
                detail += f"; files {body.contents}"  # which object versions, never a value
        elif isinstance(body, VolumeMountUncertain):
            detail = body.reason + (" (reconstructed)" if body.reconstructed else "")
        elif isinstance(body, VolumeUnmounted):
            detail = body.reason or "unmounted"
        else:
            detail = env.type
        return self._transition_line(env, before, after, detail)

    def _transition_line(self, env: Envelope, before: str, after: str, detail: str) -> StoryLine:
        moved = f"{before} -> {after}" if before != after else f"stays {after}"
        stream = env.stream
        subject = self._subjects.get(stream) or self._new_subject(stream)
        return StoryLine(
            env.seq, env.ts, stream, env.type, subject, f"{moved}: {detail}", before, after
        )

    # -------------------------------------------------------------- summary

    def summary(self) -> StateSummary:
        """The state the story ends in."""
        asw = self.asw
        desired = asw.desired_pods
        entries = [self._device_entry(dev) for dev in sorted(asw.devices.values(), key=_volume_key)]
        podvols = [
            pv for pv in asw.podvols.values() if pv.state != UNMOUNTED or pv.pod_uid in desired
        ]
        pv_entries = [self._podvol_entry(pv) for pv in podvols]
        entries.extend(sorted(pv_entries, key=lambda e: (e.subject, e.stream)))
        return StateSummary(
            seq=asw.last_seq,
            ts=asw.last_ts,
            devices=_count((d.state for d in asw.devices.values()), DEVICE_FSM.states),
            pod_volumes=_count((p.state for p in asw.podvols.values()), PODVOL_FSM.states),
            desired_pods=sorted(f"{p.namespace}/{p.name}" for p in desired.values()),
            entries=entries,
        )

    def _device_entry(self, dev: DeviceState) -> EntrySummary:
        stream = DEVICE_PREFIX + dev.volume_id
        return _entry("device", stream, self.subject(stream), dev)

    def _podvol_entry(self, pv: PodVolumeState) -> EntrySummary:
        stream = f"{PODVOL_PREFIX}{pv.pod_uid}/{pv.volume_name}"
        return _entry("podvol", stream, self.subject(stream), pv)


def _volume_key(dev: DeviceState) -> str:
    return dev.volume_id


def _entry(
    kind: str, stream: str, subject: str, entry: DeviceState | PodVolumeState
) -> EntrySummary:
    op = entry.last_operation
    return EntrySummary(
        kind=kind,
        stream=stream,
        subject=subject,
        state=entry.state,
        since_us=entry.since_us,
        reason=entry.reason,
        reconstructed=entry.reconstructed,
        last_operation=describe_attempt(op, limit=ERROR_MESSAGE_LIMIT),
        retry_at_us=op.retry_at_us if op is not None else None,
    )


def summary_lines(summary: StateSummary) -> list[str]:
    """The summary as indented text lines (the end of `volfsm replay`)."""

    def counts(c: dict[str, int]) -> str:
        inner = ", ".join(f"{state} {n}" for state, n in c.items())
        return f"{sum(c.values())}" + (f" ({inner})" if inner else "")

    as_of = f"seq {summary.seq}, {iso_time(summary.ts)}" if summary.seq else "no events"
    lines = [
        f"state at the end ({as_of}):",
        f"  devices: {counts(summary.devices)}",
        f"  pod volumes: {counts(summary.pod_volumes)}",
        f"  desired pods: {len(summary.desired_pods)}"
        + (f" ({', '.join(summary.desired_pods)})" if summary.desired_pods else ""),
    ]
    for e in summary.entries:
        text = f"  {e.subject}: {e.state} since {iso_time(e.since_us)}"
        if e.reconstructed:
            text += " (reconstructed)"
        if e.reason:
            text += f": {e.reason}"
        if e.last_operation:
            text += f"; last op {e.last_operation}"
        if e.retry_at_us is not None:
            text += f"; retry allowed at {iso_time(e.retry_at_us)}"
        lines.append(text)
    return lines

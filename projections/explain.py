"""Why a pod's volumes are, or are not, mounted at a moment of the log.

`explain_pod` folds the log (already cut at the moment asked about) into
the ASW, the recent operation attempts of every device and pod-volume
stream, and the pods' desired-state history. For each volume of the pod it
then says: the pod-volume and device states and why, the last operations
and errors, whether a backoff holds the next attempt back (and until
when, relative to the moment), and what the reconciler is waiting for.

The reconciler's rules it follows (kubelet's, reference §1-§3): a desired
volume that is not Mounted gets a mount operation, which stages the device
first unless it is DeviceGloballyMounted; an Uncertain pod-volume is
re-published by the next mount; a volume no pod wants is unmounted, then
its device unstaged once no pod holds it, then detached; a failed
operation is not retried before its backoff ends (a *different* operation
on the same volume is not held back by it).

Imports only `events` (and the story's text helpers).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from events.streams import DEVICE_PREFIX, PODVOL_PREFIX
from events.tables import ATTACHED, GLOBALLY_MOUNTED, MOUNTED, UNCERTAIN, UNMOUNTED
from events.types import (
    DesiredVolume,
    Envelope,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PendingVolume,
    PodAdded,
    PodPending,
    PodRemoved,
)
from projections.asw import Asw, DeviceState, PodVolumeState
from projections.story import EMPTY_DIR_PLUGIN
from projections.textfmt import (
    attempt_text,
    duration_text,
    iso_time,
    relative_text,
    size_text,
)

RECENT_ATTEMPTS = 5
"""How many of a stream's latest operation attempts are kept and shown."""

MOUNT_OPS = frozenset({"volume_mount", "map_volume"})
UNMOUNT_OPS = frozenset({"volume_unmount", "unmap_volume"})
STAGE_OPS = frozenset({"mount_device"})
UNSTAGE_OPS = frozenset({"unmount_device", "unmap_device"})
EXPAND_OPS = frozenset({"volume_fs_resize", "expand_volume", "expand_in_use_volume"})

MOUNTED_VERDICT = "mounted"
NOT_MOUNTED_VERDICT = "not mounted"
UNCERTAIN_VERDICT = "uncertain"


class PodNotFoundError(LookupError):
    """No pod of that UID or namespace/name appears in the log up to the moment asked."""


@dataclass(slots=True)
class Attempt:
    """One operation attempt: when it started and why, how it ended, its backoff."""

    seq: int
    stream: str
    op_id: str
    operation: str
    started_us: int
    reason: str = ""
    status: str = "running"
    ended_us: int | None = None
    code: str = ""
    message: str = ""
    final: bool | None = None
    backoff_s: float = 0.0
    duration_s: float | None = None

    @property
    def retry_at_us(self) -> int | None:
        """When the next attempt of this operation is allowed (failed attempts only)."""
        if self.status != "failed" or self.ended_us is None:
            return None
        return self.ended_us + round(self.backoff_s * 1_000_000)


@dataclass(slots=True)
class PodRecord:
    """A pod as the desired-state events tell it."""

    pod_uid: str
    namespace: str
    name: str
    added_seq: int
    added_us: int
    volumes: tuple[DesiredVolume, ...]
    removed_us: int | None = None
    waiting: tuple[PendingVolume, ...] = ()
    """A pending pod's volumes and what each waits for (empty once it is added)."""


@dataclass(slots=True)
class Backoff:
    """A failed operation whose backoff has not ended at the moment asked about."""

    operation: str
    stream: str
    code: str
    final: bool
    failed_us: int
    retry_at_us: int
    backoff_s: float


@dataclass(slots=True)
class EntryStatus:
    """A pod-volume or device state at the moment, and why it is in it."""

    state: str
    since_us: int | None
    reason: str = ""
    reconstructed: bool = False


@dataclass(slots=True)
class VolumeExplanation:
    """One volume of the pod: states, recent operations, backoff, what is awaited."""

    name: str
    volume_id: str
    plugin: str
    verdict: str
    pod_volume: EntryStatus
    device: EntryStatus
    operations: list[Attempt] = field(default_factory=list)
    backoff: Backoff | None = None
    waiting_for: list[str] = field(default_factory=list)
    condition: str = ""
    """The driver's abnormal volume condition at the moment ("" when normal or unknown)."""
    capacity_bytes: int = 0
    """Capacity at the last recorded usage step (0: none recorded while mounted)."""
    used_bytes: int = 0


@dataclass(slots=True)
class PodExplanation:
    """The answer to "why are this pod's volumes (not) mounted?" at `at_us`."""

    pod_uid: str
    namespace: str
    name: str
    desired: bool
    added_us: int
    removed_us: int | None
    at_us: int
    as_of_seq: int
    volumes: list[VolumeExplanation] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    """A pending pod: each waiting volume and the object it waits for (nothing is mounted
    for it until every volume resolves: a `PodAdded` then follows)."""

    def counts(self) -> dict[str, int]:
        """How many volumes have each verdict."""
        out = dict.fromkeys((MOUNTED_VERDICT, UNCERTAIN_VERDICT, NOT_MOUNTED_VERDICT), 0)
        for v in self.volumes:
            out[v.verdict] += 1
        return out


# ---------------------------------------------------------------------- fold


class ExplainFold:
    """The ASW, each stream's recent attempts and every pod's desired history."""

    def __init__(self) -> None:
        self.asw = Asw()
        self.attempts: dict[str, deque[Attempt]] = {}
        self.pods: dict[str, PodRecord] = {}

    def apply(self, env: Envelope) -> None:
        """Fold one envelope (in `seq` order)."""
        body = env.body
        if isinstance(body, OperationStarted):
            recent = self.attempts.get(env.stream)
            if recent is None:
                recent = self.attempts[env.stream] = deque(maxlen=RECENT_ATTEMPTS)
            recent.append(
                Attempt(
                    seq=env.seq,
                    stream=env.stream,
                    op_id=body.op_id,
                    operation=body.operation,
                    started_us=env.ts,
                    reason=body.reason,
                )
            )
        elif isinstance(body, OperationSucceeded | OperationFailed):
            self._finish(env, body)
        elif isinstance(body, PodAdded):
            self.pods[body.pod_uid] = PodRecord(
                body.pod_uid, body.namespace, body.name, env.seq, env.ts, body.volumes
            )
        elif isinstance(body, PodPending):
            known = self.pods.get(body.pod_uid)
            if known is None or known.removed_us is not None:
                known = self.pods[body.pod_uid] = PodRecord(
                    body.pod_uid, body.namespace, body.name, env.seq, env.ts, ()
                )
            known.waiting = body.waiting
        elif isinstance(body, PodRemoved) and body.pod_uid in self.pods:
            self.pods[body.pod_uid].removed_us = env.ts
        self.asw.apply(env)

    def _finish(self, env: Envelope, body: OperationSucceeded | OperationFailed) -> None:
        recent = self.attempts.get(env.stream)
        attempt = next((a for a in reversed(recent or ()) if a.op_id == body.op_id), None)
        if attempt is None:  # an outcome whose start is not in the log: keep what it says
            if recent is None:
                recent = self.attempts[env.stream] = deque(maxlen=RECENT_ATTEMPTS)
            attempt = Attempt(env.seq, env.stream, body.op_id, body.operation, env.ts)
            recent.append(attempt)
        attempt.ended_us = env.ts
        attempt.duration_s = body.duration_s
        if isinstance(body, OperationSucceeded):
            attempt.status = "succeeded"
            return
        attempt.status = "failed"
        attempt.code = body.code
        attempt.message = body.message
        attempt.final = body.final
        attempt.backoff_s = body.backoff_s

    def find_pod(self, ref: str) -> PodRecord:
        """The pod with UID `ref`, or the latest pod named `ref` ('namespace/name')."""
        if ref in self.pods:
            return self.pods[ref]
        matches = [p for p in self.pods.values() if f"{p.namespace}/{p.name}" == ref]
        if not matches:
            raise PodNotFoundError(ref)
        return max(matches, key=lambda p: p.added_seq)


# ------------------------------------------------------------------- explain


def _last(attempts: Iterable[Attempt], operations: frozenset[str]) -> Attempt | None:
    found = None
    for a in attempts:
        if a.operation in operations:
            found = a
    return found


def _backoff(attempt: Attempt | None, at_us: int) -> Backoff | None:
    if attempt is None or attempt.status != "failed":
        return None
    retry_at = attempt.retry_at_us
    if retry_at is None or retry_at <= at_us:
        return None
    assert attempt.ended_us is not None
    return Backoff(
        operation=attempt.operation,
        stream=attempt.stream,
        code=attempt.code,
        final=bool(attempt.final),
        failed_us=attempt.ended_us,
        retry_at_us=retry_at,
        backoff_s=attempt.backoff_s,
    )


def _stages(plugin: str) -> bool:
    """Whether the plugin stages a device before publishing: CSI and others do, emptyDir not."""
    return not plugin.startswith(EMPTY_DIR_PLUGIN)


@dataclass(slots=True)
class _Context:
    """What the rules look at for one volume."""

    at_us: int
    desired: bool
    pv: PodVolumeState | None
    dev: DeviceState | None
    pv_ops: list[Attempt]
    dev_ops: list[Attempt]
    plugin: str
    volume_id: str
    want_size: int | None
    holders: int

    @property
    def pv_state(self) -> str:
        return self.pv.state if self.pv is not None else UNMOUNTED

    @property
    def dev_state(self) -> str:
        return self.dev.state if self.dev is not None else "Detached"


def _running(attempt: Attempt | None, at_us: int) -> str | None:
    if attempt is None or attempt.status != "running":
        return None
    return (
        f"{attempt.operation} to finish (running since {iso_time(attempt.started_us)}, "
        f"{duration_text(max(0, at_us - attempt.started_us))})"
    )


def _in_backoff(b: Backoff, at_us: int, then: str) -> str:
    kind = "final" if b.final else "non-final"
    return (
        f"backoff after {b.code} ({kind}) on {b.operation} to end at {iso_time(b.retry_at_us)} "
        f"({relative_text(b.retry_at_us, at_us)}); then {then}"
    )


def _waiting_desired(c: _Context) -> tuple[list[str], Backoff | None]:
    """What a desired volume waits for."""
    if c.pv_state == MOUNTED:
        return _waiting_mounted(c)
    mount = _last(c.pv_ops, MOUNT_OPS)
    stage = _last(c.dev_ops, STAGE_OPS)
    op_name = mount.operation if mount is not None else "volume_mount"
    backoff = _backoff(mount, c.at_us) or _backoff(stage, c.at_us)
    main = _running(mount, c.at_us) or _running(stage, c.at_us)
    if main is None and backoff is not None:
        main = _in_backoff(backoff, c.at_us, f"{backoff.operation} again")
    if main is None:
        why = (
            "desired and Uncertain: remount"
            if c.pv_state == UNCERTAIN
            else "desired and not mounted"
        )
        main = f"the reconciler to start {op_name} ({why})"
        if mount is not None and mount.status == "failed" and mount.retry_at_us is not None:
            main += f"; retry allowed since {iso_time(mount.retry_at_us)}"
    out = [main]
    if _stages(c.plugin) and c.dev_state != GLOBALLY_MOUNTED:
        if c.dev_state == UNCERTAIN:
            why = c.dev.reason if c.dev is not None else ""
            out.append(
                f"device stage to succeed: the device is Uncertain ({why}); "
                "the next mount stages it again (NodeStageVolume)"
            )
        else:
            out.append(f"device stage to succeed (the device is {c.dev_state})")
    if c.pv_state == UNCERTAIN:
        out.append("Uncertain: next mount attempt will re-publish")
    out.extend(_reconstructed_notes(c))
    last_error = next((a for a in reversed(c.pv_ops) if a.status == "failed"), None)
    if (
        last_error is not None
        and last_error.final
        and mount is not None
        and mount.status != "succeeded"
    ):
        out.append(
            f"the last error is final ({last_error.code}: {last_error.message}): "
            "retries go on with a growing backoff until the cause is fixed"
        )
    return out, backoff


def _reconstructed_notes(c: _Context) -> list[str]:
    """Kubelet's exception: a final error does not clear an entry found by reconstruction."""
    notes = []
    if c.pv is not None and c.pv.reconstructed and c.pv_state == UNCERTAIN:
        notes.append(
            "the pod volume was reconstructed after a restart: it stays Uncertain until a "
            "mount or unmount succeeds (a final error does not clear it)"
        )
    if c.dev is not None and c.dev.reconstructed and c.dev_state == UNCERTAIN:
        notes.append(
            "the device was reconstructed after a restart: it stays Uncertain until a "
            "stage or unstage succeeds (a final error does not clear it)"
        )
    return notes


def _waiting_mounted(c: _Context) -> tuple[list[str], Backoff | None]:
    dev_size = c.dev.size_bytes if c.dev is not None else None
    if c.want_size is not None and dev_size is not None and c.want_size > dev_size:
        expand = _last(c.dev_ops, EXPAND_OPS) or _last(c.pv_ops, EXPAND_OPS)
        backoff = _backoff(expand, c.at_us)
        grow = (
            f"online expansion to {size_text(c.want_size)} (the device has {size_text(dev_size)})"
        )
        detail = _running(expand, c.at_us)
        if detail is None and backoff is not None:
            detail = _in_backoff(backoff, c.at_us, "expansion again")
        return [grow + (f": {detail}" if detail else "")], backoff
    since = iso_time(c.pv.since_us) if c.pv is not None else ""
    return [f"nothing: mounted since {since}"], None


def _waiting_removed(c: _Context) -> tuple[list[str], Backoff | None]:
    """What a volume of a pod that is no longer desired waits for."""
    if c.pv_state in (MOUNTED, UNCERTAIN):
        unmount = _last(c.pv_ops, UNMOUNT_OPS)
        backoff = _backoff(unmount, c.at_us)
        detail = _running(unmount, c.at_us)
        if detail is None and backoff is not None:
            detail = _in_backoff(backoff, c.at_us, f"{backoff.operation} again")
        if detail is None:
            detail = "the reconciler to start volume_unmount"
        out = [f"pod removed: unmount pending; waiting for {detail}"]
        out.extend(_reconstructed_notes(c))
        other = _backoff(_last(c.pv_ops, MOUNT_OPS), c.at_us)
        if other is not None and backoff is None:
            out.append(
                f"the {other.operation} backoff (until {iso_time(other.retry_at_us)}) does not "
                "hold back volume_unmount: a different operation"
            )
        return out, backoff
    out = ["nothing for this pod: the volume is unmounted"]
    if c.dev is None:
        out.append("the device is detached from this node")
        return out, None
    if c.dev_state in (GLOBALLY_MOUNTED, UNCERTAIN):
        if c.holders:
            out.append(f"the device stays staged: {c.holders} other pod volume(s) hold it")
            return out, None
        unstage = _last(c.dev_ops, UNSTAGE_OPS)
        backoff = _backoff(unstage, c.at_us)
        detail = _running(unstage, c.at_us)
        if detail is None and backoff is not None:
            detail = _in_backoff(backoff, c.at_us, f"{backoff.operation} again")
        out.append("device unstage pending" + (f": waiting for {detail}" if detail else ""))
        return out, backoff
    if c.dev_state == ATTACHED and not c.holders:
        out.append("the device is Attached: detach pending")
    return out, None


def _verdict(state: str) -> str:
    if state == MOUNTED:
        return MOUNTED_VERDICT
    if state == UNCERTAIN:
        return UNCERTAIN_VERDICT
    return NOT_MOUNTED_VERDICT


def _status(entry: DeviceState | PodVolumeState | None, absent: str) -> EntryStatus:
    if entry is None:
        return EntryStatus(state=absent, since_us=None)
    return EntryStatus(entry.state, entry.since_us, entry.reason, entry.reconstructed)


def _explain_volume(
    fold: ExplainFold, pod: PodRecord, name: str, dv: DesiredVolume | None, at_us: int
) -> VolumeExplanation:
    asw = fold.asw
    pv = asw.podvols.get((pod.pod_uid, name))
    volume_id = dv.volume_id if dv is not None else (pv.volume_id if pv is not None else "")
    dev = asw.devices.get(volume_id)
    pv_ops = list(fold.attempts.get(f"{PODVOL_PREFIX}{pod.pod_uid}/{name}", ()))
    dev_ops = list(fold.attempts.get(DEVICE_PREFIX + volume_id, ()))
    plugin = dev.plugin if dev is not None and dev.plugin else ""
    if not plugin and dv is not None:
        src = dv.source
        plugin = f"{src.plugin}:{src.driver}" if src.driver else src.plugin
    holders = sum(
        1
        for other in asw.mounted_pods_on(volume_id)
        if (other.pod_uid, other.volume_name) != (pod.pod_uid, name)
    )
    desired = pod.pod_uid in asw.desired_pods and dv is not None
    ctx = _Context(
        at_us=at_us,
        desired=desired,
        pv=pv,
        dev=dev,
        pv_ops=pv_ops,
        dev_ops=dev_ops,
        plugin=plugin,
        volume_id=volume_id,
        want_size=asw.desired_sizes.get(volume_id),
        holders=holders,
    )
    waiting, backoff = _waiting_desired(ctx) if desired else _waiting_removed(ctx)
    operations = sorted(pv_ops + dev_ops, key=lambda a: a.seq)[-RECENT_ATTEMPTS:]
    return VolumeExplanation(
        name=name,
        volume_id=volume_id,
        plugin=plugin,
        verdict=_verdict(ctx.pv_state),
        pod_volume=_status(pv, UNMOUNTED),
        device=_status(dev, "Detached"),
        operations=operations,
        backoff=backoff,
        waiting_for=waiting,
        condition=(pv.condition or "abnormal") if pv is not None and pv.abnormal else "",
        capacity_bytes=pv.capacity_bytes if pv is not None else 0,
        used_bytes=pv.used_bytes if pv is not None else 0,
    )


def explain_pod(
    envelopes: Iterable[Envelope], ref: str, at_us: int | None = None
) -> PodExplanation:
    """Explain pod `ref` (UID or 'namespace/name') after folding `envelopes`.

    `envelopes` is the log up to the moment asked about, in `seq` order;
    `at_us` is that moment (default: the last event's time), against which
    backoffs and running operations are measured. Raises `PodNotFoundError`.
    """
    fold = ExplainFold()
    for env in envelopes:
        fold.apply(env)
    return explain_folded(fold, ref, at_us)


def explain_folded(fold: ExplainFold, ref: str, at_us: int | None = None) -> PodExplanation:
    """`explain_pod` on a fold already done."""
    pod = fold.find_pod(ref)
    at = at_us if at_us is not None else fold.asw.last_ts
    specs = {dv.name: dv for dv in pod.volumes}
    names = list(specs)
    names += sorted(
        pv.volume_name for pv in fold.asw.pod_volumes(pod.pod_uid) if pv.volume_name not in specs
    )
    pending = bool(pod.waiting) and pod.removed_us is None
    return PodExplanation(
        pod_uid=pod.pod_uid,
        namespace=pod.namespace,
        name=pod.name,
        desired=pending or pod.pod_uid in fold.asw.desired_pods,
        added_us=pod.added_us,
        removed_us=pod.removed_us,
        at_us=at,
        as_of_seq=fold.asw.last_seq,
        volumes=[_explain_volume(fold, pod, n, specs.get(n), at) for n in names],
        waiting=[f"volume {w.name}: {w.text}" for w in pod.waiting] if pending else [],
    )


def describe_attempt(a: Attempt) -> str:
    """'volume_mount failed in 0.5s: DeadlineExceeded: ... (non-final, backoff 0.5s)'."""
    took = round(a.duration_s * 1_000_000) if a.duration_s is not None else None
    failure = (a.code, a.message, a.final, a.backoff_s) if a.status == "failed" else None
    return attempt_text(a.operation, a.status, took, failure)

"""Planning an apply: validate a whole batch, then work out the desired-state events.

Planning is pure: it reads the desired state through `DesiredView` and
returns an `ApplyPlan`; nothing changes until the caller records the plan's
events (and the DSW observes them) and commits its objects. The whole batch
is checked before anything is planned, so an apply is all-or-nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from events.streams import pod_stream
from events.types import Body, DesiredSizeChanged, PodAdded, PodRemoved
from volfsm.desired.errors import InvalidObjectError
from volfsm.desired.objects import (
    KubeObject,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    decode_object,
)
from volfsm.desired.quantity import format_bytes
from volfsm.desired.resolve import (
    CanServe,
    added_fingerprint,
    claim_binding_problem,
    pv_source,
    pv_volume_id,
    resolve_pod,
    spec_fingerprint,
)
from volfsm.desired.validate import (
    check_pod_node,
    pv_size_bytes,
    validate_pod,
    validate_pv,
    validate_pvc,
)

_T = TypeVar("_T")


@dataclass(frozen=True)
class DesiredChange:
    """One desired-state event to record: `body` appended to `stream` (always a pod stream)."""

    stream: str
    body: Body


@dataclass(frozen=True)
class ApplyResult:
    """What an apply does to one object: created, unchanged, configured or replaced."""

    kind: str
    namespace: str
    name: str
    action: str

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind.lower()}/{where} {self.action}"


@dataclass(frozen=True)
class ApplyPlan:
    """The events an apply records, the PV/PVC objects to remember, and a per-object result."""

    changes: list[DesiredChange] = field(default_factory=list)
    pvs: dict[str, PersistentVolume] = field(default_factory=dict)
    pvcs: dict[tuple[str, str], PersistentVolumeClaim] = field(default_factory=dict)
    results: list[ApplyResult] = field(default_factory=list)


class DesiredView(Protocol):
    """What planning reads from the desired state of world."""

    pods: dict[str, PodAdded]

    def pod_by_name(self, namespace: str, name: str) -> PodAdded | None:
        """The pod namespace/name, or None."""

    def desired_size(self, volume_id: str) -> int | None:
        """The size pods want of a volume, or None."""

    def pods_on_volume(self, volume_id: str) -> list[str]:
        """UIDs of the pods that want a volume."""

    def persistent_volume(self, name: str) -> PersistentVolume | None:
        """A PV remembered from an earlier apply."""

    def claim(self, namespace: str, name: str) -> PersistentVolumeClaim | None:
        """A PVC remembered from an earlier apply."""


def flatten(objects: Sequence[Mapping[str, Any]]) -> list[tuple[str, object]]:
    """(where, raw object) for each object, the items of a `kind: List` spread out."""
    flat: list[tuple[str, object]] = []
    for index, raw in enumerate(objects):
        where = f"objects[{index}]"
        if isinstance(raw, Mapping) and raw.get("kind") == "List":
            items = raw.get("items") or []
            if not isinstance(items, list):
                raise InvalidObjectError("items", "a List's items must be a list", where)
            flat.extend((f"{where}.items[{i}]", item) for i, item in enumerate(items))
        else:
            flat.append((where, raw))
    return flat


class _Batch:
    """The objects of one apply, deduplicated, looked up before remembered ones."""

    def __init__(self, view: DesiredView) -> None:
        self.view = view
        self.pvs: dict[str, PersistentVolume] = {}
        self.pvcs: dict[tuple[str, str], PersistentVolumeClaim] = {}
        self.pods: dict[str, Pod] = {}
        self.pod_names: dict[tuple[str, str], str] = {}
        self.objects: list[KubeObject] = []
        self.where: dict[int, str] = {}

    # ObjectLookup
    def claim(self, namespace: str, name: str) -> PersistentVolumeClaim | None:
        found = self.pvcs.get((namespace, name))
        return found if found is not None else self.view.claim(namespace, name)

    def volume(self, name: str) -> PersistentVolume | None:
        found = self.pvs.get(name)
        return found if found is not None else self.view.persistent_volume(name)

    def add(self, where: str, obj: KubeObject) -> None:
        """Take one decoded object; an identical repeat is dropped, a different one rejected."""
        if isinstance(obj, PersistentVolume):
            self._add_unique(self.pvs, obj.metadata.name, obj, where)
        elif isinstance(obj, PersistentVolumeClaim):
            self._add_unique(self.pvcs, obj.key, obj, where)
        else:
            self._add_unique(self.pods, obj.metadata.uid, obj, where)
            key = (obj.metadata.ns, obj.metadata.name)
            other = self.pod_names.setdefault(key, obj.metadata.uid)
            if other != obj.metadata.uid:
                raise InvalidObjectError(
                    "metadata.uid",
                    f"this apply has two pods named {key[0]}/{key[1]} "
                    f"(uids {other} and {obj.metadata.uid})",
                    obj.label,
                )

    def _add_unique(self, into: dict[Any, Any], key: object, obj: KubeObject, where: str) -> None:
        previous = into.get(key)
        if previous is None:
            into[key] = obj
            self.objects.append(obj)
            self.where[id(obj)] = where
        elif previous != obj:
            field_ = "metadata.uid" if isinstance(obj, Pod) else "metadata.name"
            raise InvalidObjectError(
                field_,
                f"given twice in this apply with different contents "
                f"(also {self.where[id(previous)]})",
                obj.label,
            )


def plan_apply(
    objects: Sequence[Mapping[str, Any]],
    view: DesiredView,
    can_serve: CanServe,
    node_name: str = "",
) -> ApplyPlan:
    """Validate every object, then plan the events. Raises InvalidObjectError; pure.

    A pod whose spec.nodeName names another node than `node_name` is
    refused ("" accepts every pod). Changes come in this order: pods
    replaced by a new uid are removed, then volumes that grew get their
    DesiredSizeChanged, then new pods are added.
    """
    batch = _Batch(view)
    for where, raw in flatten(objects):
        obj = decode_object(raw, where)
        _attributed(obj, _validate_alone, obj, node_name)
        batch.add(where, obj)
    for pv in batch.pvs.values():
        _attributed(pv, _check_pv, pv, view, can_serve)
    for pvc in batch.pvcs.values():
        _attributed(pvc, _check_pvc, pvc, batch)
    actions: dict[int, str] = {}
    removals: list[DesiredChange] = []
    adds: list[DesiredChange] = []
    for pod in batch.pods.values():
        actions[id(pod)] = _attributed(pod, _plan_pod, pod, batch, can_serve, removals, adds)
    removed = {change.body.pod_uid for change in removals if isinstance(change.body, PodRemoved)}
    resizes: list[DesiredChange] = []
    for pv in batch.pvs.values():
        actions[id(pv)] = _plan_pv(pv, view, removed, resizes)
    for pvc in batch.pvcs.values():
        actions[id(pvc)] = _action(view.claim(*pvc.key), pvc)
    results = [_result(obj, actions[id(obj)]) for obj in batch.objects]
    return ApplyPlan(
        changes=removals + resizes + adds,
        pvs=dict(batch.pvs),
        pvcs=dict(batch.pvcs),
        results=results,
    )


def _attributed(obj: KubeObject, fn: Callable[..., _T], *args: Any) -> _T:
    """Run a check, naming `obj` in any error it raises."""
    try:
        return fn(*args)
    except InvalidObjectError as exc:
        raise exc.within(obj.label) from None


def _validate_alone(obj: KubeObject, node_name: str) -> None:
    if isinstance(obj, PersistentVolume):
        validate_pv(obj)
    elif isinstance(obj, PersistentVolumeClaim):
        validate_pvc(obj)
    else:
        validate_pod(obj)
        check_pod_node(obj, node_name)


def _action(old: KubeObject | None, new: KubeObject) -> str:
    return "created" if old is None else ("unchanged" if old == new else "configured")


def _result(obj: KubeObject, action: str) -> ApplyResult:
    namespace = "" if isinstance(obj, PersistentVolume) else obj.metadata.ns
    return ApplyResult(obj.kind, namespace, obj.metadata.name, action)


def _check_pv(pv: PersistentVolume, view: DesiredView, can_serve: CanServe) -> None:
    csi = pv.spec.csi
    assert csi is not None
    old = view.persistent_volume(pv.metadata.name)
    size = pv_size_bytes(pv)
    if old is not None and old.spec.csi is not None:
        if _immutable_csi(old) != _immutable_csi(pv):
            raise InvalidObjectError("spec.csi", "is immutable after creation")
        if old.spec.volume_mode != pv.spec.volume_mode:
            raise InvalidObjectError(
                "spec.volumeMode", f"is immutable (was {old.spec.volume_mode})"
            )
        old_size = pv_size_bytes(old)
        if size < old_size:
            raise InvalidObjectError(
                "spec.capacity.storage",
                f"volumes do not shrink: {format_bytes(size)} < {format_bytes(old_size)}",
            )
    desired = view.desired_size(pv_volume_id(pv))
    if desired is not None and size < desired:
        raise InvalidObjectError(
            "spec.capacity.storage",
            f"volumes do not shrink: {format_bytes(size)} < {format_bytes(desired)} "
            "already desired by pods",
        )
    refused = can_serve(pv_source(pv), pv.spec.volume_mode)
    if refused is not None:
        raise InvalidObjectError(
            "spec.volumeMode", f"{refused} (driver {csi.driver}, volumeMode {pv.spec.volume_mode})"
        )


def _immutable_csi(pv: PersistentVolume) -> tuple[object, ...]:
    """The immutable part of a PV's CSI source (secret refs may change)."""
    csi = pv.spec.csi
    assert csi is not None
    return (csi.driver, csi.volume_handle, csi.fs_type, csi.volume_attributes, csi.read_only)


def _check_pvc(pvc: PersistentVolumeClaim, batch: _Batch) -> None:
    old = batch.view.claim(*pvc.key)
    if old is not None:
        if old.spec.volume_name and old.spec.volume_name != pvc.spec.volume_name:
            raise InvalidObjectError(
                "spec.volumeName", f"is immutable once bound (was {old.spec.volume_name})"
            )
        if old.spec.volume_mode != pvc.spec.volume_mode:
            raise InvalidObjectError(
                "spec.volumeMode", f"is immutable (was {old.spec.volume_mode})"
            )
    if pvc.spec.volume_name:
        pv = batch.volume(pvc.spec.volume_name)
        if pv is not None:
            problem_field, problem = claim_binding_problem(pvc, pv)
            if problem:
                raise InvalidObjectError(problem_field, problem)


def _plan_pod(
    pod: Pod,
    batch: _Batch,
    can_serve: CanServe,
    removals: list[DesiredChange],
    adds: list[DesiredChange],
) -> str:
    """Plan one pod; returns what happens to it."""
    meta = pod.metadata
    view = batch.view
    existing = view.pods.get(meta.uid)
    if existing is not None:
        if (existing.namespace, existing.name) != (meta.ns, meta.name):
            raise InvalidObjectError(
                "metadata.uid",
                f"uid {meta.uid} already belongs to pod {existing.namespace}/{existing.name}",
            )
        if added_fingerprint(existing) != spec_fingerprint(pod):
            raise InvalidObjectError(
                "spec.volumes",
                f"pods are immutable: pod {meta.ns}/{meta.name} (uid {meta.uid}) already "
                "exists with different volumes; delete it first or apply it with a new uid",
            )
        return "unchanged"
    added = resolve_pod(pod, batch, can_serve)
    old = view.pod_by_name(meta.ns, meta.name)
    adds.append(DesiredChange(pod_stream(meta.uid), added))
    if old is None:
        return "created"
    body = PodRemoved(pod_uid=old.pod_uid, namespace=old.namespace, name=old.name)
    removals.append(DesiredChange(pod_stream(old.pod_uid), body))
    return "replaced"


def _plan_pv(
    pv: PersistentVolume, view: DesiredView, removed: set[str], resizes: list[DesiredChange]
) -> str:
    """Expansion: a larger capacity while pods use the volume. Returns what happens to the PV.

    The DesiredSizeChanged goes on the stream of every pod using the volume:
    the log validator and the ASW take desired-state events from pod streams
    only, and each pod's history then shows why its volume was expanded.
    """
    old = view.persistent_volume(pv.metadata.name)
    action = _action(old, pv)
    volume_id = pv_volume_id(pv)
    size = pv_size_bytes(pv)
    desired = view.desired_size(volume_id)
    if desired is not None and size <= desired:
        return action
    users = [uid for uid in view.pods_on_volume(volume_id) if uid not in removed]
    if users:
        body = DesiredSizeChanged(volume_id=volume_id, size_bytes=size)
        resizes.extend(DesiredChange(pod_stream(uid), body) for uid in users)
        if old is not None:
            action = "configured"
    return action

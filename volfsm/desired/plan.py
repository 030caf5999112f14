"""Planning an apply: validate a whole batch, then work out the desired-state events.

Planning is pure: it reads the desired state through `DesiredView` (and the
node's object store through `StoredLookup`) and returns an `ApplyPlan`;
nothing changes until the caller stores the plan's objects, records its
events (and the DSW observes them) and commits its objects. The whole batch
is checked before anything is planned, so an apply is all-or-nothing, and
every problem of every object is reported at once.

What planning does as an API server would: a Pod without `metadata.uid`
gets one (the uid of the pod of that namespace/name while it exists, else
a new uuid4); so does any other object (the stored one's uid, else a new
one); `metadata.namespace` missing is "default"; a Secret's `stringData`
is merged into `data`; with an `Admission`, a new pod gets the ServiceAccount
admission plugin's token volume and its namespace a kube-root-ca.crt
ConfigMap if it has none (`volfsm.desired.admission`). Objects of kinds a
node does not run (Deployment, Service, ...) are not applied: they are
listed in `ApplyPlan.skipped`.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from events.streams import pod_stream
from events.types import (
    Body,
    DesiredSizeChanged,
    PendingVolume,
    PodAdded,
    PodPending,
    PodRemoved,
)
from volfsm.desired.admission import (
    ROOT_CA_CONFIG_MAP,
    ROOT_CA_KEY,
    TOKEN_MOUNT_PATH,
    Admission,
    account_of,
    admit_pod,
    published_by_volfsm,
    root_ca_config_map,
)
from volfsm.desired.errors import InvalidObjectError, Problems, flatten_problems, raise_all
from volfsm.desired.kinds import (
    ClusterTrustBundle,
    ConfigMap,
    CSIDriver,
    Secret,
    ServiceAccount,
)
from volfsm.desired.normalize import normalize
from volfsm.desired.objects import (
    KINDS,
    KubeObject,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    decode_object_lenient,
)
from volfsm.desired.quantity import format_bytes
from volfsm.desired.resolve import (
    CanServe,
    added_fingerprint,
    claim_binding_problem,
    claim_key,
    csi_driver_key,
    pv_source,
    pv_volume_id,
    resolve_pod,
    spec_fingerprint,
    volume_key,
)
from volfsm.desired.validate import (
    check_pod_node,
    pv_size_bytes,
    validate_pod,
    validate_pv,
    validate_pvc,
)
from volfsm.desired.validate_kinds import (
    validate_cluster_trust_bundle,
    validate_config_map,
    validate_csi_driver,
    validate_secret,
    validate_service_account,
)
from volfsm.plugins.base import NotRegistered

_T = TypeVar("_T")

ObjectKey = tuple[str, str, str]
"""(kind, namespace, name); namespace "" for cluster-scoped kinds."""


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
    uid: str = ""
    waiting: str = ""
    """A pod accepted but pending: what its volumes wait for ("" when it is not pending)."""
    note: str = ""
    """What the apply added as an API server would (a pod's token volume, a published
    kube-root-ca.crt), "" if nothing."""

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        line = f"{self.kind.lower()}/{where} {self.action}"
        return f"{line}; waiting: {self.waiting}" if self.waiting else line


@dataclass(frozen=True)
class SkippedObject:
    """An object of a kind a node does not run (Deployment, Service, ...): not applied."""

    kind: str
    api_version: str
    namespace: str
    name: str
    where: str

    def __str__(self) -> str:
        group = self.api_version.split("/")[0] if "/" in self.api_version else ""
        kind = f"{self.kind.lower()}.{group}" if group else self.kind.lower()
        who = f"{self.namespace}/{self.name}" if self.namespace else (self.name or self.where)
        version = self.api_version or "no apiVersion"
        return f"{kind}/{who} skipped: a node does not run {self.kind} objects ({version})"


@dataclass(frozen=True)
class AppliedObject:
    """One object of an apply as the node's object store keeps it.

    `raw` is the object as applied, settled (`normalize`) and completed as an
    API server would (uid, namespace; a Secret's stringData merged into
    data). `content_hash` comes from the store's hasher ("" without one).
    """

    kind: str
    namespace: str
    name: str
    uid: str
    obj: KubeObject
    raw: dict[str, Any]
    content_hash: str = ""
    action: str = "created"

    @property
    def key(self) -> ObjectKey:
        """(kind, namespace, name)."""
        return (self.kind, self.namespace, self.name)


@dataclass(frozen=True)
class ApplyPlan:
    """The events an apply records, the objects to keep, and a result per object."""

    changes: list[DesiredChange] = field(default_factory=list)
    pvs: dict[str, PersistentVolume] = field(default_factory=dict)
    pvcs: dict[tuple[str, str], PersistentVolumeClaim] = field(default_factory=dict)
    results: list[ApplyResult] = field(default_factory=list)
    objects: list[AppliedObject] = field(default_factory=list)
    """Every object of the apply (pods too), each once, in the order given."""
    skipped: list[SkippedObject] = field(default_factory=list)

    @property
    def pod_uids(self) -> set[str]:
        """The uids of the apply's pods (as given or given to them)."""
        return {o.uid for o in self.objects if o.kind == "Pod"}

    @property
    def stored_changes(self) -> list[AppliedObject]:
        """The objects the store must write (created, configured or replaced)."""
        return [o for o in self.objects if o.action != "unchanged"]


class DesiredView(Protocol):
    """What planning reads from the desired state of world."""

    pods: dict[str, PodAdded]
    pending: dict[str, PodPending]

    def pod_by_name(self, namespace: str, name: str) -> PodAdded | None:
        """The pod namespace/name, or None."""

    def desired_by_name(self, namespace: str, name: str) -> PodAdded | PodPending | None:
        """The desired pod namespace/name (added or pending), or None."""

    def pending_spec(self, uid: str) -> Pod | None:
        """The Pod object of a pending pod, if kept."""

    def pending_waiting_on(self, keys: Iterable[str]) -> list[str]:
        """UIDs of the pending pods waiting for any of these objects."""

    def desired_size(self, volume_id: str) -> int | None:
        """The size pods want of a volume, or None."""

    def pods_on_volume(self, volume_id: str) -> list[str]:
        """UIDs of the pods that want a volume."""

    def persistent_volume(self, name: str) -> PersistentVolume | None:
        """A PV remembered from an earlier apply."""

    def claim(self, namespace: str, name: str) -> PersistentVolumeClaim | None:
        """A PVC remembered from an earlier apply."""


@dataclass(frozen=True)
class StoredInfo:
    """What the object store holds under one key."""

    uid: str
    content_hash: str
    obj: KubeObject


class StoredLookup(Protocol):
    """What planning reads from the node's object store (`volfsm.objects.ObjectStore`)."""

    def stored_info(self, kind: str, namespace: str, name: str) -> StoredInfo | None:
        """The stored object under (kind, namespace, name), or None."""

    def content_hash(self, kind: str, raw: Mapping[str, Any]) -> str:
        """The content hash of an object (keyed for Secrets)."""


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

    def __init__(
        self, view: DesiredView, stored: StoredLookup | None, admission: Admission | None = None
    ) -> None:
        self.view = view
        self.stored = stored
        self.admission = admission
        self.automount: dict[tuple[str, str], bool | None] = {}
        """(namespace, name) of each ServiceAccount of this apply -> its automount flag."""
        self.notes: dict[str, str] = {}
        """Uid of an object -> what the apply added to it or published as an API server
        would."""
        self.pvs: dict[str, PersistentVolume] = {}
        self.pvcs: dict[tuple[str, str], PersistentVolumeClaim] = {}
        self.pods: dict[str, Pod] = {}
        self.pod_names: dict[tuple[str, str], str] = {}
        self.others: dict[ObjectKey, KubeObject] = {}
        self.objects: list[AppliedObject] = []
        self.where: dict[int, str] = {}
        self.uids: dict[ObjectKey, str] = {}
        """Uids given in this apply, so a repeated object gets the same one."""
        self.bad_volumes: dict[str, set[int]] = {}
        """Uid of a pod with problems -> the indices of its volumes they are about."""
        self.waiting: dict[str, str] = {}
        """Uid of a pod of this apply that is pending after it -> what it waits for."""
        self.resolved: set[str] = set()
        """Uids of pending pods of this apply that no longer wait."""

    # ObjectLookup
    def claim(self, namespace: str, name: str) -> PersistentVolumeClaim | None:
        found = self.pvcs.get((namespace, name))
        return found if found is not None else self.view.claim(namespace, name)

    def volume(self, name: str) -> PersistentVolume | None:
        found = self.pvs.get(name)
        return found if found is not None else self.view.persistent_volume(name)

    def uid_for(self, key: ObjectKey) -> str:
        """The uid an object without one gets: the existing object's, else a new uuid4."""
        known = self.uids.get(key)
        if known is not None:
            return known
        kind, namespace, name = key
        existing = ""
        if kind == "Pod":
            pod = self.view.desired_by_name(namespace, name)
            existing = pod.pod_uid if pod is not None else ""
        elif kind == "PersistentVolume":
            pv = self.view.persistent_volume(name)
            existing = pv.metadata.uid if pv is not None else ""
        elif kind == "PersistentVolumeClaim":
            pvc = self.view.claim(namespace, name)
            existing = pvc.metadata.uid if pvc is not None else ""
        elif self.stored is not None:
            info = self.stored.stored_info(kind, namespace, name)
            existing = info.uid if info is not None else ""
        uid = self.uids[key] = existing or str(uuid.uuid4())
        return uid

    def add(self, where: str, applied: AppliedObject) -> bool:
        """Take one object; False if it repeats one already taken (identical: dropped).

        A different object under the same key is rejected.
        """
        obj = applied.obj
        if isinstance(obj, PersistentVolume):
            taken = self._add_unique(self.pvs, obj.metadata.name, applied, where)
        elif isinstance(obj, PersistentVolumeClaim):
            taken = self._add_unique(self.pvcs, obj.key, applied, where)
        elif isinstance(obj, Pod):
            taken = self._add_unique(self.pods, obj.metadata.uid, applied, where)
            key = (obj.metadata.ns, obj.metadata.name)
            other = self.pod_names.setdefault(key, obj.metadata.uid)
            if other != obj.metadata.uid:
                raise InvalidObjectError(
                    "metadata.uid",
                    f"this apply has two pods named {key[0]}/{key[1]} "
                    f"(uids {other} and {obj.metadata.uid})",
                    obj.label,
                )
        else:
            taken = self._add_unique(self.others, applied.key, applied, where)
        return taken

    def _add_unique(
        self, into: dict[Any, Any], key: object, applied: AppliedObject, where: str
    ) -> bool:
        obj = applied.obj
        previous = into.get(key)
        if previous is None:
            into[key] = obj
            self.objects.append(applied)
            self.where[id(obj)] = where
            return True
        if previous != obj:
            field_ = "metadata.uid" if isinstance(obj, Pod) else "metadata.name"
            raise InvalidObjectError(
                field_,
                f"given twice in this apply with different contents "
                f"(also {self.where[id(previous)]})",
                obj.label,
            )
        return False


def plan_apply(
    objects: Sequence[Mapping[str, Any]],
    view: DesiredView,
    can_serve: CanServe,
    node_name: str = "",
    stored: StoredLookup | None = None,
    admission: Admission | None = None,
) -> ApplyPlan:
    """Validate every object, then plan the events. Raises InvalidObjectError(s); pure.

    A pod whose spec.nodeName names another node than `node_name` is
    refused ("" accepts every pod). With `admission` new pods are admitted
    as the ServiceAccount admission plugin does and their namespaces get a
    kube-root-ca.crt ConfigMap if they have none. Changes come in this order: pods
    replaced by a new uid are removed, then volumes that grew get their
    DesiredSizeChanged, then new pods are added. Every problem found is
    raised at once (`InvalidObjectsError` when there are several).
    """
    batch = _Batch(view, stored, admission)
    problems = Problems()
    skipped: list[SkippedObject] = []
    flat = flatten(objects)
    batch.automount = _batch_automount(flat)
    for where, raw in flat:
        if _skipped(raw, where, skipped):
            continue
        with problems.check():
            applied = _take(raw, where, batch, node_name, problems)
            if applied is not None:
                batch.add(where, applied)
    for namespace in _root_ca_namespaces(batch):
        with problems.check():
            _publish_root_ca(namespace, batch, node_name, problems)
    checks: list[tuple[KubeObject, Callable[..., Any], tuple[Any, ...]]] = []
    checks += [(pv, _check_pv, (pv, view, can_serve)) for pv in batch.pvs.values()]
    checks += [(pvc, _check_pvc, (pvc, batch)) for pvc in batch.pvcs.values()]
    checks += [(obj, _check_stored, (obj, stored)) for obj in batch.others.values()]
    for obj, check, args in checks:
        with problems.check():
            _attributed(obj, check, *args)
    actions: dict[int, str] = {}
    removals: list[DesiredChange] = []
    adds: list[DesiredChange] = []
    for pod in batch.pods.values():
        with problems.check():
            actions[id(pod)] = _attributed(pod, _plan_pod, pod, batch, can_serve, removals, adds)
    problems.raise_if_any()
    removed = {change.body.pod_uid for change in removals if isinstance(change.body, PodRemoved)}
    resizes: list[DesiredChange] = []
    for pv in batch.pvs.values():
        actions[id(pv)] = _plan_pv(pv, view, removed, resizes)
    for pvc in batch.pvcs.values():
        actions[id(pvc)] = _action(view.claim(*pvc.key), pvc)
    woken, woken_results = _wake_pending(batch, can_serve, actions, removed)
    settled = [_settle(a, actions.get(id(a.obj)), stored) for a in batch.objects]
    return ApplyPlan(
        changes=removals + resizes + adds + woken,
        pvs=dict(batch.pvs),
        pvcs=dict(batch.pvcs),
        results=[_result(a, batch) for a in settled] + woken_results,
        objects=settled,
        skipped=skipped,
    )


def _result(applied: AppliedObject, batch: _Batch) -> ApplyResult:
    """The line of one object of the apply (a pod's says what it waits for, if it does)."""
    action, waiting = applied.action, ""
    if applied.kind == "Pod":
        waiting = batch.waiting.get(applied.uid, "")
        if applied.uid in batch.resolved:
            action = NO_LONGER_WAITING
    note = batch.notes.get(applied.uid, "") if action != "unchanged" else ""
    return ApplyResult(
        applied.kind, applied.namespace, applied.name, action, applied.uid, waiting, note
    )


NO_LONGER_WAITING = "no longer waiting"
"""The action of a pending pod whose volumes all resolved (a `PodAdded` follows)."""
STILL_WAITING = "still waiting"
"""The action of a pending pod woken by an object of the apply that waits for others now."""


def pending_text(pending: PodPending) -> str:
    """'scratch: PersistentVolumeClaim default/web-scratch: not found yet; ...'."""
    return "; ".join(f"{w.name}: {w.text}" for w in pending.waiting)


def _wake_pending(
    batch: _Batch, can_serve: CanServe, actions: Mapping[int, str], removed: set[str]
) -> tuple[list[DesiredChange], list[ApplyResult]]:
    """Resolve again the pending pods this apply may change: those waiting for a PV or claim
    it creates or changes, and those it applies again (event-woken, as the kubelet's populator
    retries a pod whose claim was missing). Their `PodAdded`, or a `PodPending` with new
    reasons; and a result line for each woken pod not in the apply."""
    view = batch.view
    if not view.pending:
        return [], []
    keys = [claim_key(*c.key) for c in batch.pvcs.values() if actions[id(c)] != "unchanged"]
    keys += [volume_key(n) for n, pv in batch.pvs.items() if actions[id(pv)] != "unchanged"]
    uids = dict.fromkeys(view.pending_waiting_on(keys))
    uids.update(dict.fromkeys(uid for uid in batch.pods if uid in view.pending))
    return _wake(batch, can_serve, uids, removed)


def plan_wake_drivers(
    view: DesiredView, can_serve: CanServe, drivers: Iterable[str]
) -> list[DesiredChange]:
    """Resolve again the pending pods waiting for these CSI drivers to register (called when
    they do): their `PodAdded`, or a `PodPending` with new reasons. Pure."""
    uids = view.pending_waiting_on(csi_driver_key(name) for name in drivers)
    if not uids:
        return []
    changes, _ = _wake(_Batch(view, None), can_serve, dict.fromkeys(uids), set())
    return changes


def _wake(
    batch: _Batch, can_serve: CanServe, uids: Mapping[str, None], removed: set[str]
) -> tuple[list[DesiredChange], list[ApplyResult]]:
    """Resolve the pending pods `uids` again (see `_wake_pending`)."""
    view = batch.view
    changes: list[DesiredChange] = []
    results: list[ApplyResult] = []
    for uid in uids:
        before = view.pending.get(uid)
        spec = batch.pods.get(uid) or view.pending_spec(uid)
        if uid in removed or before is None or spec is None:
            continue
        after = _resolve_again(spec, batch, can_serve)
        in_batch = uid in batch.pods
        ns, name = before.namespace, before.name
        if isinstance(after, PodAdded):
            changes.append(DesiredChange(pod_stream(uid), after))
            if in_batch:
                batch.resolved.add(uid)
            else:
                results.append(ApplyResult("Pod", ns, name, NO_LONGER_WAITING, uid))
            continue
        text = pending_text(after)
        if after.waiting != before.waiting:
            changes.append(DesiredChange(pod_stream(uid), after))
            if not in_batch:
                results.append(ApplyResult("Pod", ns, name, STILL_WAITING, uid, text))
        if in_batch:
            batch.waiting[uid] = text
    return changes, results


def _resolve_again(pod: Pod, batch: _Batch, can_serve: CanServe) -> PodAdded | PodPending:
    """An accepted pod resolved again: its problems now are reasons to wait (the kubelet's
    populator records them on the pod and retries), never a refusal of the apply."""
    try:
        return resolve_pod(pod, batch, can_serve, strict=False)
    except InvalidObjectError as exc:
        reasons = tuple(
            PendingVolume(name=p.path or "spec.volumes", waits_for="", reason=p.message)
            for p in flatten_problems(exc)
        )
        meta = pod.metadata
        return PodPending(pod_uid=meta.uid, namespace=meta.ns, name=meta.name, waiting=reasons)


def _skipped(raw: object, where: str, skipped: list[SkippedObject]) -> bool:
    """Record `raw` as skipped if it is of a kind a node does not run."""
    if not isinstance(raw, Mapping):
        return False
    kind = raw.get("kind")
    if not isinstance(kind, str) or not kind or kind in KINDS:
        return False
    meta = raw.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = meta.get("name")
    namespace = meta.get("namespace")
    api_version = raw.get("apiVersion")
    skipped.append(
        SkippedObject(
            kind=kind,
            api_version=api_version if isinstance(api_version, str) else "",
            namespace=namespace if isinstance(namespace, str) else "",
            name=name if isinstance(name, str) else "",
            where=where,
        )
    )
    return True


def _take(
    raw: object, where: str, batch: _Batch, node_name: str, problems: Problems
) -> AppliedObject | None:
    """Decode and check one object of a node kind, giving it a uid and a namespace.

    Its problems go to `problems`. A pod is returned even with problems, if
    it could be decoded well enough, so that planning it finds the rest
    (missing claims, unserved volumes); other objects only without problems.
    """
    completed = _completed(raw, batch)
    obj, found = decode_object_lenient(completed, where)
    if obj is None:
        raise_all(found)
        return None
    try:
        _attributed(obj, _validate_alone, obj, node_name)
    except InvalidObjectError as exc:
        found.extend(flatten_problems(exc))
    for problem in found:
        problems.add(problem)
    if found and not isinstance(obj, Pod):
        return None
    if found:
        batch.bad_volumes[obj.metadata.uid] = _volume_indices(found)
    assert isinstance(completed, dict)
    meta = obj.metadata
    namespaced = KINDS[obj.kind].namespaced
    stored_raw = _stored_form(completed, obj)
    namespace = meta.ns if namespaced else ""
    return AppliedObject(obj.kind, namespace, meta.name, meta.uid, obj, stored_raw)


def _completed(raw: object, batch: _Batch) -> object:
    """`raw` with a uid and (namespaced kinds) a namespace, as an API server completes it."""
    if not isinstance(raw, Mapping):
        return raw
    kind = raw.get("kind")
    meta = raw.get("metadata")
    info = KINDS.get(kind) if isinstance(kind, str) else None
    if info is None or not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return raw
    out = copy.deepcopy(dict(raw))
    meta_out = out["metadata"] = dict(out["metadata"])
    if info.namespaced:
        if not meta_out.get("namespace"):
            meta_out["namespace"] = "default"
    else:
        meta_out.pop("namespace", None)
    meta_out.pop("resourceVersion", None)
    if not meta_out.get("uid"):
        namespace = meta_out.get("namespace", "") if info.namespaced else ""
        meta_out["uid"] = batch.uid_for((str(kind), str(namespace), meta_out["name"]))
    if kind == "Pod" and batch.admission is not None:
        _admit(out, batch)
    return out


def _admit(pod: dict[str, Any], batch: _Batch) -> None:
    """ServiceAccount admission of a pod being applied (see `volfsm.desired.admission`).

    The API server admits a pod once, when it is created; a pod applied again
    under its uid keeps what its first apply decided: it gets the token volume
    again only if its stored object has one.
    """
    meta, spec = pod["metadata"], pod.get("spec")
    if not isinstance(spec, Mapping):
        return
    namespace, name, uid = meta.get("namespace", ""), meta["name"], meta["uid"]
    account = (str(namespace), account_of(spec))
    automount = batch.automount.get(account)
    if account not in batch.automount and batch.stored is not None:
        info = batch.stored.stored_info("ServiceAccount", *account)
        if isinstance(info, StoredInfo) and isinstance(info.obj, ServiceAccount):
            automount = info.obj.automount_service_account_token
    decided = None
    if batch.stored is not None:
        kept = batch.stored.stored_info("Pod", str(namespace), str(name))
        if kept is not None and kept.uid == uid and isinstance(kept.obj, Pod):
            decided = _has_token_mount(kept.obj)
    added = admit_pod(pod, automount, decided)
    if added:
        batch.notes[str(uid)] = (
            f"added volume {added} (service-account token at {TOKEN_MOUNT_PATH}, "
            "as the API server's ServiceAccount admission)"
        )


def _has_token_mount(pod: Pod) -> bool:
    """Whether a container of a stored pod mounts something at the token path."""
    containers = (*pod.spec.init_containers, *pod.spec.containers)
    return any(m.mount_path == TOKEN_MOUNT_PATH for c in containers for m in c.volume_mounts)


def _batch_automount(flat: Sequence[tuple[str, object]]) -> dict[tuple[str, str], bool | None]:
    """(namespace, name) of each ServiceAccount of an apply -> its automount flag (None: not
    set or not a boolean)."""
    found: dict[tuple[str, str], bool | None] = {}
    for _, raw in flat:
        if not isinstance(raw, Mapping) or raw.get("kind") != "ServiceAccount":
            continue
        meta = raw.get("metadata")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
            continue
        namespace = meta.get("namespace") or "default"
        flag = raw.get("automountServiceAccountToken")
        found[(str(namespace), meta["name"])] = flag if isinstance(flag, bool) else None
    return found


def _root_ca_namespaces(batch: _Batch) -> list[str]:
    """Namespaces where a pod of the apply reads the kube-root-ca.crt ConfigMap (sorted)."""
    if batch.admission is None or not batch.admission.root_ca_pem:
        return []
    return sorted({pod.metadata.ns for pod in batch.pods.values() if _reads_root_ca(pod)})


def _reads_root_ca(pod: Pod) -> bool:
    for volume in pod.spec.volumes:
        if volume.config_map is not None and volume.config_map.name == ROOT_CA_CONFIG_MAP:
            return True
        if volume.projected is not None:
            for source in volume.projected.sources:
                if source.config_map is not None and source.config_map.name == ROOT_CA_CONFIG_MAP:
                    return True
    return False


def _publish_root_ca(namespace: str, batch: _Batch, node_name: str, problems: Problems) -> None:
    """Publish kube-root-ca.crt in `namespace`, as the root-ca-cert-publisher does, unless
    there is one: an applied one (in this apply or stored) is the operator's and always
    wins; one volfsm published is updated when the CA bundle changed."""
    admission = batch.admission
    assert admission is not None
    key = ("ConfigMap", namespace, ROOT_CA_CONFIG_MAP)
    if key in batch.others:
        return
    info = batch.stored.stored_info(*key) if batch.stored is not None else None
    if info is not None:
        obj = info.obj
        if not isinstance(obj, ConfigMap) or not published_by_volfsm(obj.metadata.annotations):
            return
        if obj.data.get(ROOT_CA_KEY) == admission.root_ca_pem:
            return
    raw = root_ca_config_map(namespace, admission.root_ca_pem)
    where = f"published {namespace}/{ROOT_CA_CONFIG_MAP}"
    applied = _take(raw, where, batch, node_name, problems)
    if applied is not None and batch.add(where, applied):
        batch.notes[applied.uid] = f"published by volfsm from {admission.root_ca_source}"


def _stored_form(completed: dict[str, Any], obj: KubeObject) -> dict[str, Any]:
    """What the store keeps: the settled object; a Secret's stringData merged into data."""
    stored: dict[str, Any] = normalize(completed)
    if isinstance(obj, Secret):
        values = obj.values()
        stored["data"] = {k: base64.b64encode(v).decode() for k, v in sorted(values.items())}
        stored.pop("stringData", None)
    return stored


def _settle(
    applied: AppliedObject, dsw_action: str | None, stored: StoredLookup | None
) -> AppliedObject:
    """The object with its content hash and what the apply does to it."""
    if stored is None:
        return dataclasses.replace(applied, action=dsw_action or "created")
    digest = stored.content_hash(applied.kind, applied.raw)
    info = stored.stored_info(*applied.key)
    if info is None:
        action = "created"
    elif info.uid != applied.uid:
        action = "replaced"
    elif info.content_hash == digest:
        action = "unchanged"
    else:
        action = "configured"
    if applied.kind == "Pod" and dsw_action in ("created", "replaced"):
        action = dsw_action
    return dataclasses.replace(applied, content_hash=digest, action=action)


def _attributed(obj: KubeObject, fn: Callable[..., _T], *args: Any) -> _T:
    """Run a check, naming `obj` in any error it raises."""
    try:
        return fn(*args)
    except InvalidObjectError as exc:
        raise exc.within(obj.label) from None


_VALIDATORS: dict[type, Callable[[Any], None]] = {
    PersistentVolume: validate_pv,
    PersistentVolumeClaim: validate_pvc,
    Pod: validate_pod,
    ConfigMap: validate_config_map,
    Secret: validate_secret,
    ServiceAccount: validate_service_account,
    ClusterTrustBundle: validate_cluster_trust_bundle,
    CSIDriver: validate_csi_driver,
}


def _validate_alone(obj: KubeObject, node_name: str) -> None:
    problems = Problems()
    with problems.check():
        _VALIDATORS[type(obj)](obj)
    if isinstance(obj, Pod):
        with problems.check():
            check_pod_node(obj, node_name)
    problems.raise_if_any()


def _action(old: KubeObject | None, new: KubeObject) -> str:
    return "created" if old is None else ("unchanged" if old == new else "configured")


def _check_stored(obj: KubeObject, stored: StoredLookup | None) -> None:
    """An immutable ConfigMap or Secret keeps its data (and stays immutable)."""
    if stored is None or not isinstance(obj, ConfigMap | Secret):
        return
    info = stored.stored_info(obj.kind, obj.metadata.ns, obj.metadata.name)
    old = info.obj if info is not None else None
    if not isinstance(old, ConfigMap | Secret) or not old.immutable:
        return
    if info is not None and info.uid != obj.metadata.uid:
        return  # a new object under the same name replaces the old one
    if not obj.immutable:
        raise InvalidObjectError("immutable", "field is immutable when `immutable` is set")
    if _data_of(old) != _data_of(obj):
        raise InvalidObjectError("data", "field is immutable when `immutable` is set")


def _data_of(obj: ConfigMap | Secret) -> object:
    return obj.files() if isinstance(obj, ConfigMap) else obj.values()


def _check_pv(pv: PersistentVolume, view: DesiredView, can_serve: CanServe) -> None:
    csi = pv.spec.csi
    old = view.persistent_volume(pv.metadata.name)
    size = pv_size_bytes(pv)
    if old is not None and pv_volume_id(old) != pv_volume_id(pv):
        raise InvalidObjectError("spec", "the volume source is immutable after creation")
    if csi is not None and old is not None and old.spec.csi is not None:
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
    if refused is not None and not isinstance(refused, NotRegistered):  # a pod using it waits
        served_by = f"driver {csi.driver}" if csi is not None else "hostPath"
        raise InvalidObjectError(
            "spec.volumeMode", f"{refused} ({served_by}, volumeMode {pv.spec.volume_mode})"
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


def _volume_indices(problems: list[InvalidObjectError]) -> set[int]:
    """The indices of the volumes `problems` are about (paths `spec.volumes[N]...`)."""
    found = set()
    for problem in problems:
        match = _VOLUME_PATH.match(problem.path)
        if match is not None:
            found.add(int(match[1]))
    return found


_VOLUME_PATH = re.compile(r"spec\.volumes\[(\d+)\]")


def _plan_pod(
    pod: Pod,
    batch: _Batch,
    can_serve: CanServe,
    removals: list[DesiredChange],
    adds: list[DesiredChange],
) -> str:
    """Plan one pod; returns what happens to it.

    A pod with problems of its own (`batch.bad_volumes`) is only resolved,
    its bad volumes left out, so that the apply reports its other problems.
    """
    meta = pod.metadata
    view = batch.view
    bad = batch.bad_volumes.get(meta.uid)
    if bad is not None:
        resolve_pod(pod, batch, can_serve, skip=bad)
        return "invalid"
    existing: PodAdded | PodPending | None = view.pods.get(meta.uid)
    existing = existing or view.pending.get(meta.uid)
    if existing is not None:
        _check_same_pod(pod, existing, view)
        return "unchanged"  # a pending one is resolved again by `_wake_pending`
    outcome = resolve_pod(pod, batch, can_serve)
    if isinstance(outcome, PodPending):
        batch.waiting[meta.uid] = pending_text(outcome)
    old = view.desired_by_name(meta.ns, meta.name)
    adds.append(DesiredChange(pod_stream(meta.uid), outcome))
    if old is None:
        return "created"
    body = PodRemoved(pod_uid=old.pod_uid, namespace=old.namespace, name=old.name)
    removals.append(DesiredChange(pod_stream(old.pod_uid), body))
    return "replaced"


def _check_same_pod(pod: Pod, existing: PodAdded | PodPending, view: DesiredView) -> None:
    """A pod applied again under its uid: same name, same volumes (pods are immutable)."""
    meta = pod.metadata
    if (existing.namespace, existing.name) != (meta.ns, meta.name):
        raise InvalidObjectError(
            "metadata.uid",
            f"uid {meta.uid} already belongs to pod {existing.namespace}/{existing.name}",
        )
    if isinstance(existing, PodAdded):
        same = added_fingerprint(existing) == spec_fingerprint(pod)
    else:
        kept = view.pending_spec(meta.uid)
        same = kept is None or spec_fingerprint(kept) == spec_fingerprint(pod)
    if not same:
        raise InvalidObjectError(
            "spec.volumes",
            f"pods are immutable: pod {meta.ns}/{meta.name} (uid {meta.uid}) already "
            "exists with different volumes; delete it first or apply it with a new uid",
        )


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

"""The desired state of world (DSW): which pods want which volumes, at what size.

The DSW's pods are a fold of the desired-state events (`PodAdded`,
`PodPending`, `PodRemoved`, `DesiredSizeChanged`): `observe` applies one, so
recovery is replaying them. A pending pod (`pending`) is desired but waits
for objects its volumes need (a claim, its PV): it has no volumes to mount
until a `PodAdded` of the same uid follows; its Pod object is kept
(`commit_objects`, and `remember_pods` at start) to resolve it again when an
object it waits for is applied. Changes go through a plan: `plan_apply` / `plan_delete_pod`
validate and return the events to record without touching the DSW; the
caller records them, feeds the recorded envelopes to `observe`, and then
`commit_objects` remembers the plan's PVs and PVCs for later applies.
Plans must be made and recorded one at a time (the engine serialises them).

Indexes keep the reconciler's hot queries cheap: `volume_desired`,
`is_desired` and `desired_size` are dict lookups, and `volumes_to_mount`
returns a list rebuilt only after a change.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec
from msgspec.structs import force_setattr

from events.streams import pod_stream
from events.types import (
    Body,
    DesiredSizeChanged,
    DesiredVolume,
    Envelope,
    PodAdded,
    PodPending,
    PodRemoved,
)
from volfsm.desired.admission import Admission
from volfsm.desired.errors import InvalidObjectError
from volfsm.desired.objects import PersistentVolume, PersistentVolumeClaim, Pod
from volfsm.desired.plan import (
    ApplyPlan,
    ApplyResult,
    DesiredChange,
    StoredLookup,
    plan_apply,
    plan_wake_drivers,
)
from volfsm.desired.resolve import CanServe, ephemeral_claim_name

__all__ = [
    "ApplyPlan",
    "ApplyResult",
    "DesiredChange",
    "DesiredStateOfWorld",
    "DswSnapshot",
    "InvalidObjectError",
    "PodVolume",
]

PodVolume = tuple[PodAdded, DesiredVolume]


class DswSnapshot(msgspec.Struct, array_like=True, frozen=True):
    """What the fold of the desired-state events built, as a snapshot stores it.

    The per-volume and per-(pod, volume) indexes are rebuilt from `pods`
    (in their order, which is the order `pods_on_volume` reports); the
    by-name index and the sizes are kept as they are, since their history
    (a pod replaced under the same name, sizes of volumes no pod wants any
    more) cannot be rebuilt from the pods alone. PVs and PVCs remembered by
    `commit_objects` are not part of the fold and not of a snapshot.
    """

    pods: list[PodAdded] = []
    by_name: list[tuple[str, str, str]] = []
    """(namespace, name, uid)"""
    sizes: dict[str, int] = {}
    generation: int = 0
    pending: list[PodPending] = []
    """Pending pods (their names are in `by_name`)."""


class DesiredStateOfWorld:
    """Pods and their volumes as recorded, plus the PVs/PVCs applied so far."""

    def __init__(self, can_serve: CanServe, node_name: str = "") -> None:
        self.can_serve = can_serve
        self.node_name = node_name
        """This node: pods whose spec.nodeName names another one are refused ("" takes all)."""
        self.admission: Admission | None = None
        """ServiceAccount admission of new pods (`volfsm serve` sets it); None: pods as given."""
        self.pods: dict[str, PodAdded] = {}
        self.pending: dict[str, PodPending] = {}
        """Pods desired but waiting for objects their volumes need (nothing to mount yet)."""
        self.generation = 0
        """Bumped by every observed change: a cheap "did anything change" for callers."""
        self._by_name: dict[tuple[str, str], str] = {}
        self._entries: dict[tuple[str, str], PodVolume] = {}
        self._by_volume: dict[str, str | dict[str, None]] = {}
        """volume id -> the uid of the one pod that wants it, or the uids of several in the
        order they were added (a dict per volume would cost 20 MB at 100,000 volumes)."""
        self._sizes: dict[str, int] = {}
        self._to_mount: list[PodVolume] | None = None
        self._pvs: dict[str, PersistentVolume] = {}
        self._pvcs: dict[tuple[str, str], PersistentVolumeClaim] = {}
        self._pending_specs: dict[str, Pod] = {}
        self.folds: dict[type, Callable[[Any], None]] = {
            PodAdded: self._add,
            PodPending: self._on_pending,
            PodRemoved: self._on_removed,
            DesiredSizeChanged: self._on_size,
        }
        """Body type -> what observing it does (big folds call these directly)."""

    # -------------------------------------------------------------- planning

    def plan_apply(
        self, objects: Sequence[Mapping[str, Any]], stored: StoredLookup | None = None
    ) -> ApplyPlan:
        """Validate every object and plan the events; mutates nothing.

        Raises InvalidObjectError naming the object and field (a pod for
        another node than `node_name` too; every problem at once). Applying
        objects that change nothing gives a plan without changes. `stored`
        is the node's object store: uids and content hashes come from it.
        """
        return plan_apply(objects, self, self.can_serve, self.node_name, stored, self.admission)

    def plan_wake_drivers(self, drivers: Iterable[str]) -> list[DesiredChange]:
        """The events resolving again the pending pods that wait for these CSI drivers
        (just registered on this node); mutates nothing."""
        return plan_wake_drivers(self, self.can_serve, drivers)

    def commit_objects(self, plan: ApplyPlan) -> None:
        """Remember the plan's PVs and PVCs, and the Pod objects of its pending pods (after
        its changes were recorded)."""
        self._pvs.update(plan.pvs)
        self._pvcs.update(plan.pvcs)
        self.remember_pods(a.obj for a in plan.objects if isinstance(a.obj, Pod))

    def remember_pods(self, pods: Iterable[Pod]) -> None:
        """Keep the Pod objects of pending pods (the object store's, at start)."""
        for pod in pods:
            if pod.metadata.uid in self.pending:
                self._pending_specs[pod.metadata.uid] = pod

    def remember(
        self,
        pvs: Sequence[PersistentVolume] = (),
        claims: Sequence[PersistentVolumeClaim] = (),
    ) -> None:
        """Remember PVs and PVCs kept from earlier applies (the object store, at start)."""
        self._pvs.update((pv.metadata.name, pv) for pv in pvs)
        self._pvcs.update((pvc.key, pvc) for pvc in claims)

    def forget_volume(self, name: str) -> None:
        """Forget a PV (deleted)."""
        self._pvs.pop(name, None)

    def forget_claim(self, namespace: str, name: str) -> None:
        """Forget a PVC (deleted)."""
        self._pvcs.pop((namespace, name), None)

    def pods_using(self, *, pv_name: str = "", claim: tuple[str, str] | None = None) -> list[str]:
        """'namespace/name' of the desired pods using a PV (by name) or a claim."""
        found = []
        for pod in self.pods.values():
            for vol in pod.volumes:
                if (pv_name and vol.pv_name == pv_name) or (
                    claim is not None and vol.claim_name == claim[1] and pod.namespace == claim[0]
                ):
                    found.append(f"{pod.namespace}/{pod.name}")
                    break
        if claim is not None:
            found.extend(self._pending_using(claim))
        return found

    def _pending_using(self, claim: tuple[str, str]) -> list[str]:
        """'namespace/name' of the pending pods whose spec names the claim."""
        found = []
        for uid, spec in self._pending_specs.items():
            if spec.metadata.ns != claim[0] or uid not in self.pending:
                continue
            for volume in spec.spec.volumes:
                src = volume.persistent_volume_claim
                named = src.claim_name if src is not None else None
                if volume.ephemeral is not None:
                    named = ephemeral_claim_name(spec, volume)
                if named == claim[1]:
                    found.append(f"{spec.metadata.ns}/{spec.metadata.name}")
                    break
        return found

    def plan_delete_pod(
        self, *, uid: str | None = None, namespace: str | None = None, name: str | None = None
    ) -> list[DesiredChange]:
        """The event removing a pod, by uid or by namespace and name ([] if no such pod)."""
        if uid is None and (namespace is None or name is None):
            raise ValueError("give a pod uid, or a namespace and a name")
        pod: PodAdded | PodPending | None = (
            self.desired_pod(uid)
            if uid is not None
            else self.desired_by_name(namespace or "", name or "")
        )
        if pod is None:
            return []
        if namespace is not None and pod.namespace != namespace:
            return []
        if name is not None and pod.name != name:
            return []
        body = PodRemoved(pod_uid=pod.pod_uid, namespace=pod.namespace, name=pod.name)
        return [DesiredChange(pod_stream(pod.pod_uid), body)]

    # ------------------------------------------------------------------ fold

    def observe(self, env: Envelope) -> None:
        """Apply one recorded event; events that are not desired-state ones are ignored."""
        self.observe_body(env.body)

    def observe_body(self, body: Body) -> None:
        """`observe` of an event body (big folds need no envelope)."""
        fold = self.folds.get(type(body))
        if fold is not None:
            fold(body)

    def _on_removed(self, body: PodRemoved) -> None:
        self._remove(body.pod_uid)
        if self.pending:
            self._forget_pending(body.pod_uid)

    def _on_pending(self, body: PodPending) -> None:
        uid = body.pod_uid
        if uid in self.pods:
            self._remove(uid)
        self.pending[uid] = body
        self._by_name[(body.namespace, body.name)] = uid
        self.generation += 1

    def _forget_pending(self, uid: str) -> None:
        """The pod is no longer pending (added, or removed)."""
        pod = self.pending.pop(uid, None)
        self._pending_specs.pop(uid, None)
        if pod is None:
            return
        key = (pod.namespace, pod.name)
        if self._by_name.get(key) == uid:
            del self._by_name[key]
        self.generation += 1

    def _on_size(self, body: DesiredSizeChanged) -> None:
        self._sizes[body.volume_id] = body.size_bytes
        self.generation += 1

    def _add(self, pod: PodAdded) -> None:
        if pod.pod_uid in self.pods:
            self._remove(pod.pod_uid)
        elif self.pending:
            self._forget_pending(pod.pod_uid)
        uid = pod.pod_uid
        _share_strings(pod)
        self.pods[uid] = pod
        self._by_name[(pod.namespace, pod.name)] = uid
        for vol in pod.volumes:
            self._entries[(uid, vol.name)] = (pod, vol)
            self._add_user(vol.volume_id, uid)
            if vol.size_bytes is not None:
                known = self._sizes.get(vol.volume_id)
                if known is None or vol.size_bytes > known:
                    self._sizes[vol.volume_id] = vol.size_bytes
        self._changed()

    def _remove(self, uid: str) -> None:
        pod = self.pods.pop(uid, None)
        if pod is None:
            return
        key = (pod.namespace, pod.name)
        if self._by_name.get(key) == uid:
            del self._by_name[key]
        for vol in pod.volumes:
            self._entries.pop((uid, vol.name), None)
            if self._drop_user(vol.volume_id, uid):
                self._sizes.pop(vol.volume_id, None)
        self._changed()

    def _add_user(self, volume_id: str, uid: str) -> None:
        """Pod `uid` wants the volume (kept in order; one user is kept as its uid alone)."""
        users = self._by_volume.get(volume_id)
        if users is None:
            self._by_volume[volume_id] = uid
        elif isinstance(users, str):
            if users != uid:
                self._by_volume[volume_id] = {users: None, uid: None}
        else:
            users[uid] = None

    def _drop_user(self, volume_id: str, uid: str) -> bool:
        """Pod `uid` no longer wants the volume; whether no pod wants it now."""
        users = self._by_volume.get(volume_id)
        if users is None:
            return False
        if isinstance(users, str):
            if users != uid:
                return False
        else:
            users.pop(uid, None)
            if len(users) == 1:
                self._by_volume[volume_id] = next(iter(users))
            if users:
                return False
        del self._by_volume[volume_id]
        return True

    def export_state(self) -> DswSnapshot:
        """The folded state, for a snapshot (shares the pod objects: encode it at once)."""
        return DswSnapshot(
            pods=list(self.pods.values()),
            by_name=[(ns, name, uid) for (ns, name), uid in self._by_name.items()],
            sizes=dict(self._sizes),
            generation=self.generation,
            pending=list(self.pending.values()),
        )

    def restore_state(self, snap: DswSnapshot) -> None:
        """Replace the folded state with a snapshot's (what folding its events gave).

        `pods` stays the same dict object (callers may hold it).
        """
        pods = self.pods
        pods.clear()
        self._entries = {}
        self._by_volume = {}
        for pod in snap.pods:
            uid = pod.pod_uid
            _share_strings(pod)
            pods[uid] = pod
            for vol in pod.volumes:
                self._entries[(uid, vol.name)] = (pod, vol)
                self._add_user(vol.volume_id, uid)
        self.pending.clear()
        self.pending.update((p.pod_uid, p) for p in snap.pending)
        self._pending_specs = {}
        self._by_name = {(ns, name): uid for ns, name, uid in snap.by_name}
        self._sizes = dict(snap.sizes)
        self.generation = snap.generation
        self._to_mount = None

    def _changed(self) -> None:
        self._to_mount = None
        self.generation += 1

    # --------------------------------------------------------------- queries

    def pod_by_name(self, namespace: str, name: str) -> PodAdded | None:
        """The pod namespace/name, or None."""
        uid = self._by_name.get((namespace, name))
        return self.pods.get(uid) if uid is not None else None

    def desired_pod(self, uid: str) -> PodAdded | PodPending | None:
        """The pod `uid` if it is desired: added, or pending."""
        return self.pods.get(uid) or self.pending.get(uid)

    def desired_by_name(self, namespace: str, name: str) -> PodAdded | PodPending | None:
        """The desired pod namespace/name (added or pending), or None."""
        uid = self._by_name.get((namespace, name))
        return self.desired_pod(uid) if uid is not None else None

    def pending_spec(self, uid: str) -> Pod | None:
        """The Pod object of pending pod `uid` (None if it is not pending, or not kept)."""
        return self._pending_specs.get(uid)

    def pending_waiting_on(self, keys: Iterable[str]) -> list[str]:
        """UIDs of the pending pods waiting for any of these objects (`claim_key`,
        `volume_key`), in the order they became pending."""
        wanted = set(keys)
        if not wanted or not self.pending:
            return []
        return [
            uid
            for uid, pod in self.pending.items()
            if any(w.waits_for in wanted or wanted.intersection(w.needs) for w in pod.waiting)
        ]

    def volumes_to_mount(self) -> list[PodVolume]:
        """Every (pod, volume) that should be mounted. Cached: do not mutate the list."""
        if self._to_mount is None:
            self._to_mount = list(self._entries.values())
        return self._to_mount

    def desired_entries(self) -> Mapping[tuple[str, str], PodVolume]:
        """(pod uid, volume name) -> (pod, volume) of every desired pod-volume (read only)."""
        return self._entries

    def desired_sizes(self) -> Mapping[str, int]:
        """volume id -> the size pods want, for the volumes that have one (read only)."""
        return self._sizes

    def is_desired(self, pod_uid: str, volume_name: str) -> bool:
        """Whether the pod wants its volume `volume_name`."""
        return (pod_uid, volume_name) in self._entries

    def desired_volume(self, pod_uid: str, volume_name: str) -> DesiredVolume | None:
        """The pod's volume `volume_name` as desired, or None."""
        entry = self._entries.get((pod_uid, volume_name))
        return entry[1] if entry is not None else None

    def volume_desired(self, volume_id: str) -> bool:
        """Whether any pod wants the volume."""
        return volume_id in self._by_volume

    def desired_size(self, volume_id: str) -> int | None:
        """The size pods want: the latest of PV capacity and DesiredSizeChanged."""
        return self._sizes.get(volume_id)

    def pods_on_volume(self, volume_id: str) -> list[str]:
        """UIDs of the pods that want the volume, in the order they were added."""
        users = self._by_volume.get(volume_id, ())
        return [users] if isinstance(users, str) else list(users)

    def only_user(self, volume_id: str, pod_uid: str) -> bool:
        """Whether `pod_uid` is the one pod that wants the volume."""
        users = self._by_volume.get(volume_id)
        if isinstance(users, str):
            return users == pod_uid
        return users is not None and len(users) == 1 and pod_uid in users

    def persistent_volume(self, name: str) -> PersistentVolume | None:
        """A PV remembered from an earlier apply, or None."""
        return self._pvs.get(name)

    def claim(self, namespace: str, name: str) -> PersistentVolumeClaim | None:
        """A PVC remembered from an earlier apply, or None."""
        return self._pvcs.get((namespace, name))

    @property
    def persistent_volumes(self) -> Mapping[str, PersistentVolume]:
        """The remembered PVs by name."""
        return self._pvs

    @property
    def claims(self) -> Mapping[tuple[str, str], PersistentVolumeClaim]:
        """The remembered PVCs by (namespace, name)."""
        return self._pvcs


_NO_ATTRIBUTES: dict[str, str] = {}
"""The `attributes` of every source that has none (never mutated: nothing writes into a
source's attributes, they are read or copied into a volume context)."""


def _share_strings(pod: PodAdded) -> None:
    """Make the strings many pods repeat (namespace, volume names, plugin, driver) one
    interned copy each, in place: each decoded event has its own, 24 MB at 100,000 pods.
    Sources without attributes share one empty dict (each decoded one has its own, 6 MB).

    The values do not change (the bodies stay equal to what the log holds); only which
    object holds them.
    """
    force_setattr(pod, "namespace", sys.intern(pod.namespace))
    for dv in pod.volumes:
        force_setattr(dv, "name", sys.intern(dv.name))
        source = dv.source
        force_setattr(source, "plugin", sys.intern(source.plugin))
        force_setattr(source, "driver", sys.intern(source.driver))
        if not source.attributes:
            force_setattr(source, "attributes", _NO_ATTRIBUTES)

"""Deleting stored objects, and what the engine reads back from the store at start.

`volfsm delete configmap|secret|pv|pvc|serviceaccount|clustertrustbundle|csidriver`
removes one object from the store (an ObjectDeleted in the log). A
PersistentVolume or claim that a desired pod uses is refused, as
Kubernetes' protection finalizers keep it until no pod uses it; a
ConfigMap or Secret may go at any time (what a mount of it does then is
its plugin's business). Pods are deleted with `delete pod`, which also
removes the pod from the desired state.
"""

from __future__ import annotations

from typing import Protocol

from volfsm.desired.errors import InvalidObjectError
from volfsm.desired.objects import KINDS, PersistentVolume, PersistentVolumeClaim, Pod
from volfsm.desired.plan import ObjectKey
from volfsm.objects.store import ObjectStore

KIND_NAMES: dict[str, str] = {
    **{kind.lower(): kind for kind in KINDS},
    **{kind.lower() + "s": kind for kind in KINDS},
    "pv": "PersistentVolume",
    "pvs": "PersistentVolume",
    "pvc": "PersistentVolumeClaim",
    "pvcs": "PersistentVolumeClaim",
    "cm": "ConfigMap",
    "sa": "ServiceAccount",
    "ctb": "ClusterTrustBundle",
}
"""What a user may call a kind (kubectl's names and short names) -> the kind."""


class PodUsers(Protocol):
    """What deletion asks the desired state: who uses a PV or a claim."""

    def pods_using(self, *, pv_name: str = "", claim: tuple[str, str] | None = None) -> list[str]:
        """'namespace/name' of the desired pods using it."""


def kind_named(text: str) -> str | None:
    """The kind `text` names ("configmap", "cm", "ConfigMap", "pvcs"), or None."""
    return KIND_NAMES.get(text.lower())


def object_key(kind: str, namespace: str, name: str) -> ObjectKey:
    """The store key: namespace "default" if none is given, "" for cluster-scoped kinds."""
    info = KINDS[kind]
    return (kind, (namespace or "default") if info.namespaced else "", name)


def plan_delete(
    store: ObjectStore, users: PodUsers, kind: str, namespace: str, name: str
) -> ObjectKey | None:
    """The key to delete (None: no such object). Raises for a Pod, or a PV/PVC in use."""
    if kind == "Pod":
        raise InvalidObjectError("kind", "delete pods with `delete pod`", "")
    key = object_key(kind, namespace, name)
    found = store.get(*key)
    if found is None:
        return None
    in_use: list[str] = []
    if isinstance(found.obj, PersistentVolume):
        in_use = users.pods_using(pv_name=name)
    elif isinstance(found.obj, PersistentVolumeClaim):
        in_use = users.pods_using(claim=(key[1], name))
    if in_use:
        shown = ", ".join(in_use)
        raise InvalidObjectError("", f"in use by pod {shown}; delete the pod first", found.label)
    return key


def pod_object_key(store: ObjectStore, uid: str, namespace: str, name: str) -> ObjectKey | None:
    """The store key of the pod `uid` (None if the store holds no object of that pod)."""
    found = store.get("Pod", namespace, name)
    return found.key if found is not None and found.uid == uid else None


def stored_pods(store: ObjectStore) -> list[Pod]:
    """The stored Pod objects (a pending pod is resolved again from its own)."""
    return [o.obj for o in store.objects("Pod") if isinstance(o.obj, Pod)]


def stored_volumes(
    store: ObjectStore,
) -> tuple[list[PersistentVolume], list[PersistentVolumeClaim]]:
    """The stored PVs and PVCs (what the desired state remembers across a restart)."""
    pvs = [o.obj for o in store.objects("PersistentVolume") if isinstance(o.obj, PersistentVolume)]
    pvcs = [
        o.obj
        for o in store.objects("PersistentVolumeClaim")
        if isinstance(o.obj, PersistentVolumeClaim)
    ]
    return pvs, pvcs

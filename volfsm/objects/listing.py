"""What `volfsm get configmaps|secrets|pvs|...` shows of stored objects: never a Secret's values.

Each item carries the object's name, uid, resource version, content hash
and times, a `summary` of the fields that matter on a node, and (every kind
but Secret) the whole `object`. A Secret's summary names its keys with
their sizes in bytes, and nothing else of its data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from volfsm.desired.kinds import ClusterTrustBundle, ConfigMap, CSIDriver, Secret, ServiceAccount
from volfsm.desired.objects import PersistentVolume, PersistentVolumeClaim, Pod
from volfsm.desired.quantity import format_bytes, quantity_to_bytes
from volfsm.objects.model import StoredObject
from volfsm.objects.store import ObjectStore

LISTS: dict[str, str] = {
    "configmaps": "ConfigMap",
    "secrets": "Secret",
    "persistentvolumes": "PersistentVolume",
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "csidrivers": "CSIDriver",
    "serviceaccounts": "ServiceAccount",
    "clustertrustbundles": "ClusterTrustBundle",
}
"""What `get` may list -> the kind it lists."""

SECRET_KINDS = frozenset({"Secret"})


def listing(store: ObjectStore, what: str, namespace: str | None = None) -> list[dict[str, Any]]:
    """The items of `get <what>` (a key of `LISTS`), sorted by namespace and name."""
    kind = LISTS[what]
    return [item(obj) for obj in store.objects(kind, namespace)]


def item(obj: StoredObject) -> dict[str, Any]:
    """One object as `get` shows it."""
    out: dict[str, Any] = {
        "kind": obj.kind,
        "namespace": obj.namespace,
        "name": obj.name,
        "uid": obj.uid,
        "resource_version": obj.resource_version,
        "content_hash": obj.content_hash,
        "created_us": obj.created_us,
        "updated_us": obj.updated_us,
        "summary": _summary(obj),
    }
    if obj.kind not in SECRET_KINDS:
        out["object"] = obj.raw
    return out


def _summary(obj: StoredObject) -> dict[str, Any]:
    summarize = _SUMMARIES.get(type(obj.obj))
    return summarize(obj.obj) if summarize is not None else {}


def _config_map(cm: ConfigMap) -> dict[str, Any]:
    files = cm.files()
    return {
        "keys": {key: len(value) for key, value in sorted(files.items())},
        "immutable": bool(cm.immutable),
    }


def _secret(secret: Secret) -> dict[str, Any]:
    values = secret.values()
    return {
        "type": secret.type,
        "keys": {key: len(value) for key, value in sorted(values.items())},
        "immutable": bool(secret.immutable),
    }


def _pv(pv: PersistentVolume) -> dict[str, Any]:
    csi = pv.spec.csi
    capacity = pv.spec.capacity.storage if pv.spec.capacity is not None else None
    ref = pv.spec.claim_ref
    return {
        "capacity": _size(capacity),
        "driver": csi.driver if csi is not None else "",
        "volume_handle": csi.volume_handle if csi is not None else "",
        "volume_mode": pv.spec.volume_mode,
        "access_modes": list(pv.spec.access_modes),
        "claim": f"{ref.namespace or 'default'}/{ref.name}" if ref is not None and ref.name else "",
    }


def _pvc(pvc: PersistentVolumeClaim) -> dict[str, Any]:
    status = pvc.status
    capacity = status.capacity.storage if status is not None and status.capacity else None
    return {
        "volume": pvc.spec.volume_name,
        "phase": status.phase if status is not None else "",
        "capacity": _size(capacity),
        "volume_mode": pvc.spec.volume_mode,
        "access_modes": list(pvc.spec.access_modes),
    }


def _csi_driver(driver: CSIDriver) -> dict[str, Any]:
    spec = driver.spec
    return {
        "attach_required": spec.attach_required,
        "pod_info_on_mount": spec.pod_info_on_mount,
        "fs_group_policy": spec.fs_group_policy,
        "requires_republish": spec.requires_republish,
        "token_audiences": [t.audience for t in spec.token_requests],
        "volume_lifecycle_modes": list(spec.volume_lifecycle_modes),
        "storage_capacity": spec.storage_capacity,
        "se_linux_mount": spec.se_linux_mount,
    }


def _service_account(account: ServiceAccount) -> dict[str, Any]:
    return {"automount_service_account_token": account.automount_service_account_token}


def _trust_bundle(bundle: ClusterTrustBundle) -> dict[str, Any]:
    return {
        "signer_name": bundle.spec.signer_name,
        "certificates": bundle.spec.trust_bundle.count("-----BEGIN CERTIFICATE-----"),
        "labels": dict(bundle.metadata.labels),
    }


def _pod(pod: Pod) -> dict[str, Any]:
    return {
        "service_account": pod.spec.account,
        "volumes": [v.name for v in pod.spec.volumes],
        "labels": dict(pod.metadata.labels),
    }


def _size(quantity: str | int | float | None) -> str:
    if quantity is None:
        return ""
    try:
        return format_bytes(quantity_to_bytes(quantity))
    except ValueError:
        return str(quantity)


_SUMMARIES: dict[type, Callable[[Any], dict[str, Any]]] = {
    ConfigMap: _config_map,
    Secret: _secret,
    PersistentVolume: _pv,
    PersistentVolumeClaim: _pvc,
    CSIDriver: _csi_driver,
    ServiceAccount: _service_account,
    ClusterTrustBundle: _trust_bundle,
    Pod: _pod,
}

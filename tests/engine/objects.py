"""Kubernetes-shaped objects for engine scenarios (dicts, as `VolumeEngine.apply` takes them)."""

from __future__ import annotations

from typing import Any

from volfsm.desired.resolve import csi_volume_id, empty_dir_volume_id

DRIVER = "scripted.volfsm.io"


def pv(
    name: str,
    handle: str | None = None,
    *,
    driver: str = DRIVER,
    size: str = "1Gi",
    mode: str = "Filesystem",
) -> dict[str, Any]:
    """A CSI PersistentVolume."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "csi": {"driver": driver, "volumeHandle": handle or f"handle-{name}"},
            "capacity": {"storage": size},
            "volumeMode": mode,
            "accessModes": ["ReadWriteOnce"],
        },
    }


def pvc(
    name: str,
    volume: str,
    *,
    namespace: str = "default",
    mode: str = "Filesystem",
    capacity: str | None = None,
) -> dict[str, Any]:
    """A claim bound to PersistentVolume `volume` (with status.capacity if given)."""
    status: dict[str, Any] = {"phase": "Bound"}
    if capacity is not None:
        status["capacity"] = {"storage": capacity}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"volumeName": volume, "volumeMode": mode},
        "status": status,
    }


def claim_volume(name: str, claim: str) -> dict[str, Any]:
    """A pod volume backed by a claim."""
    return {"name": name, "persistentVolumeClaim": {"claimName": claim}}


def inline_csi_volume(name: str, driver: str = DRIVER) -> dict[str, Any]:
    """An inline (ephemeral) CSI pod volume."""
    return {"name": name, "csi": {"driver": driver}}


def empty_dir_volume(
    name: str, *, medium: str = "", size_limit: str | None = None
) -> dict[str, Any]:
    """An emptyDir pod volume."""
    source: dict[str, Any] = {}
    if medium:
        source["medium"] = medium
    if size_limit is not None:
        source["sizeLimit"] = size_limit
    return {"name": name, "emptyDir": source}


def pod(
    uid: str, *volumes: dict[str, Any], name: str | None = None, namespace: str = "default"
) -> dict[str, Any]:
    """A pod with these volumes."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name or f"pod-{uid}", "namespace": namespace, "uid": uid},
        "spec": {"volumes": list(volumes)},
    }


def pv_set(
    name: str,
    *,
    size: str = "1Gi",
    mode: str = "Filesystem",
    driver: str = DRIVER,
    claim_capacity: str | None = None,
) -> list[dict[str, Any]]:
    """A PV and a claim of the same name bound to it (claim status.capacity if given)."""
    claim = pvc(name, name, mode=mode, capacity=claim_capacity)
    return [pv(name, size=size, mode=mode, driver=driver), claim]


def volume_id_of(pv_name: str, driver: str = DRIVER) -> str:
    """The engine's volume id of `pv(pv_name)`."""
    return csi_volume_id(driver, f"handle-{pv_name}")


__all__ = [
    "DRIVER",
    "claim_volume",
    "csi_volume_id",
    "empty_dir_volume",
    "empty_dir_volume_id",
    "inline_csi_volume",
    "pod",
    "pv",
    "pv_set",
    "pvc",
    "volume_id_of",
]

"""Builders of Kubernetes-shaped dicts and a stand-in for the engine's record step."""

from __future__ import annotations

import copy
from typing import Any

from events.types import Envelope, VolumeSource, schema_of, type_name
from volfsm.desired import ApplyPlan, DesiredChange, DesiredStateOfWorld

BLOCK_REFUSING_DRIVER = "fs-only.csi.example.com"
UNKNOWN_DRIVER = "missing.csi.example.com"


SERVED_PLUGINS = ("kubernetes.io/csi", "kubernetes.io/empty-dir")


def can_serve(source: VolumeSource, volume_mode: str) -> str | None:
    """A plugin check like the engine's: CSI and emptyDir only, one driver is unknown, one
    cannot do Block."""
    if source.plugin not in SERVED_PLUGINS:
        return f"no volume plugin {source.plugin!r}"
    if source.driver == UNKNOWN_DRIVER:
        return f"no CSI driver {source.driver} registered"
    if source.driver == BLOCK_REFUSING_DRIVER and volume_mode == "Block":
        return "the plugin does not support block volumes"
    return None


def pv(
    name: str = "pv-data",
    *,
    driver: str = "hostpath.csi.example.com",
    handle: str = "vol-1",
    storage: Any = "1Gi",
    mode: str | None = None,
    claim: tuple[str, str] | None = ("default", "data"),
    **csi_extra: Any,
) -> dict[str, Any]:
    """A CSI PersistentVolume dict."""
    spec: dict[str, Any] = {
        "csi": {"driver": driver, "volumeHandle": handle, **csi_extra},
        "capacity": {"storage": storage},
        "accessModes": ["ReadWriteOnce"],
    }
    if mode is not None:
        spec["volumeMode"] = mode
    if claim is not None:
        spec["claimRef"] = {
            "kind": "PersistentVolumeClaim",
            "namespace": claim[0],
            "name": claim[1],
        }
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": spec,
    }


def pvc(
    name: str = "data",
    *,
    volume: str = "pv-data",
    namespace: str = "default",
    mode: str | None = None,
    phase: str | None = "Bound",
) -> dict[str, Any]:
    """A PersistentVolumeClaim dict bound to `volume` ("" leaves it unbound)."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
    }
    if volume:
        spec["volumeName"] = volume
    if mode is not None:
        spec["volumeMode"] = mode
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "12"},
        "spec": spec,
    }
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def claim_volume(
    name: str = "data", claim: str = "data", read_only: bool = False
) -> dict[str, Any]:
    """A pod volume backed by a claim."""
    source: dict[str, Any] = {"claimName": claim}
    if read_only:
        source["readOnly"] = True
    return {"name": name, "persistentVolumeClaim": source}


def pod(
    name: str = "web",
    *,
    uid: str = "uid-web",
    namespace: str = "default",
    volumes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Pod dict (with the extra fields real pods carry, which are ignored)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "labels": {"app": name},
            "creationTimestamp": "2024-05-01T10:00:00Z",
        },
        "spec": {
            "containers": [{"name": "c", "image": "busybox"}],
            "volumes": copy.deepcopy(volumes if volumes is not None else [claim_volume()]),
        },
        "status": {"phase": "Pending"},
    }


class Recorder:
    """Records plans the way the engine does: events to envelopes, observed, objects committed."""

    def __init__(self, dsw: DesiredStateOfWorld) -> None:
        self.dsw = dsw
        self.envelopes: list[Envelope] = []
        self._versions: dict[str, int] = {}

    def record(self, changes: list[DesiredChange]) -> list[Envelope]:
        envs = []
        for change in changes:
            version = self._versions.get(change.stream, 0) + 1
            self._versions[change.stream] = version
            env = Envelope(
                seq=len(self.envelopes) + 1,
                stream=change.stream,
                version=version,
                type=type_name(change.body),
                schema=schema_of(change.body),
                ts=1_700_000_000_000_000 + len(self.envelopes),
                node="node-a",
                body=change.body,  # type: ignore[arg-type]
            )
            self.envelopes.append(env)
            self.dsw.observe(env)
            envs.append(env)
        return envs

    def apply(self, *objects: dict[str, Any]) -> ApplyPlan:
        plan = self.dsw.plan_apply(list(objects))
        self.record(plan.changes)
        self.dsw.commit_objects(plan)
        return plan


def snapshot(dsw: DesiredStateOfWorld) -> tuple[Any, ...]:
    """Everything observable about a DSW, to prove a call changed nothing."""
    return (
        dsw.generation,
        dict(dsw.pods),
        list(dsw.volumes_to_mount()),
        dict(dsw.persistent_volumes),
        dict(dsw.claims),
    )

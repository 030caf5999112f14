"""The pods a crash test mounts and unmounts: Kubernetes-shaped dicts and where they land.

Volume kinds:

* `fs`: a PV of volfsm's CSI driver (csi.volfsm.dev) in Filesystem mode:
  staged (loop device + ext4 at the staging path), published (bind mount);
* `block`: the same driver in Block mode: staged, published as a device
  file, mapped by the engine (global map bind mount, pod device link, loop
  fd lock);
* `emptydir`: a plain emptyDir directory;
* `tmpfs`: an emptyDir with medium Memory (a tmpfs mount);
* `configmap`: a configMap volume (its own ConfigMap; files on disk, the
  atomic writer's layout);
* `secret`: a secret volume (its own Secret; a tmpfs).

Each CSI volume belongs to one pod (its own PV, PVC and driver volume), so
a pod's deletion must end with its volume unstaged and its loop device gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from volfsm.desired.resolve import csi_volume_id
from volfsm.node.layout import RootLayout

DRIVER = "csi.volfsm.dev"
NAMESPACE = "crash"
KINDS = ("fs", "block", "emptydir", "tmpfs", "configmap", "secret")
OBJECT_KINDS = {"configmap": "ConfigMap", "secret": "Secret"}
OBJECT_KEY = "key"
CSI_KINDS = frozenset({"fs", "block"})
CSI_PLUGIN_DIR = "kubernetes.io~csi"
EMPTY_DIR_PLUGIN_DIR = "kubernetes.io~empty-dir"


@dataclass(frozen=True)
class Volume:
    """One volume of a pod."""

    kind: str
    name: str
    """The pod's volume name."""
    handle: str = ""
    """CSI volume handle (the driver's volume id); '' for emptyDir."""

    @property
    def csi(self) -> bool:
        """Whether volfsm's CSI driver serves it."""
        return self.kind in CSI_KINDS

    @property
    def pv(self) -> str:
        """PV name (also the PVC name and kubelet's spec name) of a CSI volume."""
        return f"pv-{self.handle}"

    @property
    def volume_id(self) -> str:
        """The engine's unique volume name of a CSI volume."""
        return csi_volume_id(DRIVER, self.handle)

    def pod_volume(self) -> dict[str, Any]:
        """The entry in the pod's spec.volumes."""
        if self.kind == "emptydir":
            return {"name": self.name, "emptyDir": {}}
        if self.kind == "tmpfs":
            return {"name": self.name, "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}
        if self.kind == "configmap":
            return {"name": self.name, "configMap": {"name": self.object_name}}
        if self.kind == "secret":
            return {"name": self.name, "secret": {"secretName": self.object_name}}
        return {"name": self.name, "persistentVolumeClaim": {"claimName": self.pv}}

    @property
    def object_name(self) -> str:
        """The ConfigMap or Secret of a configmap / secret volume."""
        return f"obj-{self.name}"

    @property
    def content(self) -> bytes:
        """What its one file holds (configmap / secret volumes)."""
        return f"content of {self.name}".encode()

    def claim_objects(self) -> list[dict[str, Any]]:
        """PV and PVC of a CSI volume, the ConfigMap or Secret of an object volume."""
        if self.kind in OBJECT_KINDS:
            data = "stringData" if self.kind == "secret" else "data"
            meta = {"namespace": NAMESPACE, "name": self.object_name}
            obj = {"apiVersion": "v1", "kind": OBJECT_KINDS[self.kind], "metadata": meta}
            return [{**obj, data: {OBJECT_KEY: self.content.decode()}}]
        if not self.csi:
            return []
        mode = "Block" if self.kind == "block" else "Filesystem"
        csi: dict[str, Any] = {"driver": DRIVER, "volumeHandle": self.handle}
        if self.kind == "fs":
            csi["fsType"] = "ext4"
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": self.pv},
            "spec": {
                "capacity": {"storage": "32Mi"},
                "volumeMode": mode,
                "accessModes": ["ReadWriteOnce"],
                "csi": csi,
                "claimRef": {
                    "kind": "PersistentVolumeClaim",
                    "namespace": NAMESPACE,
                    "name": self.pv,
                },
            },
        }
        pvc = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"namespace": NAMESPACE, "name": self.pv},
            "spec": {
                "volumeName": self.pv,
                "volumeMode": mode,
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "32Mi"}},
            },
            "status": {"phase": "Bound"},
        }
        return [pv, pvc]

    # ---------------------------------------------------------------- paths

    def pod_path(self, layout: RootLayout, uid: str) -> Path:
        """Where the pod sees it: the publish dir, the emptyDir dir or the device link."""
        if self.kind == "fs":
            return layout.csi_publish_path(uid, self.pv)
        if self.kind == "block":
            return layout.csi_block_pod_device_path(uid, self.pv)
        if self.kind in OBJECT_KINDS:
            return layout.pod_volume_dir(uid, f"kubernetes.io~{self.kind}", self.name)
        return layout.pod_volume_dir(uid, EMPTY_DIR_PLUGIN_DIR, self.name)

    def device_dirs(self, layout: RootLayout) -> list[Path]:
        """Per-volume (not per-pod) directories that must be gone once the volume is unused."""
        if self.kind == "fs":
            return [layout.csi_staging_dir(DRIVER, self.handle)]
        if self.kind == "block":
            return [
                layout.csi_block_dir(self.pv),
                layout.csi_block_staging_path(self.pv),
                layout.csi_block_publish_dir(self.pv),
            ]
        return []

    def tokens(self, layout: RootLayout) -> set[str]:
        """Path components naming this volume (to attribute a mount under the root to it)."""
        if self.kind == "fs":
            return {self.pv, layout.csi_staging_dir(DRIVER, self.handle).name}
        if self.kind == "block":
            return {self.pv}
        return set()


@dataclass
class Pod:
    """A pod and its volumes."""

    uid: str
    name: str
    volumes: list[Volume] = field(default_factory=list)

    def objects(self) -> list[dict[str, Any]]:
        """PVs, PVCs and the Pod, ready for `apply`."""
        out: list[dict[str, Any]] = []
        for vol in self.volumes:
            out.extend(vol.claim_objects())
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"namespace": NAMESPACE, "name": self.name, "uid": self.uid},
                "spec": {
                    "containers": [{"name": "c", "image": "busybox"}],
                    # only the volumes the crash matrix chose, no admission token volume
                    "automountServiceAccountToken": False,
                    "volumes": [v.pod_volume() for v in self.volumes],
                },
            }
        )
        return out

    @property
    def kinds(self) -> list[str]:
        """Its volumes' kinds."""
        return [v.kind for v in self.volumes]

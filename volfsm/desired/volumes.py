"""Pod volume sources, as msgspec Structs: every source a Pod may name is parsed.

A volume names exactly one source. `SOURCES` lists every source key of the
Kubernetes API with the kubelet plugin that serves it; whether a plugin on
this node serves it is the plugin catalog's answer (`CanServe`), so a pod
with a source nobody serves is refused with one line naming all of them,
and a new plugin lifts the refusal by registering. The sources volfsm has
plugins for (or will) are typed field by field; the others (cloud disks,
network filesystems) are kept as plain mappings: parsed, never served.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import msgspec

from volfsm.desired.meta import (
    K8s,
    KeyToPath,
    LabelSelector,
    Quantity,
    SecretReference,
)

StorageMedium: TypeAlias = str
"""'', 'Memory', 'HugePages' or 'HugePages-<page size>' (validate_volumes checks it)."""


class PersistentVolumeClaimVolumeSource(K8s, frozen=True, kw_only=True):
    """A pod volume backed by a claim."""

    claim_name: str
    read_only: bool = False


class CSIVolumeSource(K8s, frozen=True, kw_only=True):
    """An inline (ephemeral) CSI pod volume."""

    driver: str
    fs_type: str = ""
    volume_attributes: dict[str, str] = {}
    read_only: bool = False
    node_publish_secret_ref: SecretReference | None = None


class EmptyDirVolumeSource(K8s, frozen=True, kw_only=True):
    """An emptyDir pod volume: a directory, or a tmpfs with medium Memory (HugePages media
    are valid API values that no plugin here serves)."""

    medium: StorageMedium = ""
    size_limit: Quantity | None = None


class ConfigMapVolumeSource(K8s, frozen=True, kw_only=True):
    """A configMap volume: the ConfigMap's keys as files."""

    name: str = ""
    items: tuple[KeyToPath, ...] = ()
    default_mode: int | None = None
    optional: bool | None = None


class SecretVolumeSource(K8s, frozen=True, kw_only=True):
    """A secret volume: the Secret's keys as files (on tmpfs)."""

    secret_name: str = ""
    items: tuple[KeyToPath, ...] = ()
    default_mode: int | None = None
    optional: bool | None = None


class ObjectFieldSelector(K8s, frozen=True, kw_only=True):
    """downwardAPI fieldRef: a field of the pod (metadata.name, metadata.labels, ...)."""

    field_path: str
    api_version: str = "v1"


class ResourceFieldSelector(K8s, frozen=True, kw_only=True):
    """downwardAPI resourceFieldRef: a container's limit or request."""

    resource: str
    container_name: str = ""
    divisor: Quantity | None = None


class DownwardAPIVolumeFile(K8s, frozen=True, kw_only=True):
    """One downwardAPI file: a pod field or a container resource."""

    path: str
    field_ref: ObjectFieldSelector | None = None
    resource_field_ref: ResourceFieldSelector | None = None
    mode: int | None = None


class DownwardAPIVolumeSource(K8s, frozen=True, kw_only=True):
    """A downwardAPI volume."""

    items: tuple[DownwardAPIVolumeFile, ...] = ()
    default_mode: int | None = None


class ConfigMapProjection(K8s, frozen=True, kw_only=True):
    """A projected volume's configMap source."""

    name: str = ""
    items: tuple[KeyToPath, ...] = ()
    optional: bool | None = None


class SecretProjection(K8s, frozen=True, kw_only=True):
    """A projected volume's secret source."""

    name: str = ""
    items: tuple[KeyToPath, ...] = ()
    optional: bool | None = None


class DownwardAPIProjection(K8s, frozen=True, kw_only=True):
    """A projected volume's downwardAPI source."""

    items: tuple[DownwardAPIVolumeFile, ...] = ()


class ServiceAccountTokenProjection(K8s, frozen=True, kw_only=True):
    """A projected volume's serviceAccountToken source (expirationSeconds defaults to 3600)."""

    path: str
    audience: str = ""
    expiration_seconds: int | None = None


class ClusterTrustBundleProjection(K8s, frozen=True, kw_only=True):
    """A projected volume's clusterTrustBundle source: by name, or by signer and labels."""

    path: str
    name: str | None = None
    signer_name: str | None = None
    label_selector: LabelSelector | None = None
    optional: bool | None = None


class PodCertificateProjection(K8s, frozen=True, kw_only=True):
    """A projected volume's podCertificate source (alpha in the kubelet)."""

    signer_name: str
    key_type: str
    max_expiration_seconds: int | None = None
    credential_bundle_path: str = ""
    key_path: str = ""
    certificate_chain_path: str = ""
    user_annotations: dict[str, str] = {}


PROJECTION_SOURCES = (
    "configMap",
    "secret",
    "downwardAPI",
    "serviceAccountToken",
    "clusterTrustBundle",
    "podCertificate",
)


class VolumeProjection(K8s, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One entry of projected.sources: exactly one source."""

    config_map: ConfigMapProjection | None = None
    secret: SecretProjection | None = None
    downward_api: DownwardAPIProjection | None = msgspec.field(default=None, name="downwardAPI")
    service_account_token: ServiceAccountTokenProjection | None = None
    cluster_trust_bundle: ClusterTrustBundleProjection | None = None
    pod_certificate: PodCertificateProjection | None = None

    def sources(self) -> list[str]:
        """The (JSON) names of the sources this entry sets."""
        present = (
            self.config_map,
            self.secret,
            self.downward_api,
            self.service_account_token,
            self.cluster_trust_bundle,
            self.pod_certificate,
        )
        return [name for name, src in zip(PROJECTION_SOURCES, present, strict=True) if src]


class ProjectedVolumeSource(K8s, frozen=True, kw_only=True):
    """A projected volume: several sources in one directory (the service-account token)."""

    sources: tuple[VolumeProjection, ...] = ()
    default_mode: int | None = None


class HostPathVolumeSource(K8s, frozen=True, kw_only=True):
    """A hostPath volume: a path on the node, optionally type-checked."""

    path: str
    type: str | None = None


class ClaimTemplateMeta(K8s, frozen=True, kw_only=True):
    """A claim template's metadata: labels and annotations for the claim. No name: the
    claim is always <pod>-<volume> (the API server allows no other field here; volfsm
    ignores them)."""

    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}


class PersistentVolumeClaimTemplate(K8s, frozen=True, kw_only=True):
    """ephemeral.volumeClaimTemplate: the claim the ephemeral-volume controller creates."""

    metadata: ClaimTemplateMeta | None = None
    spec: dict[str, Any] = {}


class EphemeralVolumeSource(K8s, frozen=True, kw_only=True):
    """A generic ephemeral volume: a claim named <pod>-<volume>, owned by the pod."""

    volume_claim_template: PersistentVolumeClaimTemplate | None = None


class NFSVolumeSource(K8s, frozen=True, kw_only=True):
    """An NFS export."""

    server: str
    path: str
    read_only: bool = False


class ISCSIVolumeSource(K8s, frozen=True, kw_only=True):
    """An iSCSI LUN."""

    target_portal: str
    iqn: str
    lun: int
    fs_type: str = ""
    read_only: bool = False


Generic: TypeAlias = dict[str, Any] | None

SOURCES: dict[str, str] = {
    "persistentVolumeClaim": "kubernetes.io/csi",
    "csi": "kubernetes.io/csi",
    "emptyDir": "kubernetes.io/empty-dir",
    "configMap": "kubernetes.io/configmap",
    "secret": "kubernetes.io/secret",
    "downwardAPI": "kubernetes.io/downward-api",
    "projected": "kubernetes.io/projected",
    "hostPath": "kubernetes.io/host-path",
    "ephemeral": "kubernetes.io/ephemeral",
    "nfs": "kubernetes.io/nfs",
    "iscsi": "kubernetes.io/iscsi",
    "image": "kubernetes.io/image",
    "awsElasticBlockStore": "kubernetes.io/aws-ebs",
    "azureDisk": "kubernetes.io/azure-disk",
    "azureFile": "kubernetes.io/azure-file",
    "cephfs": "kubernetes.io/cephfs",
    "cinder": "kubernetes.io/cinder",
    "fc": "kubernetes.io/fc",
    "flexVolume": "kubernetes.io/flexvolume",
    "flocker": "kubernetes.io/flocker",
    "gcePersistentDisk": "kubernetes.io/gce-pd",
    "gitRepo": "kubernetes.io/git-repo",
    "glusterfs": "kubernetes.io/glusterfs",
    "photonPersistentDisk": "kubernetes.io/photon-pd",
    "portworxVolume": "kubernetes.io/portworx-volume",
    "quobyte": "kubernetes.io/quobyte",
    "rbd": "kubernetes.io/rbd",
    "scaleIO": "kubernetes.io/scaleio",
    "storageos": "kubernetes.io/storageos",
    "vsphereVolume": "kubernetes.io/vsphere-volume",
}
"""Every pod volume source key -> the kubelet plugin name that serves it."""


class Volume(K8s, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One entry of spec.volumes: a name and exactly one source."""

    name: str
    persistent_volume_claim: PersistentVolumeClaimVolumeSource | None = None
    csi: CSIVolumeSource | None = None
    empty_dir: EmptyDirVolumeSource | None = None
    config_map: ConfigMapVolumeSource | None = None
    secret: SecretVolumeSource | None = None
    downward_api: DownwardAPIVolumeSource | None = msgspec.field(default=None, name="downwardAPI")
    projected: ProjectedVolumeSource | None = None
    host_path: HostPathVolumeSource | None = None
    ephemeral: EphemeralVolumeSource | None = None
    nfs: NFSVolumeSource | None = None
    iscsi: ISCSIVolumeSource | None = None
    image: Generic = None
    aws_elastic_block_store: Generic = None
    azure_disk: Generic = None
    azure_file: Generic = None
    cephfs: Generic = None
    cinder: Generic = None
    fc: Generic = None
    flex_volume: Generic = None
    flocker: Generic = None
    gce_persistent_disk: Generic = None
    git_repo: Generic = None
    glusterfs: Generic = None
    photon_persistent_disk: Generic = None
    portworx_volume: Generic = None
    quobyte: Generic = None
    rbd: Generic = None
    scale_io: Generic = msgspec.field(default=None, name="scaleIO")
    storageos: Generic = None
    vsphere_volume: Generic = None

    def sources(self) -> list[str]:
        """The (JSON) names of the sources this volume sets."""
        return [key for key, attr in _SOURCE_ATTRS.items() if getattr(self, attr) is not None]

    def source(self) -> str:
        """The (JSON) name of its one source ("" if none)."""
        found = self.sources()
        return found[0] if found else ""


_SOURCE_ATTRS: dict[str, str] = {
    field.encode_name: field.name
    for field in msgspec.structs.fields(Volume)
    if field.encode_name != "name"
}
assert set(_SOURCE_ATTRS) == set(SOURCES), "Volume fields and SOURCES must list the same sources"

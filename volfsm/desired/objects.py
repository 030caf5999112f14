"""The Kubernetes-shaped objects volfsm accepts, as msgspec Structs, and their decoding.

A node takes Pods, PersistentVolumes, PersistentVolumeClaims and the objects
pods refer to (`volfsm.desired.kinds`); `KINDS` lists them with the
apiVersions each may carry. Objects of other kinds (Deployment, Service,
...) are not a node's business: `is_node_kind` tells them apart, and the
planner skips them.

Only the fields volfsm uses are declared; every other field a real object
carries is ignored. A pod volume is the exception: any key besides `name`
is a volume source, so unknown keys there are rejected.

`decode_object` turns one raw dict (from JSON or YAML, first settled by
`volfsm.desired.normalize`) into a Struct and msgspec's errors into
`InvalidObjectError`s naming the object and field. A pod's volumes are
decoded one by one, so every bad volume is reported at once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import msgspec

from volfsm.desired.errors import InvalidObjectError, Problems, raise_all
from volfsm.desired.kinds import (
    ClusterTrustBundle,
    ConfigMap,
    CSIDriver,
    Secret,
    ServiceAccount,
)
from volfsm.desired.meta import (
    DEFAULT_NAMESPACE,
    K8s,
    ObjectMeta,
    ObjectReference,
    PodMeta,
    Quantity,
    SecretReference,
)
from volfsm.desired.normalize import normalize
from volfsm.desired.volumes import (
    SOURCES,
    CSIVolumeSource,
    EmptyDirVolumeSource,
    PersistentVolumeClaimVolumeSource,
    Volume,
)

__all__ = [
    "DEFAULT_NAMESPACE",
    "KINDS",
    "NAMESPACED",
    "CSIDriver",
    "CSIVolumeSource",
    "ClusterTrustBundle",
    "ConfigMap",
    "EmptyDirVolumeSource",
    "KubeObject",
    "ObjectMeta",
    "ObjectReference",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "PersistentVolumeClaimVolumeSource",
    "Pod",
    "PodMeta",
    "Secret",
    "SecretReference",
    "ServiceAccount",
    "Volume",
    "decode_object",
    "is_node_kind",
    "object_label",
]

VolumeMode: TypeAlias = Literal["Filesystem", "Block"]
AccessMode: TypeAlias = Literal[
    "ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"
]


# ------------------------------------------------------------ PersistentVolume


class CSIPersistentVolumeSource(K8s, frozen=True, kw_only=True):
    """spec.csi of a PersistentVolume."""

    driver: str
    volume_handle: str
    fs_type: str = ""
    volume_attributes: dict[str, str] = {}
    read_only: bool = False
    node_stage_secret_ref: SecretReference | None = None
    node_publish_secret_ref: SecretReference | None = None


class LocalPersistentVolumeSource(K8s, frozen=True, kw_only=True):
    """spec.local of a PersistentVolume (parsed; not served)."""

    path: str
    fs_type: str = ""


class ResourceList(K8s, frozen=True, kw_only=True):
    """capacity / requests: only `storage` is used."""

    storage: Quantity | None = None


class PersistentVolumeSpec(K8s, frozen=True, kw_only=True):
    """spec of a PersistentVolume."""

    csi: CSIPersistentVolumeSource | None = None
    local: LocalPersistentVolumeSource | None = None
    host_path: dict[str, Any] | None = None
    nfs: dict[str, Any] | None = None
    iscsi: dict[str, Any] | None = None
    volume_mode: VolumeMode = "Filesystem"
    capacity: ResourceList | None = None
    access_modes: tuple[AccessMode, ...] = ()
    mount_options: tuple[str, ...] = ()
    claim_ref: ObjectReference | None = None
    storage_class_name: str = ""
    node_affinity: dict[str, Any] | None = None

    def other_source(self) -> str:
        """The (JSON) name of a non-CSI source it sets ("" if none)."""
        for name, value in (
            ("local", self.local),
            ("hostPath", self.host_path),
            ("nfs", self.nfs),
            ("iscsi", self.iscsi),
        ):
            if value is not None:
                return name
        return ""


class PersistentVolume(K8s, frozen=True, kw_only=True):
    """A cluster-scoped PersistentVolume (only CSI ones are served)."""

    api_version: str = "v1"
    kind: str = "PersistentVolume"
    metadata: ObjectMeta
    spec: PersistentVolumeSpec = msgspec.field(default_factory=PersistentVolumeSpec)

    @property
    def label(self) -> str:
        """How errors and listings name this object."""
        return f"PersistentVolume {self.metadata.name}"


# ------------------------------------------------------- PersistentVolumeClaim


class ResourceRequirements(K8s, frozen=True, kw_only=True):
    """spec.resources of a claim."""

    requests: ResourceList | None = None


class PersistentVolumeClaimSpec(K8s, frozen=True, kw_only=True):
    """spec of a PersistentVolumeClaim; bound when `volume_name` is set."""

    volume_name: str = ""
    volume_mode: VolumeMode = "Filesystem"
    access_modes: tuple[AccessMode, ...] = ()
    resources: ResourceRequirements | None = None
    storage_class_name: str | None = None


class PersistentVolumeClaimStatus(K8s, frozen=True, kw_only=True):
    """status of a claim: the phase and the capacity (the size the node last expanded to)."""

    phase: str = ""
    capacity: ResourceList | None = None


class PersistentVolumeClaim(K8s, frozen=True, kw_only=True):
    """A namespaced PersistentVolumeClaim."""

    api_version: str = "v1"
    kind: str = "PersistentVolumeClaim"
    metadata: ObjectMeta
    spec: PersistentVolumeClaimSpec = msgspec.field(default_factory=PersistentVolumeClaimSpec)
    status: PersistentVolumeClaimStatus | None = None

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, name)."""
        return (self.metadata.ns, self.metadata.name)

    @property
    def label(self) -> str:
        """How errors and listings name this object."""
        return f"PersistentVolumeClaim {self.metadata.ns}/{self.metadata.name}"


# ------------------------------------------------------------------------ Pod


class ContainerResources(K8s, frozen=True, kw_only=True):
    """A container's limits and requests (downwardAPI resourceFieldRef reads them)."""

    limits: dict[str, Quantity] = {}
    requests: dict[str, Quantity] = {}


class VolumeMount(K8s, frozen=True, kw_only=True):
    """Where a container mounts a volume (a subPath mount never sees updates)."""

    name: str
    mount_path: str = ""
    sub_path: str = ""
    sub_path_expr: str = ""
    read_only: bool = False


class Container(K8s, frozen=True, kw_only=True):
    """A container: only its name, resources and volume mounts matter to volumes."""

    name: str
    resources: ContainerResources | None = None
    volume_mounts: tuple[VolumeMount, ...] = ()


class PodSecurityContext(K8s, frozen=True, kw_only=True):
    """The pod's securityContext: fsGroup and the ids files are owned by."""

    fs_group: int | None = None
    fs_group_change_policy: str | None = None
    run_as_user: int | None = None
    run_as_group: int | None = None
    supplemental_groups: tuple[int, ...] = ()


class PodSpec(K8s, frozen=True, kw_only=True):
    """spec of a Pod: its volumes and what they are filled from."""

    volumes: tuple[Volume, ...] = ()
    node_name: str = ""
    service_account_name: str = ""
    service_account: str = ""
    """Deprecated alias of serviceAccountName."""
    automount_service_account_token: bool | None = None
    security_context: PodSecurityContext | None = None
    containers: tuple[Container, ...] = ()
    init_containers: tuple[Container, ...] = ()

    @property
    def account(self) -> str:
        """The service account the pod runs as ("default" if none is named)."""
        return self.service_account_name or self.service_account or "default"


class Pod(K8s, frozen=True, kw_only=True):
    """A Pod, keyed by metadata.uid (given at apply when the manifest has none)."""

    api_version: str = "v1"
    kind: str = "Pod"
    metadata: PodMeta
    spec: PodSpec = msgspec.field(default_factory=PodSpec)

    @property
    def label(self) -> str:
        """How errors and listings name this object."""
        return f"Pod {self.metadata.ns}/{self.metadata.name}"


KubeObject: TypeAlias = (
    PersistentVolume
    | PersistentVolumeClaim
    | Pod
    | ConfigMap
    | Secret
    | ServiceAccount
    | ClusterTrustBundle
    | CSIDriver
)


@dataclass(frozen=True)
class KindInfo:
    """A kind a node takes: its Struct, the apiVersions it may carry, whether it is namespaced."""

    cls: type[Any]
    api_versions: tuple[str, ...]
    namespaced: bool

    @property
    def api_version(self) -> str:
        """The preferred apiVersion."""
        return self.api_versions[0]


KINDS: dict[str, KindInfo] = {
    "Pod": KindInfo(Pod, ("v1",), True),
    "PersistentVolume": KindInfo(PersistentVolume, ("v1",), False),
    "PersistentVolumeClaim": KindInfo(PersistentVolumeClaim, ("v1",), True),
    "ConfigMap": KindInfo(ConfigMap, ("v1",), True),
    "Secret": KindInfo(Secret, ("v1",), True),
    "ServiceAccount": KindInfo(ServiceAccount, ("v1",), True),
    "ClusterTrustBundle": KindInfo(
        ClusterTrustBundle,
        ("certificates.k8s.io/v1beta1", "certificates.k8s.io/v1alpha1"),
        False,
    ),
    "CSIDriver": KindInfo(CSIDriver, ("storage.k8s.io/v1",), False),
}
NAMESPACED = frozenset(kind for kind, info in KINDS.items() if info.namespaced)


# -------------------------------------------------------------------- decoding


def is_node_kind(raw: object) -> bool:
    """Whether `raw` names a kind a node takes (False for Deployment, Service, ...)."""
    return isinstance(raw, Mapping) and raw.get("kind") in KINDS


def object_label(raw: Mapping[str, Any], where: str) -> str:
    """Name a raw object for errors: "Pod default/web", or `where` if it has no name."""
    kind = raw.get("kind")
    meta = raw.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(kind, str) or not isinstance(name, str) or not name:
        return f"{where} ({kind})" if isinstance(kind, str) and kind else where
    if kind in NAMESPACED or (kind not in KINDS and _has_namespace(meta)):
        namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
        ns = namespace if isinstance(namespace, str) and namespace else DEFAULT_NAMESPACE
        return f"{kind} {ns}/{name}"
    return f"{kind} {name}"


def _has_namespace(meta: object) -> bool:
    return isinstance(meta, Mapping) and isinstance(meta.get("namespace"), str)


def decode_object(raw: object, where: str) -> KubeObject:
    """Decode one raw object (normalized first). `where` names it if it has no name."""
    obj, problems = decode_object_lenient(raw, where)
    raise_all(problems)
    assert obj is not None
    return obj


def decode_object_lenient(
    raw: object, where: str
) -> tuple[KubeObject | None, list[InvalidObjectError]]:
    """An object and the problems of decoding it.

    A Pod comes back even when some of its volumes could not be decoded (see
    `decode_pod_lenient`), so that checks can go on and report the rest at
    once; any other object only when it has no problem.
    """
    if not isinstance(raw, Mapping):
        raise InvalidObjectError("", f"expected an object, got {type(raw).__name__}", where)
    label = object_label(raw, where)
    kind = raw.get("kind")
    info = KINDS.get(kind) if isinstance(kind, str) else None
    if info is None:
        supported = ", ".join(KINDS)
        raise InvalidObjectError("kind", f"unknown kind {kind!r} (supported: {supported})", label)
    api_version = raw.get("apiVersion", info.api_version)
    if api_version not in info.api_versions:
        versions = " or ".join(info.api_versions)
        raise InvalidObjectError("apiVersion", f"{kind} must have apiVersion {versions}", label)
    if info.cls is Pod:
        return decode_pod_lenient(raw, label)
    decoded: KubeObject = _convert(normalize(raw), info.cls, label)
    return decoded, []


def _convert(raw: Any, cls: type[Any], label: str, prefix: str = "") -> Any:
    try:
        return msgspec.convert(raw, type=cls)
    except msgspec.ValidationError as exc:
        path, message = split_validation_error(str(exc))
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        raise InvalidObjectError(path, message, label) from None


def decode_pod_lenient(
    raw: Mapping[str, Any], label: str
) -> tuple[Pod | None, list[InvalidObjectError]]:
    """A pod and the problems of decoding it, so that checks can go on and find the rest.

    A volume that cannot be decoded stands in the pod as an emptyDir of the
    same name (the pod is never applied: its problems are). None if the
    rest of the pod cannot be decoded.
    """
    spec = raw.get("spec")
    volumes = spec.get("volumes") if isinstance(spec, Mapping) else None
    if not isinstance(spec, Mapping) or not isinstance(volumes, list):
        problems = Problems(label)
        with problems.check():
            whole: Pod = _convert(normalize(raw), Pod, label)
            return whole, []
        return None, problems.items
    problems = Problems(label)
    decoded: list[Volume] = []
    for index, volume in enumerate(volumes):
        path = f"spec.volumes[{index}]"
        try:
            _check_volume_keys(volume, path, label)
            decoded.append(_convert(normalize(volume), Volume, label, path))
        except InvalidObjectError as exc:
            problems.add(exc)
            decoded.append(_stand_in(volume, index))
    shell = normalize({**raw, "spec": {**spec, "volumes": []}})
    pod: Pod | None = None
    with problems.check():
        pod = _convert(shell, Pod, label)
    if pod is None:
        return None, problems.items
    spec_out = msgspec.structs.replace(pod.spec, volumes=tuple(decoded))
    return msgspec.structs.replace(pod, spec=spec_out), problems.items


def _stand_in(volume: object, index: int) -> Volume:
    """What stands for a volume that could not be decoded: its name (or a made-up one)."""
    name = volume.get("name") if isinstance(volume, Mapping) else None
    if not isinstance(name, str) or not name:
        name = f"volume-{index}-undecodable"
    return Volume(name=name, empty_dir=EmptyDirVolumeSource())


def _check_volume_keys(volume: object, path: str, label: str) -> None:
    """Reject unknown volume sources and volumes with more or less than one source."""
    if not isinstance(volume, Mapping):
        return
    sources = [key for key in volume if key != "name"]
    for key in sources:
        if key not in SOURCES:
            raise InvalidObjectError(
                f"{path}.{key}", f"unknown volume source {key!r} (not a Kubernetes one)", label
            )
    if len(sources) != 1:
        found = ", ".join(sources) if sources else "none"
        raise InvalidObjectError(path, f"a volume needs exactly one source, found {found}", label)
    if volume[sources[0]] is None:
        raise InvalidObjectError(
            f"{path}.{sources[0]}", "must be an object (write {} for the defaults)", label
        )


_AT = re.compile(r"(?P<message>.*) - at `(?P<path>[^`]*)`(?: in `(?P<outer>[^`]*)`)?", re.S)
_MISSING = re.compile(r"Object missing required field `(?P<field>[^`]+)`")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")


def split_validation_error(text: str) -> tuple[str, str]:
    """msgspec's "Expected `str`, got `int` - at `$.a[1].b`" as ("a[1].b", message)."""
    match = _AT.fullmatch(text)
    if match is None:
        message, path = text, ""
    elif match["outer"] is not None:  # an error in a mapping key: "- at `key` in `$.x`"
        message, path = f"{match['message']} (in a key)", match["outer"]
    else:
        message, path = match["message"], match["path"]
    path = path.removeprefix("$").removeprefix(".")
    for pattern, plain in ((_MISSING, "required field is missing"), (_UNKNOWN, "unknown field")):
        found = pattern.match(message)
        if found:
            path = f"{path}.{found['field']}" if path else found["field"]
            message = plain
    return path, message

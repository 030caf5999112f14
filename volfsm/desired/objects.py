"""The Kubernetes-shaped objects volfsm accepts, as msgspec Structs.

Only the fields volfsm uses are declared; every other field a real
Kubernetes object carries is ignored. A pod volume is the exception: any key
besides `name` is a volume source, so unknown keys there are rejected.
`decode_object` turns one dict (from JSON or YAML) into a Struct and turns
msgspec's errors into `InvalidObjectError`s naming the object and field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal, TypeAlias

import msgspec

from volfsm.desired.errors import InvalidObjectError

Quantity: TypeAlias = str | int | float
VolumeMode: TypeAlias = Literal["Filesystem", "Block"]
AccessMode: TypeAlias = Literal[
    "ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"
]
StorageMedium: TypeAlias = Literal["", "Memory"]

DEFAULT_NAMESPACE = "default"
POD_VOLUME_SOURCES = ("persistentVolumeClaim", "csi", "emptyDir")


class _K8s(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Base: camelCase field names, unknown fields ignored."""


class ObjectMeta(_K8s, frozen=True, kw_only=True):
    """metadata of a PV or PVC (resourceVersion, labels, ... are ignored)."""

    name: str
    namespace: str = ""
    uid: str = ""

    @property
    def ns(self) -> str:
        """The namespace, "default" when none was given."""
        return self.namespace or DEFAULT_NAMESPACE


class PodMeta(_K8s, frozen=True, kw_only=True):
    """metadata of a Pod: the UID is required, it keys everything."""

    name: str
    namespace: str = ""
    uid: str

    @property
    def ns(self) -> str:
        """The namespace, "default" when none was given."""
        return self.namespace or DEFAULT_NAMESPACE


class SecretReference(_K8s, frozen=True, kw_only=True):
    """A reference to a Secret by name; volfsm never reads the secret itself."""

    name: str = ""
    namespace: str = ""


class ObjectReference(_K8s, frozen=True, kw_only=True):
    """A PV's claimRef: the claim it is bound to."""

    kind: str = ""
    namespace: str = ""
    name: str = ""
    uid: str = ""


# ------------------------------------------------------------ PersistentVolume


class CSIPersistentVolumeSource(_K8s, frozen=True, kw_only=True):
    """spec.csi of a PersistentVolume."""

    driver: str
    volume_handle: str
    fs_type: str = ""
    volume_attributes: dict[str, str] = {}
    read_only: bool = False
    node_stage_secret_ref: SecretReference | None = None
    node_publish_secret_ref: SecretReference | None = None


class ResourceList(_K8s, frozen=True, kw_only=True):
    """capacity / requests: only `storage` is used."""

    storage: Quantity | None = None


class PersistentVolumeSpec(_K8s, frozen=True, kw_only=True):
    """spec of a PersistentVolume."""

    csi: CSIPersistentVolumeSource | None = None
    volume_mode: VolumeMode = "Filesystem"
    capacity: ResourceList | None = None
    access_modes: tuple[AccessMode, ...] = ()
    mount_options: tuple[str, ...] = ()
    claim_ref: ObjectReference | None = None
    storage_class_name: str = ""


class PersistentVolume(_K8s, frozen=True, kw_only=True):
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


class ResourceRequirements(_K8s, frozen=True, kw_only=True):
    """spec.resources of a claim."""

    requests: ResourceList | None = None


class PersistentVolumeClaimSpec(_K8s, frozen=True, kw_only=True):
    """spec of a PersistentVolumeClaim; bound when `volume_name` is set."""

    volume_name: str = ""
    volume_mode: VolumeMode = "Filesystem"
    access_modes: tuple[AccessMode, ...] = ()
    resources: ResourceRequirements | None = None
    storage_class_name: str | None = None


class PersistentVolumeClaimStatus(_K8s, frozen=True, kw_only=True):
    """status of a claim: the phase and the capacity (the size the node last expanded to)."""

    phase: str = ""
    capacity: ResourceList | None = None


class PersistentVolumeClaim(_K8s, frozen=True, kw_only=True):
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


class PersistentVolumeClaimVolumeSource(_K8s, frozen=True, kw_only=True):
    """A pod volume backed by a claim."""

    claim_name: str
    read_only: bool = False


class CSIVolumeSource(_K8s, frozen=True, kw_only=True):
    """An inline (ephemeral) CSI pod volume."""

    driver: str
    fs_type: str = ""
    volume_attributes: dict[str, str] = {}
    read_only: bool = False
    node_publish_secret_ref: SecretReference | None = None


class EmptyDirVolumeSource(_K8s, frozen=True, kw_only=True):
    """An emptyDir pod volume: a directory, or a tmpfs with medium Memory."""

    medium: StorageMedium = ""
    size_limit: Quantity | None = None


class Volume(_K8s, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One entry of spec.volumes: a name and exactly one source."""

    name: str
    persistent_volume_claim: PersistentVolumeClaimVolumeSource | None = None
    csi: CSIVolumeSource | None = None
    empty_dir: EmptyDirVolumeSource | None = None

    def sources(self) -> list[str]:
        """The (JSON) names of the sources this volume sets."""
        present = (self.persistent_volume_claim, self.csi, self.empty_dir)
        return [name for name, src in zip(POD_VOLUME_SOURCES, present, strict=True) if src]


class PodSpec(_K8s, frozen=True, kw_only=True):
    """spec of a Pod: only the volumes matter here."""

    volumes: tuple[Volume, ...] = ()
    node_name: str = ""


class Pod(_K8s, frozen=True, kw_only=True):
    """A Pod, keyed by metadata.uid."""

    api_version: str = "v1"
    kind: str = "Pod"
    metadata: PodMeta
    spec: PodSpec = msgspec.field(default_factory=PodSpec)

    @property
    def label(self) -> str:
        """How errors and listings name this object."""
        return f"Pod {self.metadata.ns}/{self.metadata.name}"


KubeObject: TypeAlias = PersistentVolume | PersistentVolumeClaim | Pod

KINDS: dict[str, type[PersistentVolume] | type[PersistentVolumeClaim] | type[Pod]] = {
    "PersistentVolume": PersistentVolume,
    "PersistentVolumeClaim": PersistentVolumeClaim,
    "Pod": Pod,
}
NAMESPACED = frozenset({"PersistentVolumeClaim", "Pod"})


# -------------------------------------------------------------------- decoding


def object_label(raw: Mapping[str, Any], where: str) -> str:
    """Name a raw object for errors: "Pod default/web", or `where` if it has no name."""
    kind = raw.get("kind")
    meta = raw.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(kind, str) or not isinstance(name, str) or not name:
        return f"{where} ({kind})" if isinstance(kind, str) and kind else where
    if kind in NAMESPACED:
        namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
        ns = namespace if isinstance(namespace, str) and namespace else DEFAULT_NAMESPACE
        return f"{kind} {ns}/{name}"
    return f"{kind} {name}"


def decode_object(raw: object, where: str) -> KubeObject:
    """Decode one raw object. `where` names it if it has no name ("objects[3]")."""
    if not isinstance(raw, Mapping):
        raise InvalidObjectError("", f"expected an object, got {type(raw).__name__}", where)
    label = object_label(raw, where)
    kind = raw.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        supported = ", ".join(KINDS)
        raise InvalidObjectError("kind", f"unknown kind {kind!r} (supported: {supported})", label)
    api_version = raw.get("apiVersion", "v1")
    if api_version != "v1":
        raise InvalidObjectError("apiVersion", f"{kind} must have apiVersion v1", label)
    if cls is Pod:
        _check_pod_volume_keys(raw, label)
    try:
        return msgspec.convert(raw, type=cls)
    except msgspec.ValidationError as exc:
        path, message = split_validation_error(str(exc))
        raise InvalidObjectError(path, message, label) from None


def _check_pod_volume_keys(raw: Mapping[str, Any], label: str) -> None:
    """Reject unknown volume sources and volumes with more or less than one source."""
    spec = raw.get("spec")
    volumes = spec.get("volumes") if isinstance(spec, Mapping) else None
    if not isinstance(volumes, list):
        return
    for index, volume in enumerate(volumes):
        if not isinstance(volume, Mapping):
            continue
        path = f"spec.volumes[{index}]"
        sources = [key for key in volume if key != "name"]
        for key in sources:
            if key not in POD_VOLUME_SOURCES:
                raise InvalidObjectError(
                    f"{path}.{key}",
                    f"unsupported volume source {key!r} "
                    f"(supported: {', '.join(POD_VOLUME_SOURCES)})",
                    label,
                )
        if len(sources) != 1:
            found = ", ".join(sources) if sources else "none"
            raise InvalidObjectError(
                path, f"a volume needs exactly one source, found {found}", label
            )
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

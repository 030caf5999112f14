"""The objects pods refer to: ConfigMap, Secret, ServiceAccount, ClusterTrustBundle, CSIDriver.

Defaults are the API server's (a CSIDriver without `attachRequired` needs
attaching, its fsGroupPolicy is ReadWriteOnceWithFSType, ...), so what is
stored is what a kubelet would read back from its API server.
"""

from __future__ import annotations

import base64
import binascii
from typing import Literal, TypeAlias

import msgspec

from volfsm.desired.meta import K8s, LocalObjectReference, ObjectMeta, ObjectReference

FSGroupPolicy: TypeAlias = Literal["None", "File", "ReadWriteOnceWithFSType"]
LifecycleMode: TypeAlias = Literal["Persistent", "Ephemeral"]


class ConfigMap(K8s, frozen=True, kw_only=True):
    """A namespaced ConfigMap: text `data` and base64 `binaryData`."""

    api_version: str = "v1"
    kind: str = "ConfigMap"
    metadata: ObjectMeta
    data: dict[str, str] = {}
    binary_data: dict[str, str] = {}
    immutable: bool | None = None

    @property
    def label(self) -> str:
        """How errors and listings name this object."""
        return f"ConfigMap {self.metadata.ns}/{self.metadata.name}"

    def files(self) -> dict[str, bytes]:
        """Every key's bytes (data as UTF-8, binaryData decoded); call on a validated object."""
        out = {key: value.encode() for key, value in self.data.items()}
        out.update({key: b64decode(value) for key, value in self.binary_data.items()})
        return out


class Secret(K8s, frozen=True, kw_only=True):
    """A namespaced Secret: base64 `data`, plus write-only `stringData` merged over it."""

    api_version: str = "v1"
    kind: str = "Secret"
    metadata: ObjectMeta
    type: str = "Opaque"
    data: dict[str, str] = {}
    string_data: dict[str, str] = {}
    immutable: bool | None = None

    @property
    def label(self) -> str:
        """How errors and listings name this object."""
        return f"Secret {self.metadata.ns}/{self.metadata.name}"

    def values(self) -> dict[str, bytes]:
        """The decoded values: `data`, with `stringData` winning (the API server's merge)."""
        out = {key: b64decode(value) for key, value in self.data.items()}
        out.update({key: value.encode() for key, value in self.string_data.items()})
        return out


class ServiceAccount(K8s, frozen=True, kw_only=True):
    """A namespaced ServiceAccount (tokens are asked for in its name)."""

    api_version: str = "v1"
    kind: str = "ServiceAccount"
    metadata: ObjectMeta
    automount_service_account_token: bool | None = None
    secrets: tuple[ObjectReference, ...] = ()
    image_pull_secrets: tuple[LocalObjectReference, ...] = ()

    @property
    def label(self) -> str:
        """How errors and listings name this object."""
        return f"ServiceAccount {self.metadata.ns}/{self.metadata.name}"


class ClusterTrustBundleSpec(K8s, frozen=True, kw_only=True):
    """spec of a ClusterTrustBundle: PEM certificates, optionally tied to a signer."""

    trust_bundle: str
    signer_name: str = ""


class ClusterTrustBundle(K8s, frozen=True, kw_only=True):
    """A cluster-scoped ClusterTrustBundle (certificates.k8s.io v1alpha1 / v1beta1)."""

    api_version: str = "certificates.k8s.io/v1beta1"
    kind: str = "ClusterTrustBundle"
    metadata: ObjectMeta
    spec: ClusterTrustBundleSpec

    @property
    def label(self) -> str:
        """How errors and listings name this object."""
        return f"ClusterTrustBundle {self.metadata.name}"


class TokenRequest(K8s, frozen=True, kw_only=True):
    """A CSIDriver tokenRequests entry: a token for `audience` ("" = the API server's)."""

    audience: str
    expiration_seconds: int | None = None


class CSIDriverSpec(K8s, frozen=True, kw_only=True):
    """spec of a CSIDriver, with the API server's defaults."""

    attach_required: bool = True
    pod_info_on_mount: bool = False
    fs_group_policy: FSGroupPolicy = "ReadWriteOnceWithFSType"
    requires_republish: bool = False
    token_requests: tuple[TokenRequest, ...] = ()
    volume_lifecycle_modes: tuple[LifecycleMode, ...] = ("Persistent",)
    storage_capacity: bool = False
    se_linux_mount: bool = False
    node_allocatable_update_period_seconds: int | None = None

    def __post_init__(self) -> None:
        if not self.volume_lifecycle_modes:  # the API server's default for an empty list
            msgspec.structs.force_setattr(self, "volume_lifecycle_modes", ("Persistent",))


class CSIDriver(K8s, frozen=True, kw_only=True):
    """A cluster-scoped CSIDriver (storage.k8s.io/v1): how the node treats a driver."""

    api_version: str = "storage.k8s.io/v1"
    kind: str = "CSIDriver"
    metadata: ObjectMeta
    spec: CSIDriverSpec = msgspec.field(default_factory=CSIDriverSpec)

    @property
    def label(self) -> str:
        """How errors and listings name this object."""
        return f"CSIDriver {self.metadata.name}"


def b64decode(text: str) -> bytes:
    """Base64 as Go's encoding/json reads []byte: standard alphabet, padded, newlines ignored.

    Raises ValueError without the text (it may be a secret).
    """
    try:
        return base64.b64decode(text.replace("\n", "").replace("\r", ""), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not valid base64") from None

"""Typed views of stored objects, as the volume plugins read them.

A view carries the object's identity and version (uid, resource version,
content hash: what a plugin records about what it wrote) and the content
already decoded: a ConfigMap's files as bytes, a Secret's values as bytes.
A `SecretData`'s repr never shows a value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from volfsm.desired.kinds import ClusterTrustBundle, ConfigMap, Secret
from volfsm.desired.meta import LabelSelector
from volfsm.objects.model import StoredObject


@dataclass(frozen=True)
class Version:
    """Which version of an object: what a mount records having written."""

    uid: str
    resource_version: int
    content_hash: str

    @classmethod
    def of(cls, stored: StoredObject) -> Version:
        """The version of a stored object."""
        return cls(stored.uid, stored.resource_version, stored.content_hash)


@dataclass(frozen=True)
class ConfigMapData:
    """A ConfigMap's keys: `data` (text) and `binary_data` (decoded), and its version."""

    namespace: str
    name: str
    version: Version
    data: Mapping[str, str]
    binary_data: Mapping[str, bytes]
    immutable: bool

    def files(self) -> dict[str, bytes]:
        """Every key as the bytes of its file (what a volume without `items` holds)."""
        out = {key: value.encode() for key, value in self.data.items()}
        out.update(self.binary_data)
        return out


@dataclass(frozen=True)
class SecretData:
    """A Secret's decoded values and its version. Its repr names keys, never values."""

    namespace: str
    name: str
    version: Version
    type: str
    data: Mapping[str, bytes] = field(repr=False)
    immutable: bool

    def __repr__(self) -> str:
        keys = ", ".join(sorted(self.data))
        return (
            f"SecretData({self.namespace}/{self.name}, rv={self.version.resource_version}, "
            f"type={self.type}, keys=[{keys}])"
        )


def config_map_data(stored: StoredObject) -> ConfigMapData:
    """The view of a stored ConfigMap."""
    cm = stored.obj
    assert isinstance(cm, ConfigMap)
    files = cm.files()
    return ConfigMapData(
        namespace=stored.namespace,
        name=stored.name,
        version=Version.of(stored),
        data=dict(cm.data),
        binary_data={key: files[key] for key in cm.binary_data},
        immutable=bool(cm.immutable),
    )


def secret_data(stored: StoredObject) -> SecretData:
    """The view of a stored Secret."""
    secret = stored.obj
    assert isinstance(secret, Secret)
    return SecretData(
        namespace=stored.namespace,
        name=stored.name,
        version=Version.of(stored),
        type=secret.type,
        data=secret.values(),
        immutable=bool(secret.immutable),
    )


def bundles_by_signer(
    stored: list[StoredObject], signer_name: str, selector: LabelSelector | None
) -> list[StoredObject]:
    """ClusterTrustBundles of `signer_name` whose labels `selector` matches.

    As the kubelet: a None selector matches nothing, an empty one everything.
    """
    if selector is None:
        return []
    found = []
    for obj in stored:
        bundle = obj.obj
        if not isinstance(bundle, ClusterTrustBundle) or bundle.spec.signer_name != signer_name:
            continue
        if selector.matches(bundle.metadata.labels):
            found.append(obj)
    return found

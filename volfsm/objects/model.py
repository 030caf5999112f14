"""What the object store holds and tells: stored objects, pending writes, changes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from volfsm.desired.objects import KubeObject
from volfsm.desired.plan import ObjectKey


@dataclass(frozen=True)
class StoredObject:
    """One object as the store holds it.

    `raw` is the object as applied and completed (uid, namespace,
    metadata.resourceVersion; a Secret's values base64 in `data`), `obj` the
    same decoded. Its repr never shows `raw` or `obj` (a Secret's values).
    """

    kind: str
    namespace: str
    name: str
    uid: str
    resource_version: int
    content_hash: str
    raw: Mapping[str, Any]
    obj: KubeObject
    created_us: int
    updated_us: int

    @property
    def key(self) -> ObjectKey:
        """(kind, namespace, name)."""
        return (self.kind, self.namespace, self.name)

    @property
    def label(self) -> str:
        """'ConfigMap default/app', 'CSIDriver csi.example.com'."""
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"

    def __repr__(self) -> str:
        return (
            f"StoredObject({self.label}, uid={self.uid}, rv={self.resource_version}, "
            f"{self.content_hash})"
        )


@dataclass(frozen=True)
class StoreWrite:
    """One change written to the store and not yet published (nor, maybe, logged)."""

    key: ObjectKey
    before: StoredObject | None
    after: StoredObject | None
    """None: the change deletes the object."""
    resource_version: int
    action: str
    """created, configured, replaced or deleted."""

    @property
    def deleted(self) -> bool:
        """Whether the change deletes the object."""
        return self.after is None


@dataclass(frozen=True)
class ObjectChange:
    """What listeners are told after a change is logged: which object, which version.

    Which pods refer to the object is the listener's business.
    """

    kind: str
    namespace: str
    name: str
    uid: str
    resource_version: int
    content_hash: str
    deleted: bool

    @property
    def key(self) -> ObjectKey:
        """(kind, namespace, name)."""
        return (self.kind, self.namespace, self.name)

"""The versions of the node's stored objects, as the log records them.

A fold of ObjectApplied / ObjectDeleted: for each object (kind, namespace,
name) every version with its resource version, content hash, key names
and when it was recorded. `version_at` says which version was current at
a moment, so a replay can tell which version of a ConfigMap a pod had
mounted when (a mount records the resource version it wrote).

Imports only `events`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from events.types import Envelope, ObjectApplied, ObjectDeleted

ObjectKey = tuple[str, str, str]
"""(kind, namespace, name); namespace "" for cluster-scoped kinds."""


@dataclass(frozen=True, slots=True)
class ObjectVersion:
    """One recorded change of an object (`deleted`: it was deleted then)."""

    kind: str
    namespace: str
    name: str
    uid: str
    resource_version: int
    content_hash: str
    action: str
    seq: int
    ts_us: int
    keys: tuple[str, ...] = ()
    deleted: bool = False
    reason: str = ""

    @property
    def key(self) -> ObjectKey:
        """(kind, namespace, name)."""
        return (self.kind, self.namespace, self.name)


def object_label(kind: str, namespace: str, name: str) -> str:
    """'configmap default/app', 'csidriver csi.example.com'."""
    where = f"{namespace}/{name}" if namespace else name
    return f"{kind.lower()} {where}"


def short_hash(content_hash: str) -> str:
    """'sha256:0123456789ab' (the first 12 hex digits)."""
    algorithm, _, digest = content_hash.partition(":")
    return f"{algorithm}:{digest[:12]}" if digest else content_hash


def object_text(body: ObjectApplied | ObjectDeleted) -> str:
    """How replay words an object event (never a value: there is none in the log)."""
    if isinstance(body, ObjectDeleted):
        text = f"object deleted (uid {body.uid}, rv {body.resource_version})"
    else:
        text = (
            f"object {body.action} (uid {body.uid}, rv {body.resource_version}, "
            f"{short_hash(body.content_hash)})"
        )
        if body.keys:
            text += f"; keys: {', '.join(body.keys)}"
    if body.reason:
        text += f"; {body.reason}"
    return text


def version_of(env: Envelope) -> ObjectVersion | None:
    """The version an object event records (None for other events)."""
    body = env.body
    if isinstance(body, ObjectApplied):
        return ObjectVersion(
            body.kind,
            body.namespace,
            body.name,
            body.uid,
            body.resource_version,
            body.content_hash,
            body.action,
            env.seq,
            env.ts,
            body.keys,
            reason=body.reason,
        )
    if isinstance(body, ObjectDeleted):
        return ObjectVersion(
            body.kind,
            body.namespace,
            body.name,
            body.uid,
            body.resource_version,
            "",
            "deleted",
            env.seq,
            env.ts,
            deleted=True,
            reason=body.reason,
        )
    return None


@dataclass
class ObjectVersions:
    """Every object's versions, in log order. Feed envelopes in `seq` order."""

    history: dict[ObjectKey, list[ObjectVersion]] = field(default_factory=dict)

    def apply(self, env: Envelope) -> None:
        """Fold one envelope (events that are not object events are ignored)."""
        version = version_of(env)
        if version is not None:
            self.history.setdefault(version.key, []).append(version)

    def current(self, key: ObjectKey) -> ObjectVersion | None:
        """The object's last recorded version (None if never recorded or deleted)."""
        found = self.history.get(key)
        last = found[-1] if found else None
        return last if last is not None and not last.deleted else None

    def version_at(self, key: ObjectKey, seq: int) -> ObjectVersion | None:
        """The version current just after `seq` (None: none yet, or deleted by then)."""
        current = None
        for version in self.history.get(key, ()):
            if version.seq > seq:
                break
            current = version
        return current if current is not None and not current.deleted else None

    def with_version(self, key: ObjectKey, resource_version: int) -> ObjectVersion | None:
        """The version with that resource version (what a mount says it wrote)."""
        for version in self.history.get(key, ()):
            if version.resource_version == resource_version and not version.deleted:
                return version
        return None


def fold_versions(envelopes: Iterable[Envelope]) -> ObjectVersions:
    """The versions recorded in `envelopes`."""
    versions = ObjectVersions()
    for env in envelopes:
        versions.apply(env)
    return versions

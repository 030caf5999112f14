"""The event-log side of the object store: the events a write records, and reading them back.

An ObjectApplied / ObjectDeleted names the object, its uid, the store's
resource version and the content hash; for a ConfigMap or Secret also its
keys. Never a value.
"""

from __future__ import annotations

from events.log import EventLog
from events.streams import object_stream
from events.types import Body, ObjectApplied, ObjectDeleted
from volfsm.desired.kinds import ConfigMap, Secret
from volfsm.desired.plan import DesiredChange, ObjectKey
from volfsm.objects.model import StoredObject, StoreWrite
from volfsm.objects.store import LastEvent


def data_keys(obj: StoredObject) -> tuple[str, ...]:
    """A ConfigMap's or Secret's keys, sorted (() for other kinds)."""
    found = obj.obj
    if isinstance(found, ConfigMap):
        return tuple(sorted({*found.data, *found.binary_data}))
    if isinstance(found, Secret):
        return tuple(sorted({*found.data, *found.string_data}))
    return ()


def event_of(write: StoreWrite, reason: str = "") -> Body:
    """The event recording one write."""
    kind, namespace, name = write.key
    if write.after is None:
        assert write.before is not None
        return ObjectDeleted(
            kind=kind,
            namespace=namespace,
            name=name,
            uid=write.before.uid,
            resource_version=write.resource_version,
            reason=reason,
        )
    after = write.after
    return ObjectApplied(
        kind=kind,
        namespace=namespace,
        name=name,
        uid=after.uid,
        resource_version=write.resource_version,
        content_hash=after.content_hash,
        action=write.action,
        keys=data_keys(after),
        reason=reason,
    )


def changes_of(writes: list[StoreWrite], reason: str = "") -> list[DesiredChange]:
    """The events of `writes`, each on its object's stream."""
    return [DesiredChange(object_stream(*w.key), event_of(w, reason)) for w in writes]


NO_RECORD = "recorded at start: the log had no record of it (a new, lost or restored log)"


def recorded_at_start(objects: list[StoredObject], reason: str) -> list[DesiredChange]:
    """ObjectApplied events for objects the store holds and the log does not record."""
    return [
        DesiredChange(
            object_stream(*obj.key),
            ObjectApplied(
                kind=obj.kind,
                namespace=obj.namespace,
                name=obj.name,
                uid=obj.uid,
                resource_version=obj.resource_version,
                content_hash=obj.content_hash,
                action="created",
                keys=data_keys(obj),
                reason=reason,
            ),
        )
        for obj in objects
    ]


def last_event_in(log: EventLog) -> LastEvent:
    """What `log` last recorded for an object: (event type, resource version), or None."""

    def last(key: ObjectKey) -> tuple[str, int] | None:
        envs = log.read_stream(object_stream(*key))
        if not envs:
            return None
        body = envs[-1].body
        if isinstance(body, ObjectApplied | ObjectDeleted):
            return (envs[-1].type, body.resource_version)
        return None

    return last

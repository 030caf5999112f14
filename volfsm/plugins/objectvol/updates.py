"""Updates reach running pods: object changes and token refreshes become remounts.

The kubelet remounts configMap, secret, downwardAPI and projected volumes
on every pod sync (about once a minute) and rewrites the files whose
objects changed. volfsm is event-woken instead: `ObjectUpdates` subscribes
to the object store and, for each change, asks the engine to remount
exactly the volumes that show the changed object (a ConfigMap or Secret
they read, the pod itself for downward API items, any ClusterTrustBundle
for a bundle projection). A token's refresh time (80% of its life or 24 h)
or a pod certificate's (its signer's beginRefreshAt) arms a timer that asks for the
same. Each remount is a mount operation in the log (OperationStarted /
VolumeMounted with the versions written / OperationSucceeded or
OperationFailed) and counted on /metrics. At start,
`remount_all` remounts them all once, as the kubelet's first pod sync after
a restart does: an update a crash cut short, or a change made while the
service was down, reaches the files.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from typing import Protocol

from volfsm.desired.dsw import DesiredStateOfWorld
from volfsm.desired.objects import Pod
from volfsm.desired.volumes import Volume
from volfsm.objects import ObjectChange, ObjectStore
from volfsm.plugins.objectvol.plugin import OBJECT_PLUGINS, ObjectVolumes

ObjectRef = tuple[str, str, str]
"""(kind, namespace, name); name "*" for any object of the kind."""


class Remounter(Protocol):
    """The engine, as far as updates need it."""

    def remount_volumes(self, uid: str, names: Collection[str]) -> int:
        """Ask for SetUp again on these volumes of a desired pod."""

    @property
    def dsw(self) -> DesiredStateOfWorld:
        """The desired state (its pods by uid)."""


def volume_refs(pod: Pod, volume: Volume) -> set[ObjectRef]:
    """The objects a volume's files are made from."""
    ns, refs = pod.metadata.ns, set[ObjectRef]()
    own: ObjectRef = ("Pod", ns, pod.metadata.name)
    if volume.config_map is not None:
        refs.add(("ConfigMap", ns, volume.config_map.name))
    elif volume.secret is not None:
        refs.add(("Secret", ns, volume.secret.secret_name))
    elif volume.downward_api is not None:
        refs.add(own)
    elif volume.projected is not None:
        for src in volume.projected.sources:
            if src.config_map is not None:
                refs.add(("ConfigMap", ns, src.config_map.name))
            elif src.secret is not None:
                refs.add(("Secret", ns, src.secret.name))
            elif src.downward_api is not None:
                refs.add(own)
            elif src.cluster_trust_bundle is not None:
                refs.add(("ClusterTrustBundle", "", "*"))
    return refs


def _matches(refs: set[ObjectRef], changed: set[ObjectRef]) -> bool:
    return any(r in changed or (r[2] == "*" and (r[0], r[1]) in _kinds(changed)) for r in refs)


def _kinds(changed: set[ObjectRef]) -> set[tuple[str, str]]:
    return {(kind, ns) for kind, ns, _ in changed}


class ObjectUpdates:
    """Subscribes to the store; remounts the volumes a change shows; arms token refreshes."""

    def __init__(
        self,
        store: ObjectStore,
        engine: Remounter,
        shared: ObjectVolumes,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.store = store
        self.engine = engine
        self.loop = loop
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._unsubscribe = store.subscribe(self.on_changes)
        shared.remount_at = self.remount_at

    def close(self) -> None:
        """Stop listening and cancel the timers."""
        self._unsubscribe()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def on_changes(self, changes: list[ObjectChange]) -> None:
        """A store listener: remount every pod volume showing a changed object."""
        changed = {(c.kind, c.namespace, c.name) for c in changes}
        pods = {s.uid: s.obj for s in self.store.objects("Pod") if isinstance(s.obj, Pod)}
        for uid, desired in self.engine.dsw.pods.items():
            names = {dv.name for dv in desired.volumes if dv.source.plugin in OBJECT_PLUGINS}
            pod = pods.get(uid)
            if not names or pod is None:
                continue
            hit = [
                v.name
                for v in pod.spec.volumes
                if v.name in names and _matches(volume_refs(pod, v), changed)
            ]
            if hit:
                self.engine.remount_volumes(uid, hit)

    def remount_all(self) -> int:
        """Remount every object volume of every desired pod, once (the kubelet's first pod
        sync after a restart): an update a crash interrupted, or a change while down, lands."""
        marked = 0
        for uid, desired in self.engine.dsw.pods.items():
            names = {dv.name for dv in desired.volumes if dv.source.plugin in OBJECT_PLUGINS}
            if names:
                marked += self.engine.remount_volumes(uid, names)
        return marked

    def remount_at(self, uid: str, volume: str, when: float) -> None:
        """Remount (uid, volume) at unix time `when`; callable from any thread."""
        self.loop.call_soon_threadsafe(self._arm, uid, volume, when)

    def _arm(self, uid: str, volume: str, when: float) -> None:
        key = (uid, volume)
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()
        delay = max(0.0, when - time.time())
        self._timers[key] = self.loop.call_later(delay, self._due, uid, volume)

    def _due(self, uid: str, volume: str) -> None:
        self._timers.pop((uid, volume), None)
        self.engine.remount_volumes(uid, [volume])

"""Lookups the reconciler needs per volume and per pod, kept up to date from the events.

The ASW is keyed by stream; the reconciler asks "who may still have volume
V mounted", "which spec do I unmount pod P's volume with" and "is pod P
gone". The index answers those with dict lookups. It is fed every envelope
(at start from the log fold, then live), so after a restart it knows, from
the log, the full spec of every volume still mounted, including pods that
were deleted while the engine was down. The kubelet rebuilds a partial spec
from directory names instead (reference §4).

Memory: specs of desired pods are the DSW's; the index keeps only the specs
of pods and volumes that are no longer desired but may still be on the node,
and one small list per volume that some pod holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec

from events.tables import MOUNTED, UNCERTAIN
from events.types import (
    EVENT_TYPES,
    Body,
    DesiredVolume,
    DeviceDetached,
    Envelope,
    PodAdded,
    PodCleanedUp,
    PodPending,
    PodRemoved,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeUnmounted,
)

PodVolumeKey = tuple[str, str]
"""(pod uid, volume name)"""

HOLDING = frozenset({MOUNTED, UNCERTAIN})
"""Pod-volume states that may have the volume mounted (kubelet's GetAllMountedVolumes)."""


class IndexSnapshot(msgspec.Struct, array_like=True, frozen=True):
    """The index's folded state, as a snapshot stores it."""

    removed_pods: dict[str, PodAdded] = {}
    removed_volumes: dict[str, DesiredVolume] = {}
    holders: dict[str, list[PodVolumeKey]] = {}
    detached_versions: dict[str, int] = {}


class DesiredPods(Protocol):
    """What the index reads from the DSW."""

    @property
    def pods(self) -> Mapping[str, PodAdded]:
        """Desired pods by uid."""

    def pods_on_volume(self, volume_id: str) -> list[str]:
        """UIDs of the pods that want the volume."""

    def only_user(self, volume_id: str, pod_uid: str) -> bool:
        """Whether `pod_uid` is the one pod that wants the volume."""


class EngineIndex:
    """Who holds each volume, and the specs of what is no longer desired."""

    def __init__(self, desired: DesiredPods) -> None:
        self.desired = desired
        self.removed_pods: dict[str, PodAdded] = {}
        """Pods no longer desired whose volumes may still be mounted (until cleaned up)."""
        self.removed_volumes: dict[str, DesiredVolume] = {}
        """Specs of volumes no pod wants any more (kept while a device record may exist)."""
        self.holders: dict[str, list[PodVolumeKey]] = {}
        """volume_id -> pod-volumes on it that are Mounted or Uncertain."""
        self.held: dict[PodVolumeKey, int] = {}
        """`holders` by pod-volume: (pod uid, volume name) -> on how many volumes it is held
        (whether a pod-volume is held is one lookup: the screen's columns ask it)."""
        self.detached_versions: dict[str, int] = {}
        """volume_id -> version of its device stream when it was detached (the ASW drops it);
        not kept for a pod's own volumes (inline, emptyDir), never attached again."""
        self.handlers = self._handlers()
        """Body type -> its fold (`apply_body` dispatches on it; big folds call it directly)."""

    # ---------------------------------------------------------------- feeding

    def apply(self, env: Envelope) -> tuple[str, ...]:
        """Fold one envelope; the volume ids whose desired state it changed.

        Desired-state events must reach the index before the DSW observes them.
        """
        return self.apply_body(env.body, env.version)

    def apply_body(self, body: Body, version: int) -> tuple[str, ...]:
        """`apply` of an event body and its stream version (big folds need no envelope)."""
        handler = self.handlers.get(type(body))
        return handler(body, version) if handler is not None else ()

    def _handlers(self) -> dict[type, Callable[[Any, int], tuple[str, ...]]]:
        """Body type -> what folding it does (types not listed change nothing here)."""
        out: dict[type, Callable[[Any, int], tuple[str, ...]]] = {}
        for cls in EVENT_TYPES.values():
            if cls.KIND == "desired":
                out[cls] = self._on_desired
        out.update(
            {
                VolumeMounted: self._on_held,
                VolumeMountUncertain: self._on_held,
                VolumeUnmounted: self._on_released,
                PodAdded: self._on_pod_added,
                PodRemoved: self._on_pod_removed,
                PodCleanedUp: self._on_pod_cleaned_up,
                PodPending: self._on_pod_pending,
                DeviceDetached: self._on_detached,
            }
        )
        return out

    def _on_held(self, body: VolumeMounted | VolumeMountUncertain, _: int) -> tuple[str, ...]:
        self._hold(*self._shared_key(body.volume_id, body.pod_uid, body.volume_name))
        return ()

    def _shared_key(self, vid: str, uid: str, name: str) -> tuple[str, PodVolumeKey]:
        """(vid, (uid, name)) made of the desired pod's strings where it wants that volume:
        100,000 held entries then keep no copies of their own."""
        pod = self.desired.pods.get(uid)
        if pod is not None:
            for dv in pod.volumes:
                if dv.name == name and dv.volume_id == vid:
                    return dv.volume_id, (pod.pod_uid, dv.name)
        return vid, (uid, name)

    def _on_released(self, body: VolumeUnmounted, _: int) -> tuple[str, ...]:
        self._release(body.volume_id, (body.pod_uid, body.volume_name))
        return ()

    def _on_pod_added(self, body: PodAdded, _: int) -> tuple[str, ...]:
        self.removed_pods.pop(body.pod_uid, None)
        for dv in body.volumes:
            self.removed_volumes.pop(dv.volume_id, None)
        return tuple(dv.volume_id for dv in body.volumes)

    def _on_pod_removed(self, body: PodRemoved, _: int) -> tuple[str, ...]:
        return self._remove_pod(body.pod_uid)

    def _on_pod_cleaned_up(self, body: PodCleanedUp, _: int) -> tuple[str, ...]:
        self.forget_pod(body.pod_uid)
        return ()

    def _on_pod_pending(self, body: PodPending, _: int) -> tuple[str, ...]:
        return ()  # a pending pod wants no volume yet

    def _on_desired(self, body: Any, _: int) -> tuple[str, ...]:  # DesiredSizeChanged
        return (getattr(body, "volume_id", ""),)

    def _on_detached(self, body: DeviceDetached, version: int) -> tuple[str, ...]:
        vid = body.volume_id
        spec = self.removed_volumes.get(vid)
        if vid not in self.holders:
            self.removed_volumes.pop(vid, None)
        if spec is not None and not spec.pv_name and not self.desired.pods_on_volume(vid):
            # A pod's own volume (inline CSI, emptyDir) no pod wants: its id is never attached
            # again, so its version is not kept (a churning node would keep one per pod).
            self.detached_versions.pop(vid, None)
        else:
            self.detached_versions[vid] = version
        return ()

    def export_state(self) -> IndexSnapshot:
        """The folded state, for a snapshot (shares its objects: encode it at once)."""
        return IndexSnapshot(
            removed_pods=self.removed_pods,
            removed_volumes=self.removed_volumes,
            holders=self.holders,
            detached_versions=self.detached_versions,
        )

    def restore_state(self, snap: IndexSnapshot) -> None:
        """Replace the folded state with a snapshot's, in the same dict objects."""
        self.removed_pods.clear()
        self.removed_pods.update(snap.removed_pods)
        self.removed_volumes.clear()
        self.removed_volumes.update(snap.removed_volumes)
        self.holders.clear()
        self.holders.update((vid, list(keys)) for vid, keys in snap.holders.items())
        self.count_held()
        self.detached_versions.clear()
        self.detached_versions.update(snap.detached_versions)

    def _hold(self, volume_id: str, key: PodVolumeKey) -> None:
        held = self.holders.get(volume_id)
        if held is None:
            self.holders[volume_id] = [key]
        elif key not in held:
            held.append(key)
        else:
            return
        self.held[key] = self.held.get(key, 0) + 1

    def _release(self, volume_id: str, key: PodVolumeKey) -> None:
        held = self.holders.get(volume_id)
        if held is not None and key in held:
            held.remove(key)
            if not held:
                del self.holders[volume_id]
            count = self.held.pop(key, 1) - 1
            if count:
                self.held[key] = count

    def count_held(self) -> None:
        """Rebuild `held` from `holders` (after they were replaced)."""
        self.held.clear()
        for keys in self.holders.values():
            for key in keys:
                self.held[key] = self.held.get(key, 0) + 1

    def _remove_pod(self, uid: str) -> tuple[str, ...]:
        pod = self.desired.pods.get(uid)
        if pod is None:
            return ()
        self.removed_pods[uid] = pod
        only_user = self.desired.only_user
        for dv in pod.volumes:
            if only_user(dv.volume_id, uid):
                self.removed_volumes[dv.volume_id] = dv
        return tuple(dv.volume_id for dv in pod.volumes)

    def forget_pod(self, uid: str) -> None:
        """Drop the spec of a pod that is not desired and holds nothing (nothing runs on it)."""
        if uid not in self.desired.pods:
            self.removed_pods.pop(uid, None)

    def forget_volume(self, volume_id: str) -> None:
        """Drop the spec of a volume that is gone from the node and from the desired state."""
        self.removed_volumes.pop(volume_id, None)

    # ---------------------------------------------------------------- queries

    def pod_spec(self, uid: str) -> PodAdded | None:
        """The pod as desired, or as it was last desired if it still needs cleaning up."""
        pod = self.desired.pods.get(uid)
        return pod if pod is not None else self.removed_pods.get(uid)

    def spec_of(self, uid: str, name: str) -> DesiredVolume | None:
        """The last known spec of pod `uid`'s volume `name`."""
        pod = self.pod_spec(uid)
        if pod is None:
            return None
        for dv in pod.volumes:
            if dv.name == name:
                return dv
        return None

    def volume_spec(self, volume_id: str) -> DesiredVolume | None:
        """A spec of the volume: from a pod that wants it, else as it was last wanted."""
        for uid in self.desired.pods_on_volume(volume_id):
            pod = self.desired.pods.get(uid)
            for dv in pod.volumes if pod is not None else ():
                if dv.volume_id == volume_id:
                    return dv
        return self.removed_volumes.get(volume_id)

    def holders_of(self, volume_id: str) -> int:
        """How many pod-volumes on the volume are Mounted or Uncertain."""
        held = self.holders.get(volume_id)
        return len(held) if held else 0

    def detached_version(self, volume_id: str) -> int:
        """The device stream's version when the volume was detached; 0 if it never was."""
        return self.detached_versions.get(volume_id, 0)

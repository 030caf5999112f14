"""ReadWriteOncePod on one node: one pod at a time mounts such a volume.

In a cluster the scheduler keeps a second pod off a ReadWriteOncePod claim
(VolumeRestrictions); the kubelet has no check of its own at mount time and
relies on that, and on a driver that refuses a second publish of a
SINGLE_NODE_SINGLE_WRITER volume (reference plugins §9). volfsm has no
scheduler in front of it, so the reconciler asks `RwopGuard` before it
mounts a pod-volume the pod does not hold yet:

* a pod may mount a ReadWriteOncePod volume only if no other pod uses it,
  that is holds it (Mounted or Uncertain) or has a mount of it running;
* when no pod uses it, the pod applied first among those that want it gets
  it (the order of the desired state, which survives restarts);
* the others wait; their status says why and names the pod in the way.

The guard only holds mounts back: a pod that holds the volume keeps it
(also one found Mounted after a restart), whatever the other pods want.
When the user goes (its volume unmounted), the operation's end marks the
volume dirty and the next pass mounts the waiting pod.
"""

from __future__ import annotations

from typing import Protocol

from loguru import logger as log

from events.types import DesiredVolume, PodAdded
from volfsm.engine.executor import Operation
from volfsm.engine.index import EngineIndex
from volfsm.engine.operations import MAP_VOLUME, VOLUME_MOUNT

READ_WRITE_ONCE_POD = "ReadWriteOncePod"

_MOUNTS = frozenset({VOLUME_MOUNT, MAP_VOLUME})


class WantedBy(Protocol):
    """What the guard reads from the DSW."""

    pods: dict[str, PodAdded]

    def pods_on_volume(self, volume_id: str) -> list[str]:
        """UIDs of the pods that want the volume, in the order they were applied."""


def is_rwop(dv: DesiredVolume) -> bool:
    """Whether the volume's access modes (the PV's) include ReadWriteOncePod."""
    return READ_WRITE_ONCE_POD in dv.source.access_modes


class RwopGuard:
    """Decides which pod may mount a ReadWriteOncePod volume; remembers who waits."""

    def __init__(self, dsw: WantedBy, index: EngineIndex) -> None:
        self.dsw = dsw
        self.index = index
        self.mounting: dict[str, str] = {}
        """volume_id -> the pod whose mount of it the reconciler started and that runs."""
        self.waiting: dict[str, dict[str, str]] = {}
        """volume_id -> {pod uid: why it waits}, as the last pass over the volume saw it."""

    def users(self, volume_id: str) -> list[str]:
        """Pods using the volume now: holding it, or with a mount of it running."""
        uids = dict.fromkeys(uid for uid, _ in self.index.holders.get(volume_id, ()))
        running = self.mounting.get(volume_id)
        if running is not None:
            uids[running] = None
        return list(uids)

    def wait_reason(self, uid: str, dv: DesiredVolume) -> str:
        """Why pod `uid` may not mount `dv` now; "" if it may."""
        if not is_rwop(dv):
            return ""
        users = self.users(dv.volume_id)
        if users:
            if uid in users:
                return ""
            return f"{self._claim(uid, dv)} is ReadWriteOncePod and in use by {self._pod(users[0])}"
        first = next(iter(self.dsw.pods_on_volume(dv.volume_id)), uid)
        if first == uid:
            return ""
        return (
            f"{self._claim(uid, dv)} is ReadWriteOncePod and goes to {self._pod(first)}, "
            "applied first"
        )

    def started(self, uid: str, dv: DesiredVolume) -> None:
        """The reconciler started mounting `dv` for pod `uid`."""
        if is_rwop(dv):
            self.mounting[dv.volume_id] = uid

    def finished(self, op: Operation) -> None:
        """An operation ended: a mount it started no longer runs."""
        if op.name in _MOUNTS and self.mounting.get(op.volume_id) == op.pod_uid:
            del self.mounting[op.volume_id]

    def note_waiting(self, volume_id: str, waiting: dict[str, str]) -> None:
        """Remember who waits for the volume after a pass; log each pod that starts waiting."""
        before = self.waiting.pop(volume_id, {})
        for uid, why in waiting.items():
            if before.get(uid) != why:
                log.info("pod {} waits before mounting volume {}: {}", uid, volume_id, why)
        if waiting:
            self.waiting[volume_id] = waiting

    def _claim(self, uid: str, dv: DesiredVolume) -> str:
        if not dv.claim_name:
            return f"volume {dv.pv_name or dv.volume_id}"
        pod = self.dsw.pods.get(uid)
        namespace = pod.namespace if pod is not None else ""
        return f"claim {namespace}/{dv.claim_name}" if namespace else f"claim {dv.claim_name}"

    def _pod(self, uid: str) -> str:
        spec = self.index.pod_spec(uid)
        if spec is None or not spec.name:
            return f"pod uid {uid} (found on the node)"
        return f"pod {spec.namespace}/{spec.name} (uid {uid})"

"""What `VolumeEngine.pods()` / `volumes()` report: the engine's state as status objects.

Built on demand from the ASW (state, reason, last operation and error, next
retry), the DSW (desired, wanted by), the index (specs, holders), the
ReadWriteOncePod guard (why a pod waits) and the last volume stats
gathering (usage, condition). Nothing here changes state.
"""

from __future__ import annotations

from typing import Any

from events.tables import DETACHED, MOUNTED, UNMOUNTED
from events.types import PodPending
from projections.asw import Asw, PodVolumeState
from volfsm.desired.dsw import DesiredStateOfWorld
from volfsm.engine.index import EngineIndex
from volfsm.engine.rwop import RwopGuard
from volfsm.engine.status import (
    PENDING,
    PodStatus,
    PodVolumeStatus,
    VolumeStatus,
    next_retry_us,
    operation_status,
    pod_phase,
)
from volfsm.engine.volstats import VolumeStats, VolumeStatsGatherer


def pending_status(pod: PodPending) -> PodStatus:
    """A pending pod: desired, phase Pending, each waiting volume Unmounted with what it waits
    for (the kubelet's pod stays in ContainerCreating with the populator's error)."""
    volumes = tuple(
        PodVolumeStatus(
            name=w.name,
            volume_id="",
            state=UNMOUNTED,
            desired=True,
            waiting=w.text,
            claim=w.waits_for.removeprefix(CLAIM_PREFIX).partition("/")[2]
            if w.waits_for.startswith(CLAIM_PREFIX)
            else "",
        )
        for w in pod.waiting
    )
    return PodStatus(
        uid=pod.pod_uid,
        namespace=pod.namespace,
        name=pod.name,
        desired=True,
        phase=PENDING,
        volumes=volumes,
    )


CLAIM_PREFIX = "PersistentVolumeClaim "


class StatusView:
    """Pod and volume status, read from the engine's state when asked."""

    def __init__(
        self,
        *,
        asw: Asw,
        dsw: DesiredStateOfWorld,
        index: EngineIndex,
        rwop: RwopGuard,
        volstats: VolumeStatsGatherer,
    ) -> None:
        self.asw = asw
        self.dsw = dsw
        self.index = index
        self.rwop = rwop
        self.volstats = volstats

    def pod(self, uid: str) -> PodStatus | None:
        """One pod's status, or None if the engine does not know it."""
        pending = self.dsw.pending.get(uid)
        if pending is not None:
            return pending_status(pending)
        desired = self.dsw.pods.get(uid)
        spec = self.index.pod_spec(uid)
        if spec is None:
            return None
        specs = {dv.name: dv for dv in spec.volumes}
        volumes = []
        for name, dv in specs.items():
            vid = dv.volume_id
            pv = self.asw.podvols.get((uid, name))
            waiting = ""
            if desired is not None and (pv is None or pv.state == UNMOUNTED):
                waiting = self.rwop.wait_reason(uid, dv)
            if pv is None:
                volumes.append(
                    PodVolumeStatus(
                        name=name,
                        volume_id=vid,
                        state=UNMOUNTED,
                        desired=desired is not None,
                        waiting=waiting,
                    )
                )
                continue
            volumes.append(
                PodVolumeStatus(
                    name=name,
                    volume_id=pv.volume_id or vid,
                    state=pv.state,
                    desired=desired is not None,
                    since_us=pv.since_us,
                    mount_path=pv.mount_path,
                    reason=pv.reason,
                    waiting=waiting,
                    reconstructed=pv.reconstructed,
                    last_operation=operation_status(pv.last_operation),
                    last_error=operation_status(pv.last_error),
                    next_retry_us=next_retry_us(pv),
                    claim=dv.claim_name,
                    **self._health(self.volstats.of_pod_volume(uid, name), pv),
                )
            )
        return PodStatus(
            uid=uid,
            namespace=spec.namespace,
            name=spec.name,
            desired=desired is not None,
            phase=pod_phase(desired is not None, [v.state for v in volumes]),
            volumes=tuple(volumes),
        )

    def pods(self) -> list[PodStatus]:
        """Every desired pod, and every deleted pod not yet cleaned up."""
        uids = dict.fromkeys(self.dsw.pods)
        uids.update(dict.fromkeys(self.dsw.pending))
        uids.update(dict.fromkeys(self.index.removed_pods))
        return [status for uid in uids if (status := self.pod(uid)) is not None]

    def volume(self, volume_id: str) -> VolumeStatus | None:
        """One volume's status, or None if it is neither on the node nor wanted."""
        dev = self.asw.devices.get(volume_id)
        wanted = tuple(self.dsw.pods_on_volume(volume_id))
        held = tuple(sorted(f"{u}/{n}" for u, n in self.index.holders.get(volume_id, ())))
        if dev is None and not wanted and not held:
            return None
        desired_size = self.dsw.desired_size(volume_id)
        if dev is None:
            return VolumeStatus(
                volume_id=volume_id,
                state="Detached",
                desired_size_bytes=desired_size,
                held_by=held,
                wanted_by=wanted,
            )
        return VolumeStatus(
            volume_id=volume_id,
            state=dev.state,
            plugin=dev.plugin,
            attachable=dev.attachable,
            device_path=dev.device_path,
            device_mount_path=dev.device_mount_path,
            size_bytes=dev.size_bytes,
            desired_size_bytes=desired_size,
            since_us=dev.since_us,
            reason=dev.reason,
            reconstructed=dev.reconstructed,
            held_by=held,
            wanted_by=wanted,
            last_operation=operation_status(dev.last_operation),
            last_error=operation_status(dev.last_error),
            next_retry_us=next_retry_us(dev),
            **self._health(self.volstats.of_volume(volume_id), None),
        )

    @staticmethod
    def _health(stats: VolumeStats | None, pv: PodVolumeState | None) -> dict[str, Any]:
        """Usage and condition for a status: the last gathering's, else what the log says."""
        out: dict[str, Any] = {}
        if stats is not None and stats.usage is not None:
            usage = stats.usage
            out["capacity_bytes"] = usage.capacity_bytes
            out["used_bytes"] = usage.used_bytes
            out["available_bytes"] = usage.available_bytes
        if stats is not None and stats.abnormal is not None:
            out["abnormal"], out["condition"] = stats.abnormal, stats.message
        elif pv is not None and pv.state == MOUNTED and pv.abnormal:
            out["abnormal"], out["condition"] = True, pv.condition
        return out

    def volumes(self) -> list[VolumeStatus]:
        """Every volume on the node or wanted by a pod.

        A record with only operation records and no device (a plugin-dir orphan's
        cleanup, `device/orphan:<path>`) is listed only while its last attempt failed.
        """
        vids = dict.fromkeys(
            vid
            for vid, dev in self.asw.devices.items()
            if dev.state != DETACHED or dev.last_error is not None
        )
        vids.update(dict.fromkeys(dv.volume_id for _, dv in self.dsw.volumes_to_mount()))
        vids.update(dict.fromkeys(self.index.holders))
        return [status for vid in vids if (status := self.volume(vid)) is not None]

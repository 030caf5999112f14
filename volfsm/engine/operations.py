"""What each operation does, in kubelet's order, and which transition each outcome fires.

Kubelet's operation generator, with the error rules of reference §1.3:

* an error before the plugin was reached (bad path, wait-for-attach failure,
  a TRANSIENT plugin error, unstage refused while referenced) changes no
  state;
* a timeout or non-final error moves NotMounted to Uncertain (device
  Attached -> Uncertain, pod Unmounted -> Uncertain); Mounted and
  GloballyMounted are never downgraded by a mount;
* a final error moves Uncertain back to NotMounted, except for entries
  found by reconstruction, which stay Uncertain;
* a failed teardown / unmap / unstage marks Uncertain; an unstage whose
  device is still open afterwards marks Uncertain too.

Operations and their keys (reference §3): mount and map lock the whole
volume when the plugin is attachable or device-mountable, else only the
pod; unmount and unmap lock the pod; unmount device, unmap device, online
expansion and mark-detached lock the whole volume. `adopt` (hand a
reconstructed pod-volume over to the name its desired pod uses; no plugin
call) locks the whole volume too.

The bodies live beside it: `volfsm.engine.mounting` (attach, stage, expand
during mount, publish, map), `volfsm.engine.teardown` (unmount, unmap,
unstage), both on `volfsm.engine.opcore` (requests, transitions, the error
rules above).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from events.streams import device_stream, podvol_stream
from events.tables import ATTACHED, MOUNTED, UNCERTAIN, UNMOUNTED
from events.types import (
    Body,
    DesiredVolume,
    DeviceDetached,
    VolumeMountUncertain,
    VolumeResized,
    VolumeUnmounted,
)
from volfsm.engine.executor import Operation
from volfsm.engine.mounting import FAILED_PRECONDITION, FS_RESIZE_FAILED, MountSteps
from volfsm.engine.opcore import (
    ADOPT_RECONSTRUCTED,
    EXPAND_VOLUME,
    MAP_VOLUME,
    MARK_DETACHED,
    UNMAP_DEVICE,
    UNMAP_VOLUME,
    UNMOUNT_DEVICE,
    VOLUME_MOUNT,
    VOLUME_UNMOUNT,
    PluginFinder,
    SizeSource,
    VolumeIndex,
    confined,
    plugin_label,
)
from volfsm.engine.pending import EMPTY_POD
from volfsm.engine.teardown import SUBPATHS_DIR, TeardownSteps
from volfsm.plugins.base import BLOCK, PluginError, VolumePlugin


def mount_key_pod(plugin: VolumePlugin, dv: DesiredVolume, pod_uid: str) -> str:
    """Pod part of a mount/map key: "" (serialised per volume) unless the plugin is plain."""
    if (
        plugin.is_attachable(dv.source)
        or plugin.is_device_mountable(dv.source)
        or plugin.mounts_one_pod_at_a_time(dv.source)
    ):
        return EMPTY_POD
    return pod_uid


def unmount_key_pod(plugin: VolumePlugin | PluginError, dv: DesiredVolume, pod_uid: str) -> str:
    """Pod part of an unmount/unmap key: the pod (unmounts of pods run side by side, as in the
    kubelet) unless the plugin mounts one pod at a time; then its teardowns do too, since they
    undo the node state its mounts share (a local PV's global mount)."""
    if isinstance(plugin, PluginError) or not plugin.mounts_one_pod_at_a_time(dv.source):
        return pod_uid
    return EMPTY_POD


class OperationGenerator(MountSteps, TeardownSteps):
    """Builds the engine's operations; their bodies drive plugins and fire transitions
    (`volfsm.engine.mounting`, `volfsm.engine.teardown`, on `volfsm.engine.opcore`)."""

    def _operation(
        self,
        name: str,
        dv: DesiredVolume,
        plugin: VolumePlugin | PluginError,
        *,
        pod_uid: str,
        pod_key: str,
        stream: str,
        reason: str,
        body: Callable[[VolumePlugin], Awaitable[None]],
    ) -> Operation:
        if isinstance(plugin, PluginError):
            error = plugin

            async def run() -> None:
                raise error

            label = f"{dv.source.plugin}:{dv.source.driver}" if dv.source.driver else ""
        else:
            found = plugin

            async def run() -> None:
                await body(found)

            label = plugin_label(plugin, dv)
        return Operation(
            name=name,
            volume_id=dv.volume_id,
            pod_key=pod_key,
            stream=stream,
            pod_uid=pod_uid,
            plugin=label or dv.source.plugin,
            reason=reason,
            body=run,
        )

    def mount(self, pod_uid: str, dv: DesiredVolume, reason: str = "") -> Operation:
        """MountVolume / MapVolume for one pod."""
        plugin = self.find_plugin(dv.source)
        block = dv.volume_mode == BLOCK
        key = pod_uid if isinstance(plugin, PluginError) else mount_key_pod(plugin, dv, pod_uid)
        return self._operation(
            MAP_VOLUME if block else VOLUME_MOUNT,
            dv,
            plugin,
            pod_uid=pod_uid,
            pod_key=key,
            stream=podvol_stream(pod_uid, dv.name),
            reason=reason,
            body=lambda p: self._mount(pod_uid, dv, p),
        )

    def unmount(self, pod_uid: str, dv: DesiredVolume, reason: str = "") -> Operation:
        """UnmountVolume / UnmapVolume for one pod (keyed per pod)."""
        block = dv.volume_mode == BLOCK
        body = self._unmap if block else self._unmount
        plugin = self.find_plugin(dv.source)
        return self._operation(
            UNMAP_VOLUME if block else VOLUME_UNMOUNT,
            dv,
            plugin,
            pod_uid=pod_uid,
            pod_key=unmount_key_pod(plugin, dv, pod_uid),
            stream=podvol_stream(pod_uid, dv.name),
            reason=reason,
            body=lambda p: body(pod_uid, dv, p),
        )

    def unmount_device(self, dv: DesiredVolume, reason: str = "") -> Operation:
        """UnmountDevice / UnmapDevice (keyed per volume)."""
        block = dv.volume_mode == BLOCK
        body = self._unmap_device if block else self._unmount_device
        return self._operation(
            UNMAP_DEVICE if block else UNMOUNT_DEVICE,
            dv,
            self.find_plugin(dv.source),
            pod_uid="",
            pod_key=EMPTY_POD,
            stream=device_stream(dv.volume_id),
            reason=reason,
            body=lambda p: body(dv, p),
        )

    def expand(
        self, pod_uid: str, dv: DesiredVolume, plugin: VolumePlugin, size: int, reason: str = ""
    ) -> Operation:
        """ExpandInUseVolume: online node expansion through a mounted pod (keyed per volume)."""
        return self._operation(
            EXPAND_VOLUME,
            dv,
            plugin,
            pod_uid=pod_uid,
            pod_key=EMPTY_POD,
            stream=device_stream(dv.volume_id),
            reason=reason,
            body=lambda p: self._expand_online(pod_uid, dv, p, size),
        )

    def mark_detached(self, volume_id: str) -> Operation:
        """MarkVolumeAsDetached: the device record goes; no plugin call, no operation records."""
        return Operation(
            name=MARK_DETACHED,
            volume_id=volume_id,
            pod_key=EMPTY_POD,
            stream=device_stream(volume_id),
            recorded=False,
            body=lambda: self._mark_detached(volume_id),
        )

    def adopt(self, pod_uid: str, found_name: str, dv: DesiredVolume) -> Operation:
        """Hand a reconstructed pod-volume over to the name the desired pod gives it.

        Reconstruction names a CSI PV volume found in a pod dir by its dir
        (the PV name: kubelet's outerVolumeSpecName problem, #103143). When
        the pod is applied again and calls the volume `dv.name`, the same
        mount must not be unmounted as "no longer desired" under the old
        name: the entry moves (new name Uncertain, reconstructed; old name
        Unmounted, saying why), then the usual remount makes it Mounted.
        No plugin is called. Keyed on the whole volume, like its mount.
        """
        return Operation(
            name=ADOPT_RECONSTRUCTED,
            volume_id=dv.volume_id,
            pod_key=EMPTY_POD,
            stream=podvol_stream(pod_uid, dv.name),
            pod_uid=pod_uid,
            plugin=dv.source.plugin,
            reason=f"found on the node as {found_name!r}; the pod calls it {dv.name!r}",
            body=lambda: self._adopt(pod_uid, found_name, dv),
        )

    async def _adopt(self, pod_uid: str, found_name: str, dv: DesiredVolume) -> None:
        old = self.asw.podvols.get((pod_uid, found_name))
        if old is None or old.state not in (MOUNTED, UNCERTAIN):
            return
        if self._podvol_state(pod_uid, dv.name) == UNMOUNTED:
            reason = (
                f"reconstructed: found on the node as {found_name!r} (its directory name);"
                f" the pod calls it {dv.name!r}"
            )
            body = VolumeMountUncertain(
                volume_id=dv.volume_id,
                pod_uid=pod_uid,
                volume_name=dv.name,
                reason=reason,
                reconstructed=True,
            )
            await self._fire_podvol(pod_uid, dv.name, "mark_uncertain", body)
            if (pod_uid, found_name) in self.found_on_node:
                self.found_on_node.add((pod_uid, dv.name))
        handed = VolumeUnmounted(
            volume_id=old.volume_id or dv.volume_id,
            pod_uid=pod_uid,
            volume_name=found_name,
            reason=f"the same mount is the pod's volume {dv.name!r}: handed over to it",
        )
        await self._fire_podvol(pod_uid, found_name, "unmount", handed)

    def request_paths(
        self, dv: DesiredVolume, pod_uid: str = ""
    ) -> tuple[Path | None, Path | None] | None:
        """(device mount path, pod mount path) the plugin gives `dv`; None if it can't say."""
        plugin = self.find_plugin(dv.source)
        if isinstance(plugin, PluginError):
            return None
        try:
            req = self._request(dv, plugin, pod_uid)
        except PluginError:
            return None
        return req.device_mount_path, req.mount_path

    async def fire_device(self, volume_id: str, trigger: str, body: Body) -> None:
        """Fire a device transition (reconstruction's marks), primed from the ASW."""
        await self._fire_device(volume_id, trigger, body)

    async def fire_podvol(self, pod_uid: str, name: str, trigger: str, body: Body) -> None:
        """Fire a pod-volume transition (reconstruction's marks), primed from the ASW."""
        await self._fire_podvol(pod_uid, name, trigger, body)

    async def _expand_online(
        self, pod_uid: str, dv: DesiredVolume, plugin: VolumePlugin, size: int
    ) -> None:
        """NodeExpandVolume through a mounted pod; a failure changes no state."""
        vid = dv.volume_id
        req = self._request(dv, plugin, pod_uid)
        req = replace(req, size_bytes=size)
        await self.executor.call_plugin("NodeExpandVolume", lambda: plugin.expand(req, size))
        await self._fire_device(vid, "resize", VolumeResized(volume_id=vid, size_bytes=size))
        self.expand_in_use.pop(vid, None)

    async def _mark_detached(self, volume_id: str) -> None:
        if self._device_state(volume_id) != ATTACHED or self.holders.holders_of(volume_id):
            return
        await self._fire_device(volume_id, "detach", DeviceDetached(volume_id=volume_id))
        self.expand_in_use.pop(volume_id, None)  # kubelet: the record goes with the volume


__all__ = [
    "ADOPT_RECONSTRUCTED",
    "EXPAND_VOLUME",
    "FAILED_PRECONDITION",
    "FS_RESIZE_FAILED",
    "MAP_VOLUME",
    "MARK_DETACHED",
    "SUBPATHS_DIR",
    "UNMAP_DEVICE",
    "UNMAP_VOLUME",
    "UNMOUNT_DEVICE",
    "VOLUME_MOUNT",
    "VOLUME_UNMOUNT",
    "OperationGenerator",
    "PluginFinder",
    "SizeSource",
    "VolumeIndex",
    "confined",
    "mount_key_pod",
    "plugin_label",
    "unmount_key_pod",
]

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
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from events.streams import device_stream, podvol_stream
from events.tables import ATTACHED, DETACHED, GLOBALLY_MOUNTED, MOUNTED, UNCERTAIN, UNMOUNTED
from events.types import (
    Body,
    DesiredVolume,
    DeviceAttached,
    DeviceDetached,
    DeviceMounted,
    DeviceMountUncertain,
    DeviceUnmounted,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeResized,
    VolumeSource,
    VolumeUnmounted,
)
from projections.asw import Asw
from volfsm import faultpoints
from volfsm.desired.quantity import format_bytes
from volfsm.engine.executor import Operation, OperationExecutor
from volfsm.engine.handler import CommandHandler
from volfsm.engine.pending import EMPTY_POD
from volfsm.errors import IllegalTransitionError, VolfsmError
from volfsm.node import blockmap, mounts
from volfsm.node.dirsonly import remove_dirs
from volfsm.node.layout import RootLayout, UnsafePathError
from volfsm.plugins.base import BLOCK, ErrorClass, PluginError, VolumePlugin, VolumeRequest

VOLUME_MOUNT = "volume_mount"
MAP_VOLUME = "map_volume"
VOLUME_UNMOUNT = "volume_unmount"
UNMAP_VOLUME = "unmap_volume"
UNMOUNT_DEVICE = "unmount_device"
UNMAP_DEVICE = "unmap_device"
EXPAND_VOLUME = "volume_fs_resize"
MARK_DETACHED = "mark_detached"
ADOPT_RECONSTRUCTED = "adopt_reconstructed"

SUBPATHS_DIR = "volume-subpaths"

FAILED_PRECONDITION = "FailedPrecondition"
"""The driver's "volume in use": node expansion is not tried again on this node."""
FS_RESIZE_FAILED = "FileSystemResizeFailed"
"""Kubelet's warning reason: a read-only volume is not expanded during mount."""

log = logging.getLogger(__name__)


class SizeSource(Protocol):
    """Where the generator reads the size pods want (the DSW)."""

    def desired_size(self, volume_id: str) -> int | None:
        """The size pods want of a volume, or None."""


class PluginFinder(Protocol):
    """Finds the plugin serving a volume source (the plugin catalog)."""

    def find(self, source: VolumeSource) -> VolumePlugin:
        """The plugin for `source`; raises a TRANSIENT `PluginError` if there is none."""


class VolumeIndex(Protocol):
    """Which pods may still have a volume mounted; device stream versions the ASW dropped."""

    def holders_of(self, volume_id: str) -> int:
        """How many pod-volumes on `volume_id` are Mounted or Uncertain."""

    def detached_version(self, volume_id: str) -> int:
        """The device stream's version if the volume was detached, else 0 (a new stream)."""


def plugin_label(plugin: VolumePlugin, dv: DesiredVolume) -> str:
    """The plugin as metrics name it: 'kubernetes.io/csi:<driver>' for CSI drivers."""
    driver = dv.source.driver
    return f"{plugin.name}:{driver}" if driver else plugin.name


def mount_key_pod(plugin: VolumePlugin, dv: DesiredVolume, pod_uid: str) -> str:
    """Pod part of a mount/map key: "" (serialised per volume) unless the plugin is plain."""
    if plugin.is_attachable(dv.source) or plugin.is_device_mountable(dv.source):
        return EMPTY_POD
    return pod_uid


def _transient(code: str, message: str) -> PluginError:
    return PluginError(code, message, ErrorClass.TRANSIENT)


def _block_paths(req: VolumeRequest) -> tuple[Path, Path]:
    """(global map path, pod device link) of a block request; TRANSIENT error if missing."""
    if req.device_mount_path is None or req.mount_path is None:
        raise _transient(
            "InvalidPath", "a block volume needs a global map path and a pod device map path"
        )
    return req.device_mount_path, req.mount_path


class OperationGenerator:
    """Builds the engine's operations; their bodies drive plugins and fire transitions."""

    def __init__(
        self,
        *,
        handler: CommandHandler,
        asw: Asw,
        sizes: SizeSource,
        holders: VolumeIndex,
        plugins: PluginFinder,
        layout: RootLayout,
        executor: OperationExecutor,
        wait_for_attach_timeout: float,
    ) -> None:
        self.handler = handler
        self.asw = asw
        self.sizes = sizes
        self.holders = holders
        self.plugins = plugins
        self.layout = layout
        self.executor = executor
        self.wait_for_attach_timeout = wait_for_attach_timeout
        self.found_on_node: set[tuple[str, str]] = set()
        """(pod uid, volume name) of pod-volumes the log never recorded creating (found on
        the node by reconstruction, never mounted since): their teardown keeps files."""
        self.expand_failed: dict[str, int] = {}
        """volume_id -> the size whose node expansion failed with a final error.

        Online expansion is not retried until the size changes (the reconciler
        reads this dict); expansion during mount is, unless `expand_in_use`.
        """
        self.expand_in_use: dict[str, int] = {}
        """volume_id -> the size the driver refused to expand with FAILED_PRECONDITION.

        Kubelet's MarkForInUseExpansionError: neither online nor during mount is
        that size tried again on this node (until the volume is detached).
        """

    # ------------------------------------------------------------- builders

    def find_plugin(self, source: VolumeSource) -> VolumePlugin | PluginError:
        """The plugin serving `source`, or the (TRANSIENT) error saying why there is none."""
        try:
            return self.plugins.find(source)
        except PluginError as exc:
            return exc

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
        return self._operation(
            UNMAP_VOLUME if block else VOLUME_UNMOUNT,
            dv,
            self.find_plugin(dv.source),
            pod_uid=pod_uid,
            pod_key=pod_uid,
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

    # ------------------------------------------------- reconstructed entries

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

    # -------------------------------------------------------------- helpers

    def _device_state(self, volume_id: str) -> str:
        dev = self.asw.devices.get(volume_id)
        return dev.state if dev is not None else DETACHED

    def _podvol_state(self, pod_uid: str, name: str) -> str:
        pv = self.asw.podvols.get((pod_uid, name))
        return pv.state if pv is not None else UNMOUNTED

    # The engine saw every event of the log (fold at start, then each append), so
    # the ASW knows each stream's state and version: priming the handler from it
    # saves a read of the stream from the log before its first transition. A
    # stale prime only costs a version conflict, after which the handler reloads.

    async def _fire_device(self, volume_id: str, trigger: str, body: Body) -> None:
        stream = device_stream(volume_id)
        dev = self.asw.devices.get(volume_id)
        if dev is not None:
            self.handler.prime(stream, dev.state, dev.version)
        else:
            self.handler.prime(stream, DETACHED, self.holders.detached_version(volume_id))
        await self.handler.fire_async(stream, trigger, body)
        faultpoints.hit("append.after", type(body).__name__)

    async def _fire_podvol(self, pod_uid: str, name: str, trigger: str, body: Body) -> None:
        stream = podvol_stream(pod_uid, name)
        pv = self.asw.podvols.get((pod_uid, name))
        if pv is not None:
            self.handler.prime(stream, pv.state, pv.version)
        else:
            self.handler.prime(stream, UNMOUNTED, 0)
        await self.handler.fire_async(stream, trigger, body)
        faultpoints.hit("append.after", type(body).__name__)

    def _checked(self, path: Path | None, what: str, *, link: bool = False) -> Path | None:
        """`path` if it lies inside the root with no symlink on the way (see `confined`)."""
        if path is None:
            return None
        try:
            return confined(self.layout.root, path, link=link)
        except UnsafePathError as exc:
            raise _transient("UnsafePath", f"{what}: {exc}") from None

    def _request(
        self, dv: DesiredVolume, plugin: VolumePlugin, pod_uid: str = "", *, teardown: bool = False
    ) -> VolumeRequest:
        """The plugin request; the plugin computes its paths, checked to lie inside the root."""
        req = VolumeRequest(
            volume_id=dv.volume_id,
            source=dv.source,
            volume_mode=dv.volume_mode,
            read_only=dv.read_only,
            size_bytes=dv.size_bytes,
            pod_uid=pod_uid,
            volume_name=dv.name if pod_uid else "",
            spec_name=dv.pv_name or dv.name,  # kubelet's spec.Name()
            ephemeral=not dv.pv_name,  # inline csi / emptyDir: pod-scoped, never staged
        )
        root = self.layout.root
        try:
            device_path = plugin.device_mount_path(root, req)
            mount_path = plugin.pod_mount_path(root, req) if pod_uid else None
        except (VolfsmError, OSError) as exc:
            raise _transient("UnsafePath", str(exc)) from None
        if device_path is None:
            recorded = self.asw.devices.get(dv.volume_id)
            if recorded is not None and recorded.device_mount_path:
                device_path = Path(recorded.device_mount_path)
        dev = self.asw.devices.get(dv.volume_id)
        return replace(
            req,
            device_path=dev.device_path if dev is not None else "",
            device_mount_path=self._checked(device_path, "device mount path"),
            # A teardown may meet a symlink planted at the pod's target: the plugin removes
            # the link without following it, so refusing here would leave the pod stuck.
            mount_path=self._checked(
                mount_path, "pod mount path", link=teardown or dv.volume_mode == BLOCK
            ),
        )

    # ------------------------------------------------------------ error rules

    async def _device_error(self, volume_id: str, exc: PluginError, path: Path | None) -> None:
        """markDeviceErrorState: a failed stage."""
        dev = self.asw.devices.get(volume_id)
        state = dev.state if dev is not None else DETACHED
        if exc.error_class is ErrorClass.FINAL and state == UNCERTAIN:
            if dev is not None and dev.reconstructed:
                return
            reason = f"stage failed with a final error ({exc.code}) while Uncertain"
            await self._fire_device(
                volume_id, "unmount_device", DeviceUnmounted(volume_id=volume_id, reason=reason)
            )
        elif exc.error_class is ErrorClass.UNCERTAIN and state == ATTACHED:
            await self._mark_device_uncertain(
                volume_id, f"stage may be in progress ({exc.code}: {exc.message})", path
            )

    async def _mark_device_uncertain(self, volume_id: str, reason: str, path: Path | None) -> None:
        if self._device_state(volume_id) == UNCERTAIN:
            return
        body = DeviceMountUncertain(
            volume_id=volume_id, reason=reason, device_mount_path=str(path or "")
        )
        await self._fire_device(volume_id, "mark_device_uncertain", body)

    async def _volume_error(self, pod_uid: str, dv: DesiredVolume, exc: PluginError) -> None:
        """markVolumeErrorState: a failed publish / map."""
        pv = self.asw.podvols.get((pod_uid, dv.name))
        state = pv.state if pv is not None else UNMOUNTED
        if exc.error_class is ErrorClass.FINAL and state == UNCERTAIN:
            if pv is not None and pv.reconstructed:
                return
            reason = f"publish failed with a final error ({exc.code}) while Uncertain"
            body = VolumeUnmounted(
                volume_id=dv.volume_id, pod_uid=pod_uid, volume_name=dv.name, reason=reason
            )
            await self._fire_podvol(pod_uid, dv.name, "unmount", body)
        elif exc.error_class is ErrorClass.UNCERTAIN and state == UNMOUNTED:
            reason = f"publish may be in progress ({exc.code}: {exc.message})"
            await self._mark_volume_uncertain(pod_uid, dv, reason)

    async def _mark_volume_uncertain(self, pod_uid: str, dv: DesiredVolume, reason: str) -> None:
        if self._podvol_state(pod_uid, dv.name) == UNCERTAIN:
            return
        body = VolumeMountUncertain(
            volume_id=dv.volume_id, pod_uid=pod_uid, volume_name=dv.name, reason=reason
        )
        await self._fire_podvol(pod_uid, dv.name, "mark_uncertain", body)

    # ------------------------------------------------------------------ mount

    async def _mount(self, pod_uid: str, dv: DesiredVolume, plugin: VolumePlugin) -> None:
        """Wait for attach -> attach -> stage unless staged (-> expand) -> publish (-> map)
        -> expand unless done after the stage -> Mounted."""
        self.found_on_node.discard((pod_uid, dv.name))  # mounted for a desired pod: volfsm's
        vid = dv.volume_id
        block = dv.volume_mode == BLOCK
        req = self._request(dv, plugin, pod_uid)
        if block:
            _block_paths(req)  # refuse before anything is called
        attachable = plugin.is_attachable(dv.source)
        attach_path = ""
        if attachable:
            attach_path = await self._wait_for_attach(plugin, req)
        await self._ensure_attached(dv, plugin, attachable, attach_path)
        req = replace(req, device_path=attach_path or req.device_path)
        device_path, staged = await self._stage(dv, plugin, req, block)
        expansion_done = False
        if staged and not block:
            expansion_done = await self._expand_during_mount(pod_uid, dv, plugin, req, staged=True)
        try:
            result = await self.executor.call_plugin(
                "MapPodDevice" if block else "SetUp", lambda: plugin.set_up(req)
            )
        except PluginError as exc:
            await self._volume_error(pod_uid, dv, exc)
            raise
        if block:
            await self._map_block(
                pod_uid, dv, req, result.device_path or result.path or device_path
            )
        if not expansion_done:
            await self._expand_during_mount(pod_uid, dv, plugin, req, staged=False)
        body = VolumeMounted(
            volume_id=vid,
            pod_uid=pod_uid,
            volume_name=dv.name,
            mount_path=str(req.mount_path or ""),
            mount_found=result.mount_found,
        )
        await self._fire_podvol(pod_uid, dv.name, "mount", body)

    async def _wait_for_attach(self, plugin: VolumePlugin, req: VolumeRequest) -> str:
        """WaitForAttach with its own timeout; any failure is "before the driver" (no change)."""
        try:
            return await self.executor.call_plugin(
                "WaitForAttach", lambda: plugin.wait_for_attach(req), self.wait_for_attach_timeout
            )
        except PluginError as exc:
            raise _transient(exc.code, f"waiting for attach: {exc.message}") from None

    async def _ensure_attached(
        self, dv: DesiredVolume, plugin: VolumePlugin, attachable: bool, device_path: str
    ) -> None:
        """MarkVolumeAsAttached (+ InitializeClaimSize) the first time the volume is seen."""
        vid = dv.volume_id
        if self._device_state(vid) == DETACHED:
            body = DeviceAttached(
                volume_id=vid,
                plugin=plugin_label(plugin, dv),
                attachable=attachable,
                device_path=device_path,
            )
            try:
                await self._fire_device(vid, "attach", body)
            except IllegalTransitionError:
                # Plain plugins mount per pod, in parallel: another pod's mount may
                # have attached the volume first, which is just as good.
                if self._device_state(vid) == DETACHED:
                    raise
        await self._initialize_size(dv, plugin)

    async def _initialize_size(self, dv: DesiredVolume, plugin: VolumePlugin) -> None:
        """Kubelet's InitializeClaimSize: the size the volume has, if none is recorded yet.

        The claim's status.capacity says it; a claim without one is taken as
        the binder leaves it: at the PV's capacity.
        """
        vid = dv.volume_id
        dev = self.asw.devices.get(vid)
        size = _claimed_size(dv)
        if (
            dev is not None
            and dev.size_bytes is None
            and size is not None
            and plugin.supports_expansion(dv.source)
        ):
            await self._fire_device(vid, "resize", VolumeResized(volume_id=vid, size_bytes=size))

    async def _stage(
        self, dv: DesiredVolume, plugin: VolumePlugin, req: VolumeRequest, block: bool
    ) -> tuple[str, bool]:
        """MountDevice / SetUpDevice unless globally mounted.

        Returns the device path to map (block) and whether the plugin staged
        the volume now (then a filesystem is expanded right after, if need be).
        """
        vid = dv.volume_id
        device_path = req.device_path
        if self._device_state(vid) == GLOBALLY_MOUNTED:
            return device_path, False
        if plugin.is_device_mountable(dv.source):
            try:
                result = await self.executor.call_plugin(
                    "SetUpDevice" if block else "MountDevice", lambda: plugin.mount_device(req)
                )
            except PluginError as exc:
                await self._device_error(vid, exc, req.device_mount_path)
                raise
            device_path = result.device_path or device_path
            mount_found = result.mount_found
            staged = plugin.stages(req)
        elif not block:
            return device_path, False
        else:
            mount_found, staged = None, False
        body = DeviceMounted(
            volume_id=vid,
            device_mount_path=str(req.device_mount_path or ""),
            mount_found=mount_found,
        )
        await self._fire_device(vid, "mount_device", body)
        return device_path, staged

    async def _map_block(
        self, pod_uid: str, dv: DesiredVolume, req: VolumeRequest, device_path: str
    ) -> None:
        """MapBlockVolume: global map bind file, pod device link, loop fd lock."""
        global_map, pod_link = _block_paths(req)
        try:
            await blockmap.map_block_volume_async(
                self.layout, device_path, global_map, pod_uid, pod_link.parent, pod_link.name
            )
        except (VolfsmError, OSError) as exc:
            err = PluginError("MapBlockVolumeFailed", str(exc), ErrorClass.UNCERTAIN)
            await self._volume_error(pod_uid, dv, err)
            raise err from None

    def _mount_expansion_need(
        self, dv: DesiredVolume, plugin: VolumePlugin
    ) -> tuple[int, str] | None:
        """(size to expand to, why) if the volume is smaller than its PV; None if it is not.

        Kubelet expands during mount when the claim's status.capacity is
        below the PV's capacity. volfsm cannot write the claim's status
        afterwards; the size it records for the device stands in for it, so
        the larger of the two is the size the volume has.
        """
        want = self.sizes.desired_size(dv.volume_id) or dv.size_bytes
        if want is None or not plugin.supports_expansion(dv.source):
            return None
        dev = self.asw.devices.get(dv.volume_id)
        recorded = dev.size_bytes if dev is not None else None
        if recorded is None:
            recorded = _claimed_size(dv)
        claim = dv.claim_capacity_bytes
        known = max(recorded or 0, claim or 0)
        if known >= want:
            return None
        pv = format_bytes(want)
        if claim is not None and claim == known:
            return want, f"claim status {format_bytes(claim)} < PV {pv}"
        return want, f"the volume has {format_bytes(known)} on this node < PV {pv}"

    async def _expand_during_mount(
        self,
        pod_uid: str,
        dv: DesiredVolume,
        plugin: VolumePlugin,
        pod_req: VolumeRequest,
        *,
        staged: bool,
    ) -> bool:
        """NodeExpandVolume after the stage (`staged`) or the publish, if the volume needs it.

        Kubelet's rules: a read-only volume is not expanded (a warning; the
        mount goes on); FAILED_PRECONDITION is remembered as an in-use error
        and the mount goes on; any other error fails the mount, leaving the
        device (after the stage) or the pod volume (after the publish)
        Uncertain, so the retry stages / publishes and expands again. The
        call is recorded as its own `volume_fs_resize` operation on the
        device stream. Returns whether expansion was dealt with (False: not
        needed).
        """
        need = self._mount_expansion_need(dv, plugin)
        if need is None:
            return False
        want, why = need
        vid = dv.volume_id
        if self.expand_in_use.get(vid) == want:
            return True
        req = replace(self._request(dv, plugin) if staged else pod_req, size_bytes=want)
        where = "after stage" if staged else "after publish"
        op_id = self.executor.new_op_id()
        stream = device_stream(vid)
        started = OperationStarted(
            op_id=op_id,
            operation=EXPAND_VOLUME,
            volume_id=vid,
            pod_uid=pod_uid,
            plugin=plugin_label(plugin, dv),
            reason=f"expand during mount ({where}): {why}",
        )
        await self._record(stream, started)
        begun = time.monotonic()
        try:
            if dv.read_only:
                raise PluginError(
                    FS_RESIZE_FAILED,
                    "requested read-only file system: not expanded; the mount goes on",
                    ErrorClass.FINAL,
                )
            await self.executor.call_plugin("NodeExpandVolume", lambda: plugin.expand(req, want))
        except PluginError as exc:
            await self._record(stream, _expand_failed(op_id, exc, time.monotonic() - begun))
            if exc.final:
                self.expand_failed[vid] = want
            if exc.code == FS_RESIZE_FAILED:
                log.warning("volume %s of pod %s: %s (%s)", dv.name, pod_uid, exc.message, why)
                return True
            if exc.code == FAILED_PRECONDITION:
                self.expand_in_use[vid] = want
                return True
            await self._expansion_uncertain(pod_uid, dv, req, exc, staged=staged)
            raise PluginError(
                exc.code, f"NodeExpandVolume during mount failed: {exc.message}", exc.error_class
            ) from None
        # Like kubelet (MarkVolumeAsResized with the PV's size), record the size asked
        # for: a driver reporting less (rounding, or 0 for unknown) would otherwise
        # be asked again and again.
        await self._fire_device(vid, "resize", VolumeResized(volume_id=vid, size_bytes=want))
        duration = round(time.monotonic() - begun, 6)
        done = OperationSucceeded(op_id=op_id, operation=EXPAND_VOLUME, duration_s=duration)
        await self._record(stream, done)
        self.expand_failed.pop(vid, None)
        self.expand_in_use.pop(vid, None)
        return True

    async def _expansion_uncertain(
        self, pod_uid: str, dv: DesiredVolume, req: VolumeRequest, exc: PluginError, *, staged: bool
    ) -> None:
        """After a failed expansion during mount: what was set up may not be used as it is."""
        if staged:
            reason = (
                f"expansion after stage failed ({exc.code}: {exc.message}): the next mount"
                " stages and expands again"
            )
            await self._mark_device_uncertain(dv.volume_id, reason, req.device_mount_path)
        else:
            reason = f"expansion during mount failed ({exc.code}: {exc.message})"
            await self._mark_volume_uncertain(pod_uid, dv, reason)

    async def _record(self, stream: str, body: Body) -> None:
        """Append an operation record of a step inside an operation (see the executor's)."""
        await self.handler.record_async(stream, [body])
        faultpoints.hit("append.after", type(body).__name__)

    # ---------------------------------------------------------------- unmount

    async def _unmount(self, pod_uid: str, dv: DesiredVolume, plugin: VolumePlugin) -> None:
        """Clean subpaths -> TearDown (failure: Uncertain) -> Unmounted.

        A volume the log never recorded creating (`found_on_node`) is torn
        down with `keep_files`: what the plugin kept is said in the reason.
        """
        req = self._request(dv, plugin, pod_uid, teardown=True)
        key = (pod_uid, dv.name)
        if key in self.found_on_node:
            req = replace(req, keep_files=True)
        await self._clean_subpaths(pod_uid, dv.name)
        try:
            kept = await self.executor.call_plugin("TearDown", lambda: plugin.tear_down(req))
        except PluginError as exc:
            if exc.error_class is not ErrorClass.TRANSIENT:
                reason = f"teardown failed ({exc.code}: {exc.message})"
                await self._mark_volume_uncertain(pod_uid, dv, reason)
            raise
        if kept:
            log.warning("pod %s volume %s torn down; %s", pod_uid, dv.name, kept)
        await self._unmounted(pod_uid, dv, f"unpublished; {kept}" if kept else "unpublished")
        self.found_on_node.discard(key)

    async def _unmounted(self, pod_uid: str, dv: DesiredVolume, reason: str) -> None:
        body = VolumeUnmounted(
            volume_id=dv.volume_id, pod_uid=pod_uid, volume_name=dv.name, reason=reason
        )
        await self._fire_podvol(pod_uid, dv.name, "unmount", body)

    async def _clean_subpaths(self, pod_uid: str, name: str) -> None:
        """Kubelet's CleanSubPaths: unmount and remove pods/<uid>/volume-subpaths/<name>."""
        try:
            path = self.layout.pod_dir(pod_uid) / SUBPATHS_DIR / name
            path = self.layout.resolve_inside(path)
        except (VolfsmError, OSError) as exc:
            raise _transient("UnsafePath", f"subpaths: {exc}") from None
        if not os.path.lexists(path):
            return
        try:
            await asyncio.to_thread(self._clean_subpaths_sync, path)
        except (VolfsmError, OSError) as exc:
            raise _transient("SubpathCleanupFailed", str(exc)) from None

    def _clean_subpaths_sync(self, path: Path) -> None:
        """Unmount, then remove the directories: volfsm creates no subpath, so a file
        there is not its own (it stays, and the pod dir with it, reported at its cleanup)."""
        for info in mounts.mounts_under(path):
            mounts.umount(info.mount_point)
        if remove_dirs(self.layout, path).gone:
            self.layout.remove_dir(path.parent, stop_at=path.parent.parent)

    async def _unmap(self, pod_uid: str, dv: DesiredVolume, plugin: VolumePlugin) -> None:
        """UnmapBlockVolume (fd lock, pod link, global bind) -> UnmapPodDevice -> Unmounted."""
        req = self._request(dv, plugin, pod_uid, teardown=True)
        global_map, pod_link = _block_paths(req)
        try:
            await blockmap.unmap_block_volume_async(
                self.layout, global_map, pod_uid, pod_link.parent, pod_link.name
            )
        except (VolfsmError, OSError) as exc:
            await self._mark_volume_uncertain(pod_uid, dv, f"unmap failed: {exc}")
            raise PluginError("UnmapBlockVolumeFailed", str(exc), ErrorClass.UNCERTAIN) from None
        try:
            await self.executor.call_plugin("UnmapPodDevice", lambda: plugin.tear_down(req))
        except PluginError as exc:
            if exc.error_class is not ErrorClass.TRANSIENT:
                reason = f"unmap pod device failed ({exc.code}: {exc.message})"
                await self._mark_volume_uncertain(pod_uid, dv, reason)
            raise
        await self._unmounted(pod_uid, dv, "unmapped")

    # ---------------------------------------------------------- device level

    def _refuse_while_held(self, volume_id: str) -> None:
        held = self.holders.holders_of(volume_id)
        if held:
            raise _transient(
                "MountRefsExist", f"{held} pod(s) may still have the volume mounted; not unstaging"
            )

    async def _unmount_device(self, dv: DesiredVolume, plugin: VolumePlugin) -> None:
        """Refuse while referenced -> UnmountDevice (failure: Uncertain) -> still open? -> done."""
        vid = dv.volume_id
        self._refuse_while_held(vid)
        req = self._request(dv, plugin)
        if req.device_mount_path is not None:
            refs = await asyncio.to_thread(_other_mount_refs, req.device_mount_path)
            if refs:
                raise _transient(
                    "MountRefsExist",
                    f"{req.device_mount_path} is still mounted by other references: "
                    + ", ".join(refs),
                )
        if plugin.is_device_mountable(dv.source):  # else nothing was staged (reconstructed)
            try:
                await self.executor.call_plugin("UnmountDevice", lambda: plugin.unmount_device(req))
            except PluginError as exc:
                if exc.error_class is not ErrorClass.TRANSIENT:
                    reason = f"unstage failed ({exc.code}: {exc.message})"
                    await self._mark_device_uncertain(vid, reason, req.device_mount_path)
                raise
        await self._check_device_closed(dv, plugin, req)
        await self._fire_device(
            vid, "unmount_device", DeviceUnmounted(volume_id=vid, reason="unstaged")
        )

    async def _check_device_closed(
        self, dv: DesiredVolume, plugin: VolumePlugin, req: VolumeRequest
    ) -> None:
        still_open = await self.executor.call_plugin(
            "DeviceOpened", lambda: plugin.device_still_open(req)
        )
        if still_open:
            reason = "the device is still open after unstage"
            await self._mark_device_uncertain(dv.volume_id, reason, req.device_mount_path)
            raise PluginError("DeviceStillOpen", reason, ErrorClass.UNCERTAIN)

    async def _unmap_device(self, dv: DesiredVolume, plugin: VolumePlugin) -> None:
        """Refuse while pods map it -> TearDownDevice -> remove global map dir -> still open?"""
        vid = dv.volume_id
        self._refuse_while_held(vid)
        req = self._request(dv, plugin)
        global_map = req.device_mount_path
        if global_map is not None:
            refs = await blockmap.device_bind_mount_refs_async(self.layout, global_map)
            if refs:
                shown = ", ".join(p.name for p in refs)
                raise _transient("MountRefsExist", f"{global_map} is still mapped by: {shown}")
        if plugin.is_device_mountable(dv.source):
            try:
                await self.executor.call_plugin(
                    "TearDownDevice", lambda: plugin.unmount_device(req)
                )
            except PluginError as exc:
                if exc.error_class is not ErrorClass.TRANSIENT:
                    reason = f"unstage failed ({exc.code}: {exc.message})"
                    await self._mark_device_uncertain(vid, reason, global_map)
                raise
        if global_map is not None:
            try:
                await blockmap.remove_global_map_dir_async(self.layout, global_map)
            except (VolfsmError, OSError) as exc:
                await self._mark_device_uncertain(vid, f"global map dir: {exc}", global_map)
                raise PluginError("RemoveMapPathFailed", str(exc), ErrorClass.UNCERTAIN) from None
        await self._check_device_closed(dv, plugin, req)
        await self._fire_device(
            vid, "unmount_device", DeviceUnmounted(volume_id=vid, reason="unmapped")
        )

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


def _claimed_size(dv: DesiredVolume) -> int | None:
    """The size the claim says the volume has: status.capacity, else the PV's capacity."""
    return dv.claim_capacity_bytes if dv.claim_capacity_bytes is not None else dv.size_bytes


def _expand_failed(op_id: str, exc: PluginError, duration: float) -> OperationFailed:
    """The outcome record of a failed expansion during mount (no backoff of its own)."""
    return OperationFailed(
        op_id=op_id,
        operation=EXPAND_VOLUME,
        code=exc.code,
        message=exc.message,
        final=exc.final,
        duration_s=round(duration, 6),
    )


def confined(root: Path, path: Path | str, *, link: bool = False) -> Path:
    """`path` itself if it is inside `root` and no existing component below `root` is a symlink.

    A pre-check before a plugin is called: absolute, normalised (no '.',
    '..', '//'), under the root, and every existing component below the
    root is not a symlink - except the last one when `link` (a block pod
    device link, which blockmap replaces or removes as a link). The plugins
    and `RootLayout` still refuse symlinks when they create or remove
    anything; this check makes an escaping path fail before the plugin is
    reached, so that no state changes (TRANSIENT).
    """
    text = os.fspath(path)
    base = os.fspath(root)
    if not text.startswith(base + "/") or os.path.normpath(text) != text:
        raise UnsafePathError(text, "path", f"is not a normalised path inside the root dir {base}")
    parts = text[len(base) + 1 :].split("/")
    check = parts[:-1] if link else parts
    current = base
    for part in check:
        current = f"{current}/{part}"
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(
                text,
                "path",
                f"{current} is a symlink (to {os.readlink(current)!r}); not following it",
            )
    return Path(text)


def _other_mount_refs(device_mount_path: Path) -> list[str]:
    """Kubelet's GetDeviceMountRefs: other mount points of what is mounted at the path."""
    infos = mounts.read_mountinfo()
    target = os.fspath(device_mount_path)
    mine = [i for i in infos if i.mount_point == target]
    if not mine:
        return []
    top = mine[-1]
    return sorted(
        {
            i.mount_point
            for i in infos
            if (i.major, i.minor) == (top.major, top.minor)
            and i.root == top.root
            and i.mount_point != target
        }
    )


__all__ = [
    "ADOPT_RECONSTRUCTED",
    "EXPAND_VOLUME",
    "FAILED_PRECONDITION",
    "FS_RESIZE_FAILED",
    "MAP_VOLUME",
    "MARK_DETACHED",
    "UNMAP_DEVICE",
    "UNMAP_VOLUME",
    "UNMOUNT_DEVICE",
    "VOLUME_MOUNT",
    "VOLUME_UNMOUNT",
    "OperationGenerator",
    "confined",
    "mount_key_pod",
    "plugin_label",
]

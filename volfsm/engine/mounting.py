"""The mount path of an operation: attach, stage, expand during mount, publish, map.

Kubelet's MountVolume / MapVolume in its order: wait for attach, mark
attached (and the claim's size), stage unless globally mounted (MountDevice
/ SetUpDevice), expand right after the stage if the volume needs it,
publish (SetUp / MapPodDevice), map a block device, expand after the
publish if not done after the stage, then Mounted. Expansion during mount
is its own `volume_fs_resize` operation record on the device stream
(README, "Expansion during mount").
"""

from __future__ import annotations

import time
from dataclasses import replace

from loguru import logger

from events.streams import device_stream
from events.tables import DETACHED, GLOBALLY_MOUNTED
from events.types import (
    DesiredVolume,
    DeviceAttached,
    DeviceMounted,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    VolumeMounted,
    VolumeResized,
)
from volfsm.desired.quantity import format_bytes
from volfsm.engine.opcore import (
    EXPAND_VOLUME,
    OperationCore,
    block_request_paths,
    plugin_label,
    transient_error,
)
from volfsm.errors import IllegalTransitionError, VolfsmError
from volfsm.node import blockmap
from volfsm.plugins.base import BLOCK, ErrorClass, PluginError, VolumePlugin, VolumeRequest

FAILED_PRECONDITION = "FailedPrecondition"
"""The driver's "volume in use": node expansion is not tried again on this node."""
FS_RESIZE_FAILED = "FileSystemResizeFailed"
"""Kubelet's warning reason: a read-only volume is not expanded during mount."""

log = logger.bind(logger_name="volfsm.engine.operations")


class MountSteps(OperationCore):
    """The body of a mount / map operation (see the module doc)."""

    async def _mount(self, pod_uid: str, dv: DesiredVolume, plugin: VolumePlugin) -> None:
        """Wait for attach -> attach -> stage unless staged (-> expand) -> publish (-> map)
        -> expand unless done after the stage -> Mounted."""
        self.found_on_node.discard((pod_uid, dv.name))  # mounted for a desired pod: volfsm's
        vid = dv.volume_id
        block = dv.volume_mode == BLOCK
        req = self._request(dv, plugin, pod_uid)
        if block:
            block_request_paths(req)  # refuse before anything is called
        attachable = plugin.is_attachable(dv.source, inline=not dv.pv_name)
        attach_path = ""
        if attachable:
            attach_path = await self._wait_for_attach(plugin, req)
        await self._ensure_attached(dv, plugin, attachable, attach_path)
        if attach_path and attach_path != req.device_path:
            req = replace(req, device_path=attach_path)
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
            ownership=result.ownership,
            ownership_s=round(result.ownership_s, 6),
            contents=result.contents,
        )
        await self._fire_podvol_last(pod_uid, dv.name, "mount", body)

    async def _wait_for_attach(self, plugin: VolumePlugin, req: VolumeRequest) -> str:
        """WaitForAttach with its own timeout; any failure is "before the driver" (no change)."""
        try:
            return await self.executor.call_plugin(
                "WaitForAttach", lambda: plugin.wait_for_attach(req), self.wait_for_attach_timeout
            )
        except PluginError as exc:
            raise transient_error(exc.code, f"waiting for attach: {exc.message}") from None

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
        global_map, pod_link = block_request_paths(req)
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
                log.warning("volume {} of pod {}: {} ({})", dv.name, pod_uid, exc.message, why)
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

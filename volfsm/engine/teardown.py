"""Teardown: unmount / unmap for a pod, unstage / unmap a device.

Kubelet's UnmountVolume (clean subpaths, TearDown), UnmapVolume (unmap the
block device, UnmapPodDevice), UnmountDevice and UnmapDevice (refused while
any pod may still use the volume or another mount references it, then the
plugin; a device still open afterwards is Uncertain). A failed teardown or
unstage marks its entry Uncertain. A volume the log never recorded creating
(`OperationCore.found_on_node`) is torn down with `keep_files`.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

from loguru import logger

from events.types import (
    DesiredVolume,
    DeviceUnmounted,
    VolumeUnmounted,
)
from volfsm.engine.opcore import (
    OperationCore,
    block_request_paths,
    transient_error,
)
from volfsm.errors import VolfsmError
from volfsm.node import blockmap, mounts
from volfsm.node.dirsonly import remove_dirs
from volfsm.plugins.base import ErrorClass, PluginError, VolumePlugin, VolumeRequest

SUBPATHS_DIR = "volume-subpaths"

log = logger.bind(logger_name="volfsm.engine.operations")


class TeardownSteps(OperationCore):
    """The body of an unmount / unmap / unstage operation (see the module doc)."""

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
            log.warning("pod {} volume {} torn down; {}", pod_uid, dv.name, kept)
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
            raise transient_error("UnsafePath", f"subpaths: {exc}") from None
        if not os.path.lexists(path):
            return
        try:
            await asyncio.to_thread(self._clean_subpaths_sync, path)
        except (VolfsmError, OSError) as exc:
            raise transient_error("SubpathCleanupFailed", str(exc)) from None

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
        global_map, pod_link = block_request_paths(req)
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

    def _refuse_while_held(self, volume_id: str) -> None:
        held = self.holders.holders_of(volume_id)
        if held:
            raise transient_error(
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
                raise transient_error(
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
                raise transient_error("MountRefsExist", f"{global_map} is still mapped by: {shown}")
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

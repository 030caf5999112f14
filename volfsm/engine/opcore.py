"""The operation generator's core: plugin requests, transitions, and kubelet's error rules.

`OperationCore` holds what every operation body shares (`volfsm.engine.mounting`
for the mount path, `volfsm.engine.teardown` for unmount and unstage; the
generator itself is `volfsm.engine.operations.OperationGenerator`):

* `_request` builds the plugin request; the plugin computes its paths, which
  are checked to lie inside the root with no symlink on the way (`confined`);
* `_fire_device` / `_fire_podvol` fire a transition, primed from the ASW;
* the error rules of reference §1.3: a failed stage or publish moves
  NotMounted to Uncertain on a timeout or non-final error, and Uncertain
  back to NotMounted on a final one, except for entries found by
  reconstruction (`_device_error`, `_volume_error`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from events.streams import device_stream, podvol_stream
from events.tables import ATTACHED, DETACHED, UNCERTAIN, UNMOUNTED
from events.types import (
    Body,
    DesiredVolume,
    DeviceMountUncertain,
    DeviceUnmounted,
    PodAdded,
    VolumeMountUncertain,
    VolumeSource,
    VolumeUnmounted,
)
from projections.asw import Asw
from volfsm import faultpoints
from volfsm.engine.executor import OperationExecutor, defer_final
from volfsm.engine.handler import CommandHandler
from volfsm.errors import VolfsmError
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

    def pod_spec(self, uid: str) -> PodAdded | None:
        """The pod as desired (or as last desired), for its name and service account."""


def plugin_label(plugin: VolumePlugin, dv: DesiredVolume) -> str:
    """The plugin as metrics name it: 'kubernetes.io/csi:<driver>' for CSI drivers."""
    driver = dv.source.driver
    return f"{plugin.name}:{driver}" if driver else plugin.name


def transient_error(code: str, message: str) -> PluginError:
    """An error before the plugin was reached: no state changes."""
    return PluginError(code, message, ErrorClass.TRANSIENT)


def block_request_paths(req: VolumeRequest) -> tuple[Path, Path]:
    """(global map path, pod device link) of a block request; TRANSIENT error if missing."""
    if req.device_mount_path is None or req.mount_path is None:
        raise transient_error(
            "InvalidPath", "a block volume needs a global map path and a pod device map path"
        )
    return req.device_mount_path, req.mount_path


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


class OperationCore:
    """State and helpers shared by every operation body (see the module doc)."""

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

    def find_plugin(self, source: VolumeSource) -> VolumePlugin | PluginError:
        """The plugin serving `source`, or the (TRANSIENT) error saying why there is none."""
        try:
            return self.plugins.find(source)
        except PluginError as exc:
            return exc

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

    async def _fire_podvol(
        self, pod_uid: str, name: str, trigger: str, body: Body, then: Sequence[Body] = ()
    ) -> None:
        stream = podvol_stream(pod_uid, name)
        pv = self.asw.podvols.get((pod_uid, name))
        if pv is not None:
            self.handler.prime(stream, pv.state, pv.version)
        else:
            self.handler.prime(stream, UNMOUNTED, 0)
        await self.handler.fire_async(stream, trigger, body, then)
        faultpoints.hit("append.after", type(body).__name__)

    async def _fire_podvol_last(self, pod_uid: str, name: str, trigger: str, body: Body) -> None:
        """The operation's last transition: appended by the executor in one append with its
        OperationSucceeded (`defer_final`), or now if that cannot be."""

        async def fire(then: Sequence[Body]) -> None:
            await self._fire_podvol(pod_uid, name, trigger, body, then)

        if not defer_final(podvol_stream(pod_uid, name), fire):
            await fire(())

    def _checked(self, path: Path | None, what: str, *, link: bool = False) -> Path | None:
        """`path` if it lies inside the root with no symlink on the way (see `confined`)."""
        if path is None:
            return None
        try:
            return confined(self.layout.root, path, link=link)
        except UnsafePathError as exc:
            raise transient_error("UnsafePath", f"{what}: {exc}") from None

    def _request(
        self, dv: DesiredVolume, plugin: VolumePlugin, pod_uid: str = "", *, teardown: bool = False
    ) -> VolumeRequest:
        """The plugin request; the plugin computes its paths, checked to lie inside the root."""
        pod = self.holders.pod_spec(pod_uid) if pod_uid and self.holders is not None else None
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
            fs_group=dv.fs_group,
            fs_group_change_policy=dv.fs_group_change_policy,
            pod_name=pod.name if pod is not None else "",
            pod_namespace=pod.namespace if pod is not None else "",
            service_account=pod.service_account if pod is not None else "",
        )
        root = self.layout.root
        try:
            device_path = plugin.device_mount_path(root, req)
            mount_path = plugin.pod_mount_path(root, req) if pod_uid else None
        except (VolfsmError, OSError) as exc:
            raise transient_error("UnsafePath", str(exc)) from None
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
            mount_path=mount_path
            if plugin.pod_path_outside_root or (plugin.walks_pod_path and not teardown)
            else self._checked(
                mount_path, "pod mount path", link=teardown or dv.volume_mode == BLOCK
            ),
        )

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

    async def _record(self, stream: str, body: Body) -> None:
        """Append an operation record of a step inside an operation (see the executor's)."""
        await self.handler.record_async(stream, [body])
        faultpoints.hit("append.after", type(body).__name__)

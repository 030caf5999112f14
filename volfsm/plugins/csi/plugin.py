"""The CSI volume plugin: what the kubelet does around a CSI driver's Node service.

Kubelet's `pkg/volume/csi` (reference csi-node-service.md §4): the plugin
discovers the driver's capabilities and follows them, creates the
directories and `vol_data.json` files the caller must create, removes them
after success (and after final errors only: after a timeout the driver may
still be using them), builds requests with the kubelet's access-mode
mapping, and checks /proc/self/mountinfo after a stage or publish reports
success, recording what it found instead of trusting the driver.

Paths (see `volfsm.plugins.csi.paths`): for filesystem volumes
`device_mount_path` is the staging path `…/<driver>/<sha256>/globalmount`
and `pod_mount_path` the publish target `pods/<uid>/volumes/kubernetes.io~csi/
<specName>/mount`. For block volumes they are what the engine's block
mapping needs, the global map dir `…/volumeDevices/<specName>/dev` and the
pod's device link `pods/<uid>/volumeDevices/kubernetes.io~csi/<specName>`;
the CSI staging and publish paths of a block volume are the plugin's own,
and `set_up` returns the published device file as `MountResult.device_path`.

Errors: TRANSIENT when the driver was not called (socket missing, a
directory could not be made); the gRPC classes of `errors.classify` for
the call itself; UNCERTAIN when the driver said OK but the node disagrees
at teardown (still mounted) or the caller's cleanup could not finish.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from loguru import logger

from events.types import VolumeSource
from volfsm.desired.kinds import CSIDriverSpec
from volfsm.errors import VolfsmError
from volfsm.node import ownership
from volfsm.node.dirsonly import first_kept
from volfsm.node.layout import CSI_PLUGIN, RootLayout
from volfsm.plugins.base import (
    BLOCK,
    ErrorClass,
    MountResult,
    PluginError,
    VolumePlugin,
    VolumeRequest,
)
from volfsm.plugins.csi import driverspec, files, paths, requests, verify
from volfsm.plugins.csi.client import (
    DEFAULT_TIMEOUT_S,
    CsiClient,
    DriverInfo,
    NodeCapabilities,
    VolumeStatsReply,
    wait_for_socket,
)
from volfsm.plugins.csi.construct import CsiVolumes
from volfsm.plugins.csi.driverspec import DriverObjects
from volfsm.plugins.csi.paths import valid_driver_name
from volfsm.plugins.csi.requests import access_mode
from volfsm.plugins.objectvol.tokens import TokenError

__all__ = ["CsiPlugin", "SecretLookup", "access_mode"]

SecretLookup = Callable[[str], Mapping[str, str]]
"""Secret data for a reference "namespace/name" (volfsm itself reads no Kubernetes Secret)."""

NAME_MISMATCH = "DriverNameMismatch"
KEPT_OWNER = " the log did not create"


def _transient(code: str, exc: BaseException | str) -> PluginError:
    return PluginError(code, str(exc), ErrorClass.TRANSIENT)


class CsiPlugin(CsiVolumes, VolumePlugin):
    """Drives one CSI driver. `start()` waits for the socket, probes and reads capabilities.

    Register it in the catalog after `start()` succeeded, as kubelet
    registers a driver only after it answered; an operation on a plugin
    not started yet starts it first (without waiting for the socket).
    Its reconstruction hooks are `CsiVolumes`' (they need no driver).
    """

    name = CSI_PLUGIN

    def __init__(
        self,
        driver: str,
        endpoint: str,
        layout: RootLayout,
        *,
        node_name: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        socket_wait_s: float = 30.0,
        strict_name: bool = True,
        secrets: SecretLookup | None = None,
    ) -> None:
        if not valid_driver_name(driver):
            raise ValueError(f"CSI driver name {driver!r} is not a DNS-like name of 1-63 chars")
        self.driver = driver
        self.endpoint = endpoint
        self.layout = layout
        self.node_name = node_name
        self.client = CsiClient(endpoint, timeout_s=timeout_s)
        self.socket_wait_s = socket_wait_s
        self.strict_name = strict_name
        self.secrets = secrets
        self.caps = NodeCapabilities()
        self.info: DriverInfo | None = None
        self.objects = DriverObjects()
        self._warned_refs: set[str] = set()

    # ---------------------------------------------------------- lifecycle

    async def start(self, socket_wait_s: float | None = None) -> DriverInfo:
        """Wait for the socket, then GetPluginInfo/Probe/NodeGetInfo and NodeGetCapabilities.

        Every failure is TRANSIENT (no volume was touched). A driver that
        calls itself something else than the name it was registered under is
        refused unless `strict_name` is off (then it is only logged).
        """
        wait_s = self.socket_wait_s if socket_wait_s is None else socket_wait_s
        await wait_for_socket(self.endpoint, wait_s)
        try:
            info = await self.client.driver_info()
            if info.name != self.driver:
                message = (
                    f"CSI driver at {self.endpoint} calls itself {info.name!r},"
                    f" but is registered as {self.driver!r}"
                )
                if self.strict_name:
                    raise PluginError(NAME_MISMATCH, message, ErrorClass.TRANSIENT)
                logger.warning("{}", message)
            caps = await self.client.node_capabilities()
        except PluginError as err:
            raise PluginError(err.code, err.message, ErrorClass.TRANSIENT) from err
        self.info, self.caps = info, caps
        logger.info("CSI driver {} ready on node {}: {}", self.driver, info.node_id, caps)
        return info

    async def refresh_capabilities(self) -> NodeCapabilities:
        """Ask NodeGetCapabilities again (kubelet asks before every decision; we cache)."""
        self.caps = await self.client.node_capabilities()
        return self.caps

    async def stop(self) -> None:
        """Close the gRPC channel."""
        await self.client.close()

    async def _ready(self) -> NodeCapabilities:
        if self.info is None:
            await self.start(socket_wait_s=0.0)
        return self.caps

    # -------------------------------------------------------- capabilities

    def supports(self, source: VolumeSource) -> bool:
        return source.plugin == CSI_PLUGIN and source.driver == self.driver

    def is_attachable(self, source: VolumeSource, *, inline: bool = False) -> bool:
        """The kubelet's CanAttach: never for an inline (ephemeral) volume; otherwise unless
        the driver's CSIDriver object says ``attachRequired: false`` (no object: attachable).

        An attachable volume's mount waits for attach (`wait_for_attach`) before
        it is staged; one that is not goes to staging at once.
        """
        if inline:
            return False
        return driverspec.attach_required(self.objects.spec(self.driver))

    async def wait_for_attach(self, req: VolumeRequest) -> str:
        """The kubelet's WaitForAttach: the name of the volume's VolumeAttachment
        (``csi-<sha256(handle + driver + node)>``), which it returns as the device path.

        The kubelet polls that object until the external attacher (after
        ControllerPublishVolume) marks it attached, and takes its
        attachmentMetadata as the publish context. volfsm has no API server
        and no attach/detach controller: the controller's attach is assumed
        done, so this returns at once and the publish context stays empty.
        volfsm never calls ControllerPublishVolume itself.
        """
        return paths.attachment_id(req.source.volume_handle, self.driver, self.node_name)

    def is_device_mountable(self, source: VolumeSource) -> bool:
        """Always: without STAGE_UNSTAGE_VOLUME the kubelet still makes the staging dir and json.

        (Inline ephemeral volumes are not staged; `mount_device` does nothing for them.)
        """
        return True

    def supports_block(self, source: VolumeSource) -> bool:
        return True

    def supports_expansion(self, source: VolumeSource) -> bool:
        return self.caps.expand

    def stages(self, req: VolumeRequest) -> bool:
        """NodeStage is sent: the driver has STAGE_UNSTAGE_VOLUME and the volume is a PV."""
        return self._stages(req)

    def _stages(self, req: VolumeRequest) -> bool:
        return self.caps.stage_unstage and not req.ephemeral

    # --------------------------------------------------------------- paths

    def device_mount_path(self, root: Path, req: VolumeRequest) -> Path | None:
        """Staging path (filesystem) or global map dir (block); None for inline volumes."""
        if req.ephemeral:
            return None
        if req.volume_mode == BLOCK:
            return self._block(req).global_map
        return self.layout.csi_staging_path(self.driver, req.source.volume_handle)

    def pod_mount_path(self, root: Path, req: VolumeRequest) -> Path:
        """Publish target (filesystem) or the pod's device link (block)."""
        if req.volume_mode == BLOCK:
            return self.layout.csi_block_pod_device_path(
                req.pod_uid, paths.spec_name(req, required=True)
            )
        return self.layout.csi_publish_path(req.pod_uid, paths.spec_name(req, required=False))

    def _block(self, req: VolumeRequest) -> paths.BlockPaths:
        """The block paths of `req`'s volume (TRANSIENT if its spec name is missing or unsafe)."""
        name = paths.spec_name(req, required=True)
        try:
            return paths.block_paths(self.layout, name)
        except VolfsmError as exc:
            raise _transient("UnsafePath", exc) from None

    # ------------------------------------------------------------ secrets

    def _secrets(self, ref: str) -> Mapping[str, str]:
        """The secret data for `ref`, or none (volfsm reads no Secret unless given a lookup)."""
        if not ref:
            return {}
        if self.secrets is None:
            if ref not in self._warned_refs:
                self._warned_refs.add(ref)
                logger.warning(
                    "CSI driver {}: secret {} is referenced but volfsm reads no Kubernetes"
                    " Secrets; calling without secrets",
                    self.driver,
                    ref,
                )
            return {}
        try:
            return dict(self.secrets(ref))
        except Exception as exc:
            raise _transient("SecretUnavailable", f"secret {ref}: {type(exc).__name__}") from None

    # ---------------------------------------------------------- vol_data

    def _publish_data(self, req: VolumeRequest, name: str) -> dict[str, str]:
        handle = req.source.volume_handle
        return {
            "specVolID": name,
            "volumeHandle": handle,
            "driverName": self.driver,
            "nodeName": self.node_name,
            "attachmentID": paths.attachment_id(handle, self.driver, self.node_name),
            "volumeLifecycleMode": (
                paths.LIFECYCLE_EPHEMERAL if req.ephemeral else paths.LIFECYCLE_PERSISTENT
            ),
        }

    def _block_data(self, req: VolumeRequest, name: str) -> dict[str, str]:
        handle = req.source.volume_handle
        return {
            "specVolID": name,
            "volumeHandle": handle,
            "driverName": self.driver,
            "nodeName": self.node_name,
            "attachmentID": paths.attachment_id(handle, self.driver, self.node_name),
        }

    async def _prepare(
        self, code: str, dirs: tuple[Path, ...], data: Mapping[Path, dict[str, str]]
    ) -> None:
        """Make the directories and json files the caller must make (TRANSIENT on failure)."""

        def work() -> None:
            for path in dirs:
                self.layout.ensure_dir(path)
            for path, content in data.items():
                files.write_json(self.layout, path, content)

        try:
            await asyncio.to_thread(work)
        except (VolfsmError, OSError) as exc:
            raise _transient(code, exc) from None

    async def _cleanup(
        self,
        files_: tuple[Path, ...],
        dirs: tuple[Path, ...],
        trees: tuple[Path, ...] = (),
        *,
        after_error: bool = False,
    ) -> None:
        """Remove what the caller made; after success a failure is UNCERTAIN (CleanupFailed)."""
        if after_error:
            await asyncio.to_thread(files.remove_after_failure, self.layout, files_, dirs, trees)
            return
        try:
            await asyncio.to_thread(files.remove_all, self.layout, files_, dirs, trees)
        except files.CleanupError as exc:
            raise PluginError("CleanupFailed", str(exc), ErrorClass.UNCERTAIN) from None

    async def _refuse_if_mounted(self, rpc: str, path: Path) -> None:
        """After a successful unpublish/unstage: the driver's mount must be gone."""
        info = await asyncio.to_thread(verify.still_mounted, path)
        if info is not None:
            raise PluginError(
                "StillMounted",
                f"{rpc} reported success but {path} is still mounted ({info.fstype} {info.source})",
                ErrorClass.UNCERTAIN,
            )

    # ------------------------------------------------------------- stage

    async def mount_device(self, req: VolumeRequest) -> MountResult:
        """NodeStageVolume; without STAGE_UNSTAGE_VOLUME only the dirs and json are made."""
        if req.ephemeral:
            return MountResult(detail="inline ephemeral volume: not staged")
        caps = await self._ready()
        if req.volume_mode == BLOCK:
            return await self._stage_block(req, caps)
        staging = req.device_mount_path
        if staging is None:
            raise _transient("InvalidArgument", "no staging path in the request")
        data_file = paths.staging_data_file(staging)
        stage_ref = req.source.node_stage_secret_ref if self._stages(req) else ""
        secrets = self._secrets(stage_ref)
        await self._prepare(
            "StagingDir",
            (staging,),
            {data_file: {"volumeHandle": req.source.volume_handle, "driverName": self.driver}},
        )
        if not self._stages(req):
            return MountResult(path=str(staging), detail="driver has no STAGE_UNSTAGE_VOLUME")
        request = requests.stage_request(req, caps, str(staging), secrets)
        try:
            await self.client.stage(request)
        except PluginError as err:
            if err.final:
                await self._cleanup((data_file,), (staging, staging.parent), after_error=True)
            raise
        expected = verify.Expected(
            staging,
            verify.MOUNT,
            fs_type=req.source.fs_type,
            mount_group=req.fs_group if requests.mount_group(req, caps) else None,
        )
        return await asyncio.to_thread(verify.check, expected)

    async def _stage_block(self, req: VolumeRequest, caps: NodeCapabilities) -> MountResult:
        """Block SetUpDevice: staging dir, data/vol_data.json, NodeStage."""
        block = self._block(req)
        name = block.publish_dir.name
        stage_ref = req.source.node_stage_secret_ref if self._stages(req) else ""
        secrets = self._secrets(stage_ref)
        await self._prepare(
            "StagingDir", (block.staging,), {block.data_file: self._block_data(req, name)}
        )
        if not self._stages(req):
            return MountResult(path=str(block.staging), detail="driver has no STAGE_UNSTAGE_VOLUME")
        request = requests.stage_request(req, caps, str(block.staging), secrets)
        try:
            await self.client.stage(request)
        except PluginError as err:
            if err.final:
                await self._cleanup_block(block, after_error=True)
            raise
        return await asyncio.to_thread(
            verify.check, verify.Expected(block.staging, verify.ANYTHING)
        )

    async def _cleanup_block(self, block: paths.BlockPaths, *, after_error: bool = False) -> None:
        """Kubelet's cleanupOrphanDeviceFiles: publish dir, staging dir, volumeDevices/<spec>."""
        await self._cleanup(
            (), (block.publish_dir, block.staging), (block.volume_dir,), after_error=after_error
        )

    async def unmount_device(self, req: VolumeRequest) -> None:
        """NodeUnstageVolume; on success remove the staging dir and its vol_data.json."""
        if req.ephemeral:
            return
        await self._ready()
        if req.volume_mode == BLOCK:
            block = self._block(req)
            if self._stages(req):
                await self.client.unstage(req.source.volume_handle, str(block.staging))
                await self._refuse_if_mounted("NodeUnstageVolume", block.staging)
            await self._cleanup_block(block)
            return
        staging = req.device_mount_path
        if staging is None:
            return
        if self._stages(req):
            await self.client.unstage(req.source.volume_handle, str(staging))
            await self._refuse_if_mounted("NodeUnstageVolume", staging)
        await self._cleanup((paths.staging_data_file(staging),), (staging, staging.parent))

    # ----------------------------------------------------------- publish

    async def set_up(self, req: VolumeRequest) -> MountResult:
        """NodePublishVolume to pods/<uid>/volumes/kubernetes.io~csi/<spec>/mount (or a file)."""
        caps = await self._ready()
        if req.volume_mode == BLOCK:
            return await self._publish_block(req, caps)
        target = req.mount_path
        if target is None:
            raise _transient("InvalidArgument", "no target path in the request")
        spec = self.objects.spec(self.driver)
        context = await asyncio.to_thread(self._publish_context, spec, req)  # a token command
        name = target.parent.name
        data_file = paths.publish_data_file(target)
        secrets = self._secrets(req.source.node_publish_secret_ref)
        await self._prepare(
            "PublishDir", (target.parent,), {data_file: self._publish_data(req, name)}
        )
        staging = req.device_mount_path if self._stages(req) else None
        request = requests.publish_request(
            req, caps, str(staging) if staging is not None else "", str(target), secrets, context
        )
        try:
            await self.client.publish(request)
        except PluginError as err:
            if err.final:
                await self._cleanup((data_file,), (target, target.parent), after_error=True)
            raise
        expected = verify.Expected(
            target,
            verify.MOUNT,
            read_only=req.read_only,
            fs_type=req.source.fs_type,
            same_device_as=staging,
            mount_group=req.fs_group if requests.mount_group(req, caps) else None,
        )
        result = await asyncio.to_thread(verify.check, expected)
        if requests.mount_group(req, caps):
            return result
        if driverspec.applies_fs_group(spec, req):
            return await asyncio.to_thread(self._apply_fs_group, target, req, result)
        if req.fs_group is not None:
            policy = (spec or driverspec.DEFAULT_SPEC).fs_group_policy
            note = f"fsGroup {req.fs_group} not applied (fsGroupPolicy {policy})"
            return replace(result, detail="; ".join(d for d in (result.detail, note) if d))
        return result

    def _publish_context(self, spec: CSIDriverSpec | None, req: VolumeRequest) -> dict[str, str]:
        """The volume context NodePublish gets: the source's attributes, then what the
        CSIDriver object asks for (kubelet keys win). TRANSIENT errors, before any call."""
        problem = driverspec.lifecycle_problem(spec, self.driver, req.ephemeral)
        if problem is not None:
            raise _transient("LifecycleModeNotSupported", problem)
        context = dict(req.source.attributes)
        if spec is None:
            return context
        if spec.pod_info_on_mount:
            context.update(driverspec.pod_info_context(req))
        try:
            context.update(driverspec.token_context(spec, req, self.objects.tokens))
        except TokenError as exc:
            raise _transient("TokenRequestFailed", str(exc)) from None
        return context

    def _apply_fs_group(self, target: Path, req: VolumeRequest, result: MountResult) -> MountResult:
        """The kubelet's ownership pass after NodePublish; a failure leaves the mount
        Uncertain (kubelet: "applyFSGroup failed"), so the teardown still runs."""
        try:
            done = ownership.set_volume_ownership(
                target, req.fs_group, req.fs_group_change_policy, read_only=req.read_only
            )
        except OSError as exc:
            raise PluginError(
                "FSGroupFailed", f"applyFSGroup failed for {target}: {exc}", ErrorClass.UNCERTAIN
            ) from None
        return replace(result, ownership=done.summary(), ownership_s=done.duration_s)

    async def _publish_block(self, req: VolumeRequest, caps: NodeCapabilities) -> MountResult:
        """Block MapPodDevice: the publish dir, NodePublish; the device file is the result."""
        block = self._block(req)
        target = block.publish_path(self.layout, req.pod_uid)
        secrets = self._secrets(req.source.node_publish_secret_ref)
        await self._prepare(
            "PublishDir",
            (block.publish_dir,),
            {block.data_file: self._block_data(req, block.publish_dir.name)},
        )
        staging = str(block.staging) if self._stages(req) else ""
        request = requests.publish_request(req, caps, staging, str(target), secrets)
        try:
            await self.client.publish(request)
        except PluginError as err:
            if err.final:
                await self._cleanup((), (target,), after_error=True)
            raise
        expected = verify.Expected(target, verify.DEVICE, read_only=req.read_only)
        result = await asyncio.to_thread(verify.check, expected)
        return MountResult(
            path=result.path,
            device_path=str(target),
            mount_found=result.mount_found,
            detail=result.detail,
        )

    async def tear_down(self, req: VolumeRequest) -> str | None:
        """NodeUnpublishVolume; then remove what is left (never a mount point).

        A symlink the driver left at a filesystem target is removed as a link,
        without asking the driver (kubelet asks; the driver could then unmount
        whatever the link points at). With `req.keep_files` (the log never
        recorded this volume), a target still holding files after the
        unpublish stays with them (only vol_data.json goes), and that is
        returned: the teardown is done, not retried.
        """
        await self._ready()
        if req.volume_mode == BLOCK:
            device_file = self._block(req).publish_path(self.layout, req.pod_uid)
            await self.client.unpublish(req.source.volume_handle, str(device_file))
            await self._refuse_if_mounted("NodeUnpublishVolume", device_file)
            await self._cleanup((), (device_file,))
            return None
        target = req.mount_path
        if target is None:
            return None
        link = await asyncio.to_thread(_link_target, target)
        if link is None:
            await self.client.unpublish(req.source.volume_handle, str(target))
            await self._refuse_if_mounted("NodeUnpublishVolume", target)
        else:
            # Nothing can be mounted on a symlink (mount(2) resolves it), so there is
            # nothing to unpublish at this path; a driver asked to would unmount
            # through the link, at a place outside the root. Only the link goes.
            logger.warning(
                "CSI driver {}: {} is a symlink (to {!r}), not a publish target; removing"
                " the link without NodeUnpublishVolume",
                self.driver,
                target,
                link,
            )
        if req.keep_files and link is None:
            held = await asyncio.to_thread(first_kept, self.layout, target)
            if held is not None:
                await self._cleanup((paths.publish_data_file(target),), ())
                return f"{target} stays after NodeUnpublishVolume: {held.text(KEPT_OWNER)}"
        await self._cleanup((paths.publish_data_file(target),), (target, target.parent))
        return None

    # ------------------------------------------------------------ expand

    async def expand(self, req: VolumeRequest, new_size: int) -> int:
        """NodeExpandVolume with capacity_range.required_bytes (kubelet always sends it).

        `volume_path` is where the volume is published for the pod when the
        request names a pod, else where it is staged. Without EXPAND_VOLUME
        there is nothing to do on the node.
        """
        caps = await self._ready()
        if not caps.expand:
            return new_size
        staging = ""
        if self._stages(req):
            if req.volume_mode == BLOCK:
                staging = str(self._block(req).staging)
            elif req.device_mount_path is not None:
                staging = str(req.device_mount_path)
        volume_path = self._volume_path(req) or staging
        if not volume_path:
            raise _transient("InvalidArgument", "expand needs a published or staged volume path")
        request = requests.expand_request(req, caps, volume_path, staging, new_size)
        size = await self.client.expand(request)
        return size or new_size

    def _volume_path(self, req: VolumeRequest) -> str:
        """Where the volume is published for the pod of `req` ("" for device-level requests)."""
        if not req.pod_uid:
            return ""
        if req.volume_mode == BLOCK:
            return str(self._block(req).publish_path(self.layout, req.pod_uid))
        return str(req.mount_path) if req.mount_path is not None else ""

    # ------------------------------------------------------------- stats

    async def volume_stats(self, req: VolumeRequest) -> dict[str, int]:
        """NodeGetVolumeStats at the pod's publish path (as kubelet: volume_id + volume_path)."""
        return (await self.volume_stats_reply(req)).usage

    async def volume_stats_reply(self, req: VolumeRequest) -> VolumeStatsReply:
        """`volume_stats` with the volume condition, kept only if the driver has
        VOLUME_CONDITION (kubelet ignores a condition the driver did not advertise)."""
        caps = await self._ready()
        if not caps.get_volume_stats:
            raise PluginError(
                "Unimplemented", f"driver {self.driver} has no GET_VOLUME_STATS", ErrorClass.FINAL
            )
        volume_path = self._volume_path(req)
        if not volume_path:
            raise _transient("InvalidArgument", "stats need the pod's publish path")
        reply = await self.client.volume_stats_reply(req.source.volume_handle, volume_path)
        return reply if caps.volume_condition else VolumeStatsReply(reply.usage)


def _link_target(path: Path) -> str | None:
    """Where `path` points if it is a symlink, else None."""
    try:
        return os.readlink(path)
    except OSError:  # not a link, or gone
        return None

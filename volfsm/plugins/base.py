"""The volume plugin interface (kubelet's VolumePlugin / Attacher / DeviceMounter / Mounter).

The operation executor drives plugins only through this interface; CSI,
emptyDir and the scripted test plugin implement it. Every call is async and
may be cancelled by the executor's timeout.

Errors: a plugin raises `PluginError` with an `ErrorClass` that decides the
FSM transition (kubelet reference §1.3):

* TRANSIENT - failed before the driver was reached: state is left alone;
* UNCERTAIN - timeout or non-final error: the call may still be in progress
  (NotMounted -> Uncertain; Mounted is never downgraded);
* FINAL - the driver answered with a final error (Uncertain -> NotMounted,
  except for reconstructed entries).

Any other exception escaping a plugin counts as UNCERTAIN (kubelet treats
non-gRPC errors as non-final, to be on the safe side).
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from pathlib import Path

from events.types import VolumeSource
from volfsm.errors import VolfsmError

FILESYSTEM = "Filesystem"
BLOCK = "Block"


class ErrorClass(enum.StrEnum):
    """How far an operation got before it failed; decides the transition."""

    TRANSIENT = "transient"
    UNCERTAIN = "uncertain"
    FINAL = "final"


class PluginError(VolfsmError):
    """A plugin call failed. `code` is a gRPC code name or a short volfsm code."""

    def __init__(self, code: str, message: str, error_class: ErrorClass) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.error_class = error_class

    @property
    def final(self) -> bool:
        """True when the operation is known to have finished (IsOperationFinishedError)."""
        return self.error_class is ErrorClass.FINAL


@dataclass(frozen=True)
class VolumeRequest:
    """Everything one plugin call needs to know about the volume and the pod.

    Paths are absolute and already checked to be inside the root dir.
    `device_mount_path` is the staging (filesystem) or global map (block)
    path; `mount_path` is the pod's publish path (filesystem) or the pod
    device map path (block). `pod_uid`/`volume_name` are empty for
    device-level calls (stage, unstage). `spec_name` is the PV name (the
    pod's volume name for inline volumes): CSI block paths are named by it.
    `ephemeral` marks an inline (pod-scoped) volume, which is never staged.
    `fs_group` is the pod's fsGroup (securityContext), if any: CSI drivers
    with VOLUME_MOUNT_GROUP get it as volume_mount_group.
    `keep_files` (teardown only): the log never recorded creating this
    volume (found on the node after a lost log, or in an adopted root dir),
    so the teardown must not delete a file: it removes directories only
    and says what it kept.
    """

    volume_id: str
    source: VolumeSource
    volume_mode: str = FILESYSTEM
    read_only: bool = False
    size_bytes: int | None = None
    pod_uid: str = ""
    volume_name: str = ""
    device_path: str = ""
    device_mount_path: Path | None = None
    mount_path: Path | None = None
    spec_name: str = ""
    ephemeral: bool = False
    fs_group: int | None = None
    keep_files: bool = False


@dataclass(frozen=True)
class MountResult:
    """What a successful stage/publish produced and what the node showed afterwards."""

    path: str = ""
    device_path: str = ""
    mount_found: bool | None = None
    detail: str = ""


class VolumePlugin(abc.ABC):
    """A volume plugin. Subclasses override what their kind of volume supports."""

    #: Fully qualified plugin name, e.g. "kubernetes.io/csi" or "kubernetes.io/empty-dir".
    name: str = ""

    @abc.abstractmethod
    def supports(self, source: VolumeSource) -> bool:
        """Whether this plugin serves `source`."""

    def can_serve(self, source: VolumeSource, volume_mode: str) -> str | None:
        """None if this plugin can serve the source in `volume_mode`, else why not."""
        if volume_mode == BLOCK and not self.supports_block(source):
            return f"plugin {self.name} cannot serve volumeMode Block"
        if volume_mode not in (FILESYSTEM, BLOCK):
            return f"unknown volumeMode {volume_mode!r}"
        return None

    def is_attachable(self, source: VolumeSource) -> bool:
        """Whether the volume must be attached to the node (controller attach) before use."""
        return False

    def is_device_mountable(self, source: VolumeSource) -> bool:
        """Whether the volume is staged once per node (MountDevice / NodeStage)."""
        return False

    def supports_block(self, source: VolumeSource) -> bool:
        """Whether volumeMode Block is possible."""
        return False

    def stages(self, req: VolumeRequest) -> bool:
        """Whether `mount_device` really stages this volume (CSI: NodeStage was sent).

        Expansion during mount follows the stage when it does, else the publish.
        Asked after `mount_device` succeeded.
        """
        return self.is_device_mountable(req.source)

    def supports_expansion(self, source: VolumeSource) -> bool:
        """Whether node-side expansion (NodeExpand / fs resize) is needed and possible."""
        return False

    # -------------------------------------------------------------- paths

    def device_mount_path(self, root: Path, req: VolumeRequest) -> Path | None:
        """Staging path (filesystem) or global map path (block); None if not device-mountable."""
        return None

    @abc.abstractmethod
    def pod_mount_path(self, root: Path, req: VolumeRequest) -> Path:
        """The pod's mount path (filesystem) or pod device map path (block)."""

    # --------------------------------------------------------- operations

    async def wait_for_attach(self, req: VolumeRequest) -> str:
        """Wait until the volume is attached; the device path ("" if none)."""
        return ""

    async def mount_device(self, req: VolumeRequest) -> MountResult:
        """Stage the device at `req.device_mount_path` (NodeStage / SetUpDevice for block)."""
        raise PluginError("Unimplemented", f"{self.name} is not device-mountable", ErrorClass.FINAL)

    async def unmount_device(self, req: VolumeRequest) -> None:
        """Unstage the device (NodeUnstage / TearDownDevice for block)."""
        raise PluginError("Unimplemented", f"{self.name} is not device-mountable", ErrorClass.FINAL)

    async def device_still_open(self, req: VolumeRequest) -> bool:
        """After a successful unstage: is the device still opened by someone?"""
        return False

    @abc.abstractmethod
    async def set_up(self, req: VolumeRequest) -> MountResult:
        """Publish for the pod at `req.mount_path` (NodePublish / SetUp / MapPodDevice)."""

    @abc.abstractmethod
    async def tear_down(self, req: VolumeRequest) -> str | None:
        """Unpublish for the pod (NodeUnpublish / TearDown / UnmapPodDevice).

        Returns what it left in place on purpose (with `req.keep_files`: files
        of a volume the log did not create), as one line, or None.
        """

    async def expand(self, req: VolumeRequest, new_size: int) -> int:
        """Grow the volume on the node to `new_size`; the size it now has."""
        raise PluginError("Unimplemented", f"{self.name} cannot expand", ErrorClass.FINAL)

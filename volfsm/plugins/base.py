"""The volume plugin interface (kubelet's VolumePlugin / Attacher / DeviceMounter / Mounter).

The operation executor drives plugins only through this interface; CSI,
emptyDir and the scripted test plugin implement it. Every call is async and
may be cancelled by the executor's timeout.

Reconstruction reads the node back through the same plugins
(`SpecConstructor`, kubelet's ConstructVolumeSpec / ConstructBlockVolumeSpec):
the engine scans ``pods/<uid>/volumes|volumeDevices/<plugin~>/<name>`` and
hands each entry to the plugin owning that dir name, and each plugin lists
its own global dirs under ``plugins/``. A plugin is the only code that reads
the files it writes (CSI's ``vol_data.json``, emptyDir's tmpfs); the engine
knows no volume type.

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
import contextlib
import enum
import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from events.types import DesiredVolume, VolumeSource
from volfsm.errors import VolfsmError
from volfsm.node.layout import (
    VOLUME_DEVICES,
    PathInUseError,
    RootLayout,
    UnsafePathError,
    escape_plugin_name,
)
from volfsm.node.mounts import MountError, MountInfo

FILESYSTEM = "Filesystem"
BLOCK = "Block"


class NotRegistered(str):
    """A `can_serve` answer: the volume's CSI driver has not registered on this node (yet).

    Not the pod's fault: the kubelet keeps such a pod and retries the mount
    until the driver registers; volfsm keeps it pending (`PodPending`)."""

    __slots__ = ()


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


def os_error(exc: OSError, what: str, error_class: ErrorClass) -> PluginError:
    """`exc` as a PluginError coded by its errno name ("EACCES", ...)."""
    code = errno.errorcode.get(exc.errno or 0, "OSError")
    return PluginError(code, f"{what}: {exc.strerror or exc}", error_class)


@contextlib.contextmanager
def teardown_errors(volume_dir: Path) -> Iterator[None]:
    """What a teardown of the files under `volume_dir` can meet, as UNCERTAIN PluginErrors
    (the volume may still be there): a symlink on the way, a mount inside, a failed unmount,
    any other OS error."""
    try:
        yield
    except UnsafePathError as exc:
        raise PluginError("UnsafePath", str(exc), ErrorClass.UNCERTAIN) from None
    except PathInUseError as exc:
        raise PluginError("MountedInside", str(exc), ErrorClass.UNCERTAIN) from None
    except MountError as exc:
        raise PluginError(exc.code, str(exc), ErrorClass.UNCERTAIN) from None
    except OSError as exc:
        raise os_error(exc, f"removing {volume_dir}", ErrorClass.UNCERTAIN) from None


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
    with VOLUME_MOUNT_GROUP get it as volume_mount_group; plugins that own
    their files apply it with `volfsm.node.ownership` (honouring
    `fs_group_change_policy` where the kubelet does). `pod_name`,
    `pod_namespace` and `service_account` name the pod (CSI podInfoOnMount
    and tokenRequests).
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
    fs_group_change_policy: str = ""
    pod_name: str = ""
    pod_namespace: str = ""
    service_account: str = ""
    keep_files: bool = False


@dataclass(frozen=True)
class MountResult:
    """What a successful stage/publish produced and what the node showed afterwards."""

    path: str = ""
    device_path: str = ""
    mount_found: bool | None = None
    detail: str = ""
    ownership: str = ""
    """What the fsGroup ownership pass did, in one line ("" if none ran)."""
    ownership_s: float = 0.0
    contents: str = ""
    """Which object versions the files were made from, no values ("" if none)."""


# ------------------------------------------------------------- reconstruction


@dataclass(frozen=True, slots=True)
class PodVolumeDir:
    """One entry under pods/<uid>/volumes/<plugin~>/ or pods/<uid>/volumeDevices/<plugin~>/."""

    pod_uid: str
    sub: str
    """"volumes" or "volumeDevices"."""
    escaped: str
    """The escaped plugin name of the dir holding it ("kubernetes.io~csi")."""
    name: str
    path: Path
    is_dir: bool

    @property
    def block(self) -> bool:
        """Whether it is a block volume's entry (under volumeDevices/)."""
        return self.sub == VOLUME_DEVICES

    @property
    def key(self) -> tuple[str, str, str, str]:
        """(uid, sub, escaped plugin, name)."""
        return (self.pod_uid, self.sub, self.escaped, self.name)


@dataclass(frozen=True, slots=True)
class GlobalDir:
    """A plugin's per-volume dir under plugins/<plugin>/ (CSI: a staging dir
    ``<driver>/<sha256(handle)>`` or a block volume dir ``volumeDevices/<spec>``)."""

    plugin: str
    path: Path
    name: str
    device_path: Path
    """Where the device is staged (filesystem) or mapped (block) inside it."""
    block: bool = False


@dataclass
class GlobalScan:
    """A plugin's global dirs on the node, and what lies there that is none."""

    dirs: list[GlobalDir] = field(default_factory=list)
    junk: list[tuple[Path, str]] = field(default_factory=list)
    """(path, why it is no volume dir) per entry that is not one."""


@dataclass(frozen=True)
class ConstructedSpec:
    """A volume spec a plugin rebuilt from the node, and where its device would be staged."""

    spec: DesiredVolume
    device_path: Path | None = None
    note: str = ""
    """Where the spec came from, when not from the entry's own files."""


class NodeView(Protocol):
    """What reconstruction's scan saw on the node, for plugins that look around."""

    @property
    def global_dirs(self) -> list[GlobalDir]:
        """Every plugin's global dirs."""

    def mount_at(self, path: Path | str) -> MountInfo | None:
        """The topmost mount exactly at `path` (mountinfo as read once at the scan)."""


def list_dir(layout: RootLayout, path: Path) -> list[tuple[str, bool]] | None:
    """(name, is a directory) per entry of `path`, sorted, following no symlink; None if
    missing. `UnsafePathError` / `OSError` if it cannot be read."""
    try:
        with layout.open_dir(path) as fd, os.scandir(fd) as it:
            return sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
    except FileNotFoundError:
        return None


class SpecConstructor:
    """The reconstruction hooks of a plugin: its volumes read back from what it wrote.

    Every `VolumePlugin` is one. The plugin catalog hands reconstruction one
    constructor per plugin name (CSI's whether or not a driver is registered
    yet, as the kubelet's CSI plugin reads ``vol_data.json`` without the
    driver). A hook answers a `ConstructedSpec`, or a string saying why the
    entry cannot be reconstructed (it then becomes an orphan, cleaned up
    directories only). Hooks run in a worker thread and may block; they
    must not change the node.
    """

    #: Fully qualified plugin name, e.g. "kubernetes.io/csi" or "kubernetes.io/empty-dir".
    name: str = ""
    #: The pod's path is a path of the node's own outside the root dir (hostPath: the
    #: kubelet's GetPath), used as it is: the plugin neither mounts nor removes anything
    #: there, so the engine does not confine it to the root dir.
    pod_path_outside_root: bool = False
    #: The plugin's SetUp walks its pod path itself, following no symlink, before it changes
    #: anything, and fails TRANSIENT on one (the object volumes: `RootLayout.ensure_dir`), so
    #: the engine skips its `confined` pre-check on mounts: a system call per path element
    #: on the event loop, each one a wait for the GIL while SetUp threads run.
    walks_pod_path: bool = False

    def pod_dir_name(self) -> str:
        """The escaped plugin name of its dirs under pods/<uid>/volumes|volumeDevices/."""
        return escape_plugin_name(self.name)

    def volume_dir_name(self, spec: DesiredVolume) -> str:
        """The name of a pod's dir of `spec` under that dir (kubelet: the spec name)."""
        return spec.name

    def is_device_mountable(self, source: VolumeSource) -> bool:
        """Whether the volume is staged once per node (MountDevice / NodeStage)."""
        return False

    def mounts_one_pod_at_a_time(self, source: VolumeSource) -> bool:
        """Whether mounts (maps) of the volume for several pods must not run at once, although
        the plugin stages nothing: its SetUp shares node state across pods (the kubelet's
        plugin is device-mountable, so the kubelet keys its mounts per volume)."""
        return False

    def construct_volume_spec(
        self, layout: RootLayout, entry: PodVolumeDir, node: NodeView
    ) -> ConstructedSpec | str:
        """ConstructVolumeSpec: the spec of a pod's filesystem volume dir, or why not."""
        return f"volume plugin {self.name!r} cannot reconstruct a volume from the node"

    def construct_block_volume_spec(
        self, layout: RootLayout, entry: PodVolumeDir, node: NodeView
    ) -> ConstructedSpec | str:
        """ConstructBlockVolumeSpec: the spec of a pod's block volume entry, or why not."""
        return f"volume plugin {self.name!r} has no block volumes"

    def scan_global_dirs(self, layout: RootLayout) -> GlobalScan:
        """Its per-volume dirs under plugins/<plugin>/ (none by default)."""
        return GlobalScan()

    def construct_device_spec(self, layout: RootLayout, entry: GlobalDir) -> ConstructedSpec | str:
        """The spec of a global (staging / map) dir this plugin listed, or why not."""
        return f"volume plugin {self.name!r} cannot reconstruct {entry.path}"

    def spec_from_volume_id(self, volume_id: str, pod_uid: str, name: str) -> DesiredVolume | None:
        """A pod-volume's spec from its unique volume id alone, when nothing is left on
        the node to read (enough for the plugin's teardown); None if it is not this
        plugin's or cannot say."""
        return None

    def device_spec_from_volume_id(
        self, layout: RootLayout, volume_id: str, device_mount_path: str
    ) -> DesiredVolume | None:
        """A staged volume's spec from its id and recorded device mount path, or None."""
        return None

    def expected_pod_mount(self, spec: DesiredVolume) -> str | None:
        """What the plugin itself always mounts at the pod's path, in a few words
        ("emptyDir tmpfs"); "" if it mounts nothing there; None if it cannot say
        (a driver's mount: it counts if the log saw it after the call)."""
        return None

    def block_publish_path(self, layout: RootLayout, global_map: Path, pod_uid: str) -> Path | None:
        """Where a driver published a block volume for the pod (a bind mount the log
        may have seen), given its global map path; None if there is no such path."""
        return None


class VolumePlugin(SpecConstructor, abc.ABC):
    """A volume plugin. Subclasses override what their kind of volume supports."""

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

    def is_attachable(self, source: VolumeSource, *, inline: bool = False) -> bool:
        """Whether the volume must be attached to the node (controller attach) before use.

        `inline`: the volume is a pod's own (no PersistentVolume), e.g. inline CSI.
        """
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

"""Reconstruction at start: the log's beliefs checked against the node, once, before reconciling.

`VolumeEngine.start()` folds the log into the ASW, DSW and index, then runs
`Reconstructor.run()` before the reconciler's first pass:

1. **Interrupted operations.** An `OperationStarted` with no outcome means
   the process died mid-operation. If the operation's own last transition
   (VolumeMounted, VolumeUnmounted, DeviceUnmounted) was recorded after
   its start, the work was done and only the outcome is missing; otherwise
   exactly the entry the operation acts on (the pod-volume for
   mount/unmount/map/unmap, the device for unmount_device/unmap_device)
   is marked Uncertain, with the reason "interrupted: <operation> started
   at seq N has no outcome". An online expansion changes no mount state:
   nothing is marked. Either way an `OperationFailed` (code "Interrupted",
   not final, no backoff) answers the start, so no start dangles and
   replay, explain and analytics show what happened.
2. **The log against the node.** A device the log says is staged
   (DeviceGloballyMounted, and a mount was found at its staging path when
   it was staged) or a pod-volume the log says is Mounted (a CSI publish
   mount was found, an emptyDir of medium Memory, a block device bound on
   its global map file; or simply its path) that the node lacks in
   /proc/self/mountinfo becomes Uncertain with the reason. Entries the
   node confirms stay as they are.

   Every entry marked in steps 1 and 2 carries ``reconstructed=True`` too,
   as the kubelet's IsVolumeReconstructed does for every volume after a
   restart: a final error on the retry leaves it Uncertain rather than
   Unmounted, because a NodePublish killed after it mounted is still
   mounted, and an Unmounted entry is never unpublished when its pod goes.
3. **The node against the log.** Every entry under
   ``pods/<uid>/volumes/<plugin>/<name>`` and ``pods/<uid>/volumeDevices/
   <plugin>/<name>`` and every CSI staging / block volume dir under
   ``plugins/kubernetes.io/csi`` that the log does not hold (log lost,
   restored from a backup, written by another tool) becomes Uncertain
   with the reason "found on node, not in the log" (counted in the
   report's ``reconstructed``).
   Its spec comes from the log when the log knows the pod, else from the
   node: a CSI volume's ``vol_data.json`` (driver, handle, spec name,
   lifecycle), an emptyDir from its path (medium Memory if a tmpfs is
   mounted there). A mounted CSI pod volume whose own ``vol_data.json`` is
   unusable takes the driver and handle of the staging dir whose mount its
   publish mount is (`recover_from_staging`), so its driver still
   unpublishes it. A CSI PV volume found in a pod dir is named by its dir
   (the PV name, kubelet's outerVolumeSpecName problem #103143); when the
   pod is applied again under another volume name the reconciler hands the
   entry over (`OperationGenerator.adopt`) instead of unmounting the
   mount the pod uses.
4. **Orphans.** What cannot be reconstructed (an unknown plugin, a missing
   or unreadable ``vol_data.json``, a file where a directory belongs,
   empty leftovers) is listed, logged, and cleaned up once, when the
   desired state is complete and no desired pod wants it: mounts under it
   are unmounted (plain umount), its empty directories removed, every file
   kept and reported (`volfsm.engine.orphans`).
5. **What the log never created.** Every held pod-volume found on the node
   now or by an earlier start whose stream records no mount by volfsm is
   handed to the operation generator (`found_on_node`): its teardown keeps
   files (`VolumeRequest.keep_files`).

Fault points (`volfsm.faultpoints`): ``reconstruct.start`` before anything
is marked, ``reconstruct.mid`` after the first mark is appended (reached
only when there is something to mark).

Difference from the kubelet (reference §4): the kubelet forgets
everything, rebuilds every volume from directory names as Uncertain and
loses Mounted vs Uncertain, the full spec, in-flight operations, backoffs
and history. volfsm keeps its log: entries the log knows and the node
confirms stay Mounted with their full spec; only what the log cannot vouch
for (interrupted operations, mounts that vanished, entries the log does
not know) becomes Uncertain, each with its reason. Like the kubelet, the
kubelet-style directory scan is what finds volumes the log lost; unlike
it, the CSI staging dirs are scanned too, and orphan cleanup failures are
recorded instead of logged forever ("orphaned pod ... volume paths are
still present", #60987).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from events.log import EventLog
from events.streams import device_stream, podvol_stream
from events.tables import GLOBALLY_MOUNTED, MOUNTED, UNCERTAIN
from events.types import (
    Body,
    DesiredVolume,
    DeviceAttached,
    DeviceMountUncertain,
    Envelope,
    OperationFailed,
    OperationStarted,
    PodAdded,
    VolumeMounted,
    VolumeMountUncertain,
    VolumeSource,
)
from projections.asw import Asw, OperationRecord
from volfsm.desired.resolve import (
    csi_volume_id,
    empty_dir_volume_id,
    ephemeral_volume_handle,
    inline_csi_volume_id,
)
from volfsm.engine.handler import CommandHandler
from volfsm.engine.index import HOLDING, EngineIndex
from volfsm.engine.operations import (
    MAP_VOLUME,
    UNMAP_DEVICE,
    UNMAP_VOLUME,
    UNMOUNT_DEVICE,
    VOLUME_MOUNT,
    VOLUME_UNMOUNT,
    OperationGenerator,
)
from volfsm.engine.orphans import (
    ORPHAN_CLEANUP,
    ORPHAN_STREAM_PREFIX,
    DesiredPods,
    Orphan,
    OrphanCleaner,
)
from volfsm.errors import VolfsmError
from volfsm.faultpoints import hit
from volfsm.node import mounts
from volfsm.node.layout import (
    BLOCK_DATA,
    BLOCK_GLOBAL_MAP,
    BLOCK_PUBLISH,
    BLOCK_STAGING,
    CSI_PLUGIN,
    CSI_PUBLISH_MOUNT,
    EMPTY_DIR_PLUGIN,
    GLOBAL_MOUNT,
    PODS,
    VOL_DATA,
    VOLUME_DEVICES,
    VOLUMES,
    RootLayout,
    UnsafePathError,
    component_problem,
    escape_plugin_name,
    unescape_plugin_name,
    volume_handle_dir_name,
)
from volfsm.node.mounts import MountInfo
from volfsm.plugins.base import BLOCK, FILESYSTEM, PluginError
from volfsm.plugins.csi.client import valid_driver_name
from volfsm.plugins.emptydir import MEDIUM_MEMORY

log = logging.getLogger(__name__)

PodVolumeKey = tuple[str, str]
"""(pod uid, volume name)"""

EntryKey = tuple[str, str, str, str]
"""(pod uid, "volumes" or "volumeDevices", escaped plugin name, dir name): one pod volume dir."""

INTERRUPTED = "Interrupted"
"""OperationFailed code answering an operation the process died in."""
REASON_FOUND = "found on node, not in the log"

VOL_DATA_MAX_BYTES = 64 << 10
LIFECYCLE_EPHEMERAL = "Ephemeral"
_MEMORY_FS = "tmpfs"

_DONE_BY: dict[str, str] = {
    VOLUME_MOUNT: "VolumeMounted",
    MAP_VOLUME: "VolumeMounted",
    VOLUME_UNMOUNT: "VolumeUnmounted",
    UNMAP_VOLUME: "VolumeUnmounted",
    UNMOUNT_DEVICE: "DeviceUnmounted",
    UNMAP_DEVICE: "DeviceUnmounted",
}
"""The transition an operation fires as its last step: recorded after its start means done."""
_PODVOL_OPERATIONS = frozenset({VOLUME_MOUNT, MAP_VOLUME, VOLUME_UNMOUNT, UNMAP_VOLUME})
_DEVICE_OPERATIONS = frozenset({UNMOUNT_DEVICE, UNMAP_DEVICE})
_STAGED = (GLOBALLY_MOUNTED, UNCERTAIN)


# ------------------------------------------------------------------- report


@dataclass
class ReconstructionReport:
    """What reconstruction found and did."""

    interrupted: list[str] = field(default_factory=list)
    """Per operation the process died in: "<stream>: <operation> started at seq N"."""
    uncertain: list[str] = field(default_factory=list)
    """Per entry marked Uncertain: "<stream>: <reason>"."""
    reconstructed: int = 0
    """How many of those were found on the node and not in the log."""
    orphans: list[Orphan] = field(default_factory=list)
    duration_s: float = 0.0
    error: str = ""
    """Why reconstruction failed ("" if it did not); the service is then not ready."""

    def summary(self) -> str:
        """The /readyz line's counts: "N uncertain, M orphans"."""
        return f"{len(self.uncertain)} uncertain, {len(self.orphans)} orphans"

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (service status, `volfsm get`)."""
        return {
            "interrupted": list(self.interrupted),
            "uncertain": list(self.uncertain),
            "reconstructed": self.reconstructed,
            "orphans": [o.as_dict() for o in self.orphans],
            "duration_s": round(self.duration_s, 6),
            "error": self.error,
        }


# ---------------------------------------------------------------- node scan


@dataclass(frozen=True, slots=True)
class PodEntry:
    """One entry under pods/<uid>/volumes/<plugin>/ or pods/<uid>/volumeDevices/<plugin>/."""

    pod_uid: str
    sub: str
    escaped: str
    name: str
    path: Path
    is_dir: bool

    @property
    def key(self) -> EntryKey:
        """(uid, sub, escaped plugin, name)."""
        return (self.pod_uid, self.sub, self.escaped, self.name)


STAGING = "staging"
BLOCK_VOLUME = "block"


@dataclass(frozen=True, slots=True)
class GlobalEntry:
    """A CSI staging dir (<driver>/<sha256(handle)>) or block volume dir (volumeDevices/<spec>)."""

    kind: str
    path: Path
    name: str
    driver: str = ""

    @property
    def device_path(self) -> Path:
        """Where the device is staged (globalmount) or mapped (dev) inside it."""
        return self.path / (GLOBAL_MOUNT if self.kind == STAGING else BLOCK_GLOBAL_MAP)


@dataclass
class NodeScan:
    """What the node has: mounts, pod dirs and their volume entries, CSI global dirs."""

    infos: list[MountInfo] = field(default_factory=list)
    mounted: dict[str, MountInfo] = field(default_factory=dict)
    pod_uids: list[str] = field(default_factory=list)
    entries: list[PodEntry] = field(default_factory=list)
    globals: list[GlobalEntry] = field(default_factory=list)
    junk: list[tuple[Path, str, str]] = field(default_factory=list)
    """(path, pod uid or "", why) for things that are not even volume entries."""

    def mount_at(self, path: Path | str) -> MountInfo | None:
        """The topmost mount exactly at `path`."""
        return self.mounted.get(os.fspath(path))

    def mounts_under(self, path: Path | str) -> list[str]:
        """Mount points at or under `path`."""
        return [i.mount_point for i in mounts.mounts_under(path, self.infos)]


def _list_dir(layout: RootLayout, path: Path) -> list[tuple[str, bool]] | None:
    """(name, is a directory) per entry of `path`, following no symlink; None if missing."""
    try:
        with layout.open_dir(path) as fd, os.scandir(fd) as it:
            return sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
    except FileNotFoundError:
        return None


def scan_node(layout: RootLayout) -> NodeScan:
    """Read /proc/self/mountinfo and walk pods/ and plugins/kubernetes.io/csi (blocking)."""
    scan = NodeScan()
    scan.infos = mounts.read_mountinfo()
    for info in scan.infos:
        scan.mounted[info.mount_point] = info  # later lines are stacked on top
    _scan_pods(layout, scan)
    _scan_csi_globals(layout, scan)
    return scan


def _scan_pods(layout: RootLayout, scan: NodeScan) -> None:
    try:
        pods = _list_dir(layout, layout.pods_dir) or []
    except (UnsafePathError, OSError) as exc:
        log.error("cannot read %s: %s", layout.pods_dir, exc)
        return
    for uid, is_dir in pods:
        pod_dir = layout.pods_dir / uid
        problem = component_problem(uid)
        if not is_dir or problem is not None:
            scan.junk.append((pod_dir, "", "not a pod directory" if is_dir else "not a directory"))
            continue
        scan.pod_uids.append(uid)
        for sub in (VOLUMES, VOLUME_DEVICES):
            _scan_pod_sub(layout, scan, uid, pod_dir / sub, sub)


def _scan_pod_sub(layout: RootLayout, scan: NodeScan, uid: str, sub_dir: Path, sub: str) -> None:
    try:
        plugins = _list_dir(layout, sub_dir)
    except (UnsafePathError, OSError) as exc:
        scan.junk.append((sub_dir, uid, f"cannot be read as a directory: {exc}"))
        return
    for escaped, is_dir in plugins or []:
        plugin_dir = sub_dir / escaped
        if not is_dir:
            scan.junk.append((plugin_dir, uid, "a file or link where a plugin directory belongs"))
            continue
        try:
            names = _list_dir(layout, plugin_dir) or []
        except (UnsafePathError, OSError) as exc:
            scan.junk.append((plugin_dir, uid, f"cannot be read: {exc}"))
            continue
        if not names:
            scan.junk.append((plugin_dir, uid, "an empty plugin directory left over"))
        for name, entry_is_dir in names:
            scan.entries.append(
                PodEntry(uid, sub, escaped, name, plugin_dir / name, is_dir=entry_is_dir)
            )


def _scan_csi_globals(layout: RootLayout, scan: NodeScan) -> None:
    root = layout.plugin_dir(CSI_PLUGIN)
    try:
        drivers = _list_dir(layout, root) or []
    except (UnsafePathError, OSError) as exc:
        log.error("cannot read %s: %s", root, exc)
        return
    for driver, is_dir in drivers:
        where = root / driver
        if not is_dir:
            scan.junk.append((where, "", "a file or link where a CSI driver directory belongs"))
            continue
        try:
            names = _list_dir(layout, where) or []
        except (UnsafePathError, OSError) as exc:
            scan.junk.append((where, "", f"cannot be read: {exc}"))
            continue
        for name, entry_is_dir in names:
            path = where / name
            if driver == VOLUME_DEVICES:
                if name in (BLOCK_STAGING, BLOCK_PUBLISH):
                    continue  # the driver's staging/publish areas: named by the volume dirs
                if entry_is_dir:
                    scan.globals.append(GlobalEntry(BLOCK_VOLUME, path, name))
                else:
                    scan.junk.append((path, "", "a file or link where a block volume dir belongs"))
            elif entry_is_dir:
                scan.globals.append(GlobalEntry(STAGING, path, name, driver))
            else:
                scan.junk.append((path, "", "a file or link where a CSI staging dir belongs"))


# ------------------------------------------------------------ spec recovery


@dataclass(frozen=True)
class Recovered:
    """A volume rebuilt from the node: its spec and where its device would be staged."""

    spec: DesiredVolume
    device_path: Path | None = None
    note: str = ""
    """Where the spec came from, when not from the entry's own files."""


def read_vol_data(layout: RootLayout, path: Path) -> dict[str, str] | str:
    """The JSON object of strings in `path` (opened without following links), or why not."""
    try:
        with layout.open_dir(path.parent) as fd:
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            handle = os.open(path.name, flags, dir_fd=fd)
            with os.fdopen(handle, "rb") as fh:
                raw = fh.read(VOL_DATA_MAX_BYTES + 1)
    except FileNotFoundError:
        return f"{path} is missing"
    except (OSError, VolfsmError) as exc:
        return f"{path} cannot be read: {exc}"
    if len(raw) > VOL_DATA_MAX_BYTES:
        return f"{path} is larger than {VOL_DATA_MAX_BYTES} bytes"
    try:
        data = json.loads(raw)
    except ValueError as exc:
        return f"{path} is not valid JSON ({exc})"
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        return f"{path} is not a JSON object of strings"
    return data


def read_csi_vol_data(layout: RootLayout, path: Path) -> tuple[dict[str, str], str, str] | str:
    """A CSI vol_data.json with its (data, driver, handle), or why it names no CSI volume."""
    data = read_vol_data(layout, path)
    if isinstance(data, str):
        return data
    driver = data.get("driverName", "")
    handle = data.get("volumeHandle", "")
    if not valid_driver_name(driver):
        return f"{path}: driverName {driver!r} is not a CSI driver name"
    if not handle:
        return f"{path}: volumeHandle is missing"
    return data, driver, handle


def recover_pod_entry(layout: RootLayout, entry: PodEntry, scan: NodeScan) -> Recovered | str:
    """The spec of a pod volume dir the log does not know, from the node; or why it can't be."""
    plugin = unescape_plugin_name(entry.escaped)
    if plugin == EMPTY_DIR_PLUGIN:
        if entry.sub != VOLUMES or not entry.is_dir:
            return "an emptyDir entry that is not a directory under volumes/"
        mount = scan.mount_at(entry.path)
        medium = ""
        if mount is not None:
            if mount.fstype != _MEMORY_FS:
                return f"a {mount.fstype} mount where an emptyDir belongs"
            medium = MEDIUM_MEMORY
        source = VolumeSource(plugin=EMPTY_DIR_PLUGIN, medium=medium)
        vid = empty_dir_volume_id(entry.pod_uid, entry.name)
        return Recovered(DesiredVolume(name=entry.name, volume_id=vid, source=source))
    if plugin != CSI_PLUGIN:
        return f"unknown volume plugin {plugin!r}"
    block = entry.sub == VOLUME_DEVICES
    if not block and not entry.is_dir:
        return "a CSI entry under volumes/ that is not a directory"
    try:
        data_path = layout.csi_block_vol_data_path(entry.name) if block else entry.path / VOL_DATA
    except UnsafePathError as exc:
        return str(exc)
    found = read_csi_vol_data(layout, data_path)
    if isinstance(found, str):
        return (None if block else recover_from_staging(layout, entry, scan)) or found
    data, driver, handle = found
    spec_name = data.get("specVolID") or entry.name
    if spec_name != entry.name:
        return f"{data_path} names volume {spec_name!r}, but its directory is {entry.name!r}"
    source = VolumeSource(plugin=CSI_PLUGIN, driver=driver, volume_handle=handle)
    mode = BLOCK if block else FILESYSTEM
    if data.get("volumeLifecycleMode") == LIFECYCLE_EPHEMERAL:
        vid = inline_csi_volume_id(driver, entry.pod_uid, entry.name)
        return Recovered(DesiredVolume(name=entry.name, volume_id=vid, source=source))
    spec = DesiredVolume(
        name=entry.name,
        volume_id=csi_volume_id(driver, handle),
        source=source,
        volume_mode=mode,
        pv_name=spec_name,
    )
    try:
        device = (
            layout.csi_block_global_map_path(spec_name)
            if block
            else layout.csi_staging_path(driver, handle)
        )
    except UnsafePathError as exc:
        return str(exc)
    return Recovered(spec, device)


def recover_from_staging(layout: RootLayout, entry: PodEntry, scan: NodeScan) -> Recovered | None:
    """A CSI PV volume whose pod vol_data.json is unusable, from the staging dir it is
    published from: the one whose globalmount is the same mount as the entry's publish
    mount (same device and root), by that dir's own vol_data.json. None unless exactly one.

    So a mounted CSI volume that lost its pod json is still unpublished by its driver
    (NodeUnpublishVolume), not just unmounted.
    """
    publish = scan.mount_at(entry.path / CSI_PUBLISH_MOUNT)
    if publish is None:
        return None
    same = (publish.major, publish.minor, publish.root)
    matches: dict[tuple[str, str], Path] = {}
    for staging in scan.globals:
        staged = scan.mount_at(staging.device_path) if staging.kind == STAGING else None
        if staged is None or (staged.major, staged.minor, staged.root) != same:
            continue
        rec = recover_global(layout, staging)
        if isinstance(rec, Recovered):
            matches[(rec.spec.source.driver, rec.spec.source.volume_handle)] = staging.path
    if len(matches) != 1:
        return None
    [((driver, handle), where)] = matches.items()
    source = VolumeSource(plugin=CSI_PLUGIN, driver=driver, volume_handle=handle)
    spec = DesiredVolume(
        name=entry.name, volume_id=csi_volume_id(driver, handle), source=source,
        pv_name=entry.name,
    )  # fmt: skip
    note = f"driver and handle from {where / VOL_DATA}: its mount is the one published here"
    return Recovered(spec, where / GLOBAL_MOUNT, note)


def recover_global(layout: RootLayout, entry: GlobalEntry) -> Recovered | str:
    """The device spec of a CSI staging or block volume dir, from its vol_data.json."""
    data_path = (
        entry.path / VOL_DATA if entry.kind == STAGING else entry.path / BLOCK_DATA / VOL_DATA
    )
    found = read_csi_vol_data(layout, data_path)
    if isinstance(found, str):
        return found
    data, driver, handle = found
    source = VolumeSource(plugin=CSI_PLUGIN, driver=driver, volume_handle=handle)
    if entry.kind == STAGING:
        if driver != entry.driver or volume_handle_dir_name(handle) != entry.name:
            return f"{data_path} does not match its directory (driver {driver}, handle {handle})"
        # The staging json holds no PV name; the dir name stands in (it only has to be
        # non-empty: a filesystem unstage needs the driver, handle and staging path).
        spec = DesiredVolume(
            name=entry.name, volume_id=csi_volume_id(driver, handle), source=source,
            pv_name=entry.name,
        )  # fmt: skip
        return Recovered(spec, entry.device_path)
    spec_name = data.get("specVolID") or entry.name
    if spec_name != entry.name:
        return f"{data_path} names volume {spec_name!r}, but its directory is {entry.name!r}"
    spec = DesiredVolume(
        name=entry.name,
        volume_id=csi_volume_id(driver, handle),
        source=source,
        volume_mode=BLOCK,
        pv_name=entry.name,
    )
    return Recovered(spec, entry.device_path)


def spec_from_volume_id(volume_id: str, pod_uid: str, name: str) -> DesiredVolume | None:
    """A pod-volume's spec from its volume id alone (see `volfsm.desired.resolve`), or None.

    emptyDir: medium unknown (a tmpfs is found and unmounted by the plugin);
    CSI: driver and handle from the id, an inline volume when the id is the
    pod-scoped one, else a PV volume whose spec name is the entry's name.
    """
    empty_prefix = f"{EMPTY_DIR_PLUGIN}/"
    csi_prefix = f"{CSI_PLUGIN}/"
    if volume_id == empty_dir_volume_id(pod_uid, name):
        source = VolumeSource(plugin=EMPTY_DIR_PLUGIN)
        return DesiredVolume(name=name, volume_id=volume_id, source=source)
    if volume_id.startswith(empty_prefix) or not volume_id.startswith(csi_prefix):
        return None
    driver, sep, handle = volume_id[len(csi_prefix) :].partition("^")
    if not sep or not handle or not valid_driver_name(driver):
        return None
    if volume_id == inline_csi_volume_id(driver, pod_uid, name):
        handle = ephemeral_volume_handle(pod_uid, name)
        source = VolumeSource(plugin=CSI_PLUGIN, driver=driver, volume_handle=handle)
        return DesiredVolume(name=name, volume_id=volume_id, source=source)
    source = VolumeSource(plugin=CSI_PLUGIN, driver=driver, volume_handle=handle)
    return DesiredVolume(name=name, volume_id=volume_id, source=source, pv_name=name)


def device_spec_from_volume_id(
    layout: RootLayout, volume_id: str, device_mount_path: str
) -> DesiredVolume | None:
    """A CSI PV volume's device spec from its id and recorded mount path, or None."""
    prefix = f"{CSI_PLUGIN}/"
    if not volume_id.startswith(prefix):
        return None
    driver, sep, handle = volume_id[len(prefix) :].partition("^")
    if not sep or not handle or not valid_driver_name(driver):
        return None
    source = VolumeSource(plugin=CSI_PLUGIN, driver=driver, volume_handle=handle)
    try:
        parts = layout.relative_parts(device_mount_path) if device_mount_path else ()
    except UnsafePathError:
        parts = ()
    block_root = layout.relative_parts(layout.csi_block_root())
    if parts[: len(block_root)] == block_root and len(parts) > len(block_root):
        spec_name = parts[len(block_root)]
        return DesiredVolume(
            name=spec_name, volume_id=volume_id, source=source, volume_mode=BLOCK,
            pv_name=spec_name,
        )  # fmt: skip
    placeholder = volume_handle_dir_name(handle)  # non-empty: a PV volume (staged), not inline
    return DesiredVolume(name=placeholder, volume_id=volume_id, source=source, pv_name=placeholder)


def entry_of(layout: RootLayout, path: Path | str) -> EntryKey | None:
    """The pod volume entry a path lies in (pods/<uid>/<sub>/<plugin>/<name>/...), or None."""
    if not path:
        return None
    try:
        parts = layout.relative_parts(path)
    except UnsafePathError:
        return None
    if len(parts) >= 5 and parts[0] == PODS and parts[2] in (VOLUMES, VOLUME_DEVICES):
        return (parts[1], parts[2], parts[3], parts[4])
    return None


def default_entry(pod_uid: str, dv: DesiredVolume) -> EntryKey | None:
    """Where the kubelet keeps a pod's volume: CSI by spec name (PV name), others by name."""
    try:
        escaped = escape_plugin_name(dv.source.plugin)
    except UnsafePathError:
        return None
    sub = VOLUME_DEVICES if dv.volume_mode == BLOCK else VOLUMES
    name = (dv.pv_name or dv.name) if dv.source.plugin == CSI_PLUGIN else dv.name
    return (pod_uid, sub, escaped, name)


# -------------------------------------------------------------------- plan


class SpecRegistry(Protocol):
    """Where reconstructed specs go, and who cleans pod dirs (the reconciler)."""

    reconstructed: dict[PodVolumeKey, DesiredVolume]
    reconstructed_devices: dict[str, DesiredVolume]

    def queue_pod_cleanup(self, uid: str) -> None:
        """Remove the pod's dir once it holds nothing and is not desired."""

    def wake(self) -> None:
        """Run a pass now."""


@dataclass(frozen=True)
class _Fire:
    """A transition to fire on a device (pod_uid "") or pod-volume stream."""

    volume_id: str
    pod_uid: str
    name: str
    trigger: str
    body: Body


@dataclass(frozen=True)
class _Record:
    """Operation records to append."""

    stream: str
    body: Body


@dataclass
class _Plan:
    actions: list[_Fire | _Record] = field(default_factory=list)
    marked_devices: set[str] = field(default_factory=set)
    marked_podvols: set[PodVolumeKey] = field(default_factory=set)
    podvol_specs: dict[PodVolumeKey, DesiredVolume] = field(default_factory=dict)
    device_specs: dict[str, DesiredVolume] = field(default_factory=dict)
    report: ReconstructionReport = field(default_factory=ReconstructionReport)
    pod_uids: list[str] = field(default_factory=list)
    found_podvols: set[PodVolumeKey] = field(default_factory=set)
    found_devices: set[str] = field(default_factory=set)
    not_created: set[PodVolumeKey] = field(default_factory=set)
    """Held pod-volumes the log never recorded creating: their teardown keeps files."""


class Reconstructor:
    """Runs reconstruction once at start, and the one-shot orphan cleanup afterwards."""

    def __init__(
        self,
        *,
        log: EventLog,
        handler: CommandHandler,
        asw: Asw,
        dsw: DesiredPods,
        index: EngineIndex,
        ops: OperationGenerator,
        layout: RootLayout,
        registry: SpecRegistry,
    ) -> None:
        self.log = log
        self.handler = handler
        self.asw = asw
        self.dsw = dsw
        self.index = index
        self.ops = ops
        self.layout = layout
        self.registry = registry
        self.report: ReconstructionReport | None = None
        self.on_found: Callable[[int], None] | None = None
        """Called with how many found entries the log has no event of (`_unknown_to_log`),
        before they are recorded (then the log has: the next start would not count them)."""
        self.cleaner = OrphanCleaner(
            handler=handler, dsw=dsw, ops=ops, layout=layout, registry=registry,
            entries_of=self.entries_of,
        )  # fmt: skip

    # ------------------------------------------------------------------ run

    async def run(self) -> ReconstructionReport:
        """Reconstruct (see the module doc); the report. Call once, before reconciling."""
        started = time.monotonic()
        hit("reconstruct.start")
        try:
            plan = await asyncio.to_thread(self._plan)
            unknown = await asyncio.to_thread(self._unknown_to_log, plan)
            if unknown and self.on_found is not None:
                self.on_found(unknown)  # before the marks reach the log
            await self._apply(plan)
            self._register(plan)
            report = plan.report
        except (VolfsmError, OSError, ValueError) as exc:
            # A node or log the code did not expect: say so (readiness stays off), and
            # reconcile on the log's state alone rather than not at all.
            log.exception("reconstruction failed")
            report = ReconstructionReport(error=f"{type(exc).__name__}: {exc}")
            await self._keep_files_of_earlier_finds()
        report.duration_s = time.monotonic() - started
        self.report = report
        self._log_report(report)
        return report

    async def _keep_files_of_earlier_finds(self) -> None:
        """After a failed reconstruction: what an earlier start found still keeps its files."""
        fallback = _Plan()
        try:
            await asyncio.to_thread(self._plan_not_created, fallback)
        except (VolfsmError, OSError, ValueError):
            log.exception("cannot tell which volumes the log never created")
        self.ops.found_on_node.update(fallback.not_created)

    def _unknown_to_log(self, plan: _Plan) -> int:
        """How many found entries the log has no event of at all (not even a start): the log
        was lost or is behind, or another tool wrote there. An entry a crash left (its stream
        has events) is not counted: an intact log knows it."""
        streams = [podvol_stream(uid, name) for uid, name in plan.found_podvols]
        streams += [device_stream(vid) for vid in plan.found_devices]
        return sum(not self.log.has_stream(stream) for stream in streams)

    def _log_report(self, report: ReconstructionReport) -> None:
        for line in report.interrupted:
            log.warning("reconstruction: interrupted operation %s", line)
        for line in report.uncertain:
            log.warning("reconstruction: Uncertain %s", line)
        for orphan in report.orphans:
            log.warning(
                "reconstruction: orphan %s: %s (cleaned up once the desired state is complete"
                " and no pod wants it)",
                orphan.path,
                orphan.why,
            )
        log.info(
            "reconstruction done in %.3fs: %s (%d found on the node, %d interrupted)",
            report.duration_s,
            report.summary(),
            report.reconstructed,
            len(report.interrupted),
        )

    # ------------------------------------------------------------- planning

    def _plan(self) -> _Plan:
        """Decide every mark (in a worker thread: nothing else writes while this runs)."""
        plan = _Plan()
        self._plan_interrupted(plan)
        scan = scan_node(self.layout)
        plan.pod_uids = list(scan.pod_uids)
        self._plan_beliefs(plan, scan)
        self._plan_pod_entries(plan, scan)
        self._plan_globals(plan, scan)
        self._plan_junk(plan, scan)
        self._plan_specless(plan)
        self._plan_not_created(plan)
        return plan

    def spec_of(self, uid: str, name: str) -> DesiredVolume | None:
        """The spec of a pod-volume: from the log (index), else as reconstructed."""
        return self.index.spec_of(uid, name) or self.registry.reconstructed.get((uid, name))

    def device_spec(self, volume_id: str) -> DesiredVolume | None:
        """A spec of a volume: from the log (index), else as reconstructed."""
        return self.index.volume_spec(volume_id) or self.registry.reconstructed_devices.get(
            volume_id
        )

    def _mark_podvol(
        self, plan: _Plan, uid: str, name: str, volume_id: str, reason: str, *, found: bool
    ) -> None:
        # Every mark made here is flagged reconstructed, whether the node showed the entry
        # (`found`) or the log knew it: as with the kubelet's reconstructed volumes, a final
        # error on the retry then leaves it Uncertain. An interrupted NodePublish may have
        # mounted; calling that Unmounted would leave the mount behind for good.
        body = VolumeMountUncertain(
            volume_id=volume_id, pod_uid=uid, volume_name=name, reason=reason, reconstructed=True
        )
        plan.actions.append(_Fire(volume_id, uid, name, "mark_uncertain", body))
        plan.marked_podvols.add((uid, name))
        plan.report.uncertain.append(f"{podvol_stream(uid, name)}: {reason}")
        plan.report.reconstructed += found
        if found:
            plan.found_podvols.add((uid, name))

    def _mark_device(
        self, plan: _Plan, volume_id: str, reason: str, path: str, *, found: bool
    ) -> None:
        body = DeviceMountUncertain(  # reconstructed=True: see _mark_podvol
            volume_id=volume_id, reason=reason, reconstructed=True, device_mount_path=path
        )
        plan.actions.append(_Fire(volume_id, "", "", "mark_device_uncertain", body))
        plan.marked_devices.add(volume_id)
        plan.report.uncertain.append(f"{device_stream(volume_id)}: {reason}")
        plan.report.reconstructed += found
        if found:
            plan.found_devices.add(volume_id)

    # 1. interrupted operations

    def _plan_interrupted(self, plan: _Plan) -> None:
        for vid, dev in list(self.asw.devices.items()):
            op = dev.last_operation
            if op is not None and op.status == "running":
                self._interrupted(plan, device_stream(vid), op, vid, None)
        for key, pv in list(self.asw.podvols.items()):
            op = pv.last_operation
            if op is not None and op.status == "running":
                self._interrupted(plan, podvol_stream(*key), op, pv.volume_id, key)

    def _interrupted(
        self,
        plan: _Plan,
        stream: str,
        op: OperationRecord,
        volume_id: str,
        podvol: PodVolumeKey | None,
    ) -> None:
        envs = self.log.read_stream(stream)
        start: Envelope | None = None
        after: list[Envelope] = []
        for env in envs:
            if isinstance(env.body, OperationStarted) and env.body.op_id == op.op_id:
                start, after = env, []
            elif start is not None:
                after.append(env)
        seq = start.seq if start is not None else 0
        if start is not None and isinstance(start.body, OperationStarted):
            volume_id = volume_id or start.body.volume_id
        what = f"{op.operation} started at seq {seq}"
        done_type = _DONE_BY.get(op.operation)
        done = next((e for e in after if done_type is not None and e.type == done_type), None)
        if done is not None:
            message = (
                f"volfsm stopped before recording the outcome of {what}; its {done.type}"
                f" (seq {done.seq}) was recorded and stands"
            )
        else:
            reason = f"interrupted: {what} has no outcome"
            marked = False
            if podvol is not None and op.operation in _PODVOL_OPERATIONS:
                self._mark_podvol(plan, *podvol, volume_id, reason, found=False)
                marked = True
            elif podvol is None and op.operation in _DEVICE_OPERATIONS:
                dev = self.asw.devices.get(volume_id)
                if dev is not None and dev.state in _STAGED:
                    self._mark_device(plan, volume_id, reason, dev.device_mount_path, found=False)
                    marked = True
            message = f"volfsm stopped while {what} was running; " + (
                "the entry it acts on is now Uncertain"
                if marked
                else "it changes no mount state, so nothing is marked"
            )
        body = OperationFailed(
            op_id=op.op_id,
            operation=op.operation,
            code=INTERRUPTED,
            message=message,
            final=False,
            backoff_s=0.0,
            duration_s=0.0,
        )
        plan.actions.append(_Record(stream, body))
        plan.report.interrupted.append(f"{stream}: {what}")

    # 2. the log's beliefs against the node

    def _seen_mounted_at(self, stream: str, type_name: str) -> int | None:
        """The seq of the stream's last `type_name` event if it saw a mount after the call.

        None when there is no such event, or its `mount_found` was not True
        (nothing was seen, or nothing looked): a mount that was never seen
        cannot be missed.
        """
        for env in reversed(self.log.read_stream(stream)):
            if env.type == type_name:
                return env.seq if getattr(env.body, "mount_found", None) is True else None
        return None

    def _plan_beliefs(self, plan: _Plan, scan: NodeScan) -> None:
        for vid, dev in list(self.asw.devices.items()):
            if dev.state != GLOBALLY_MOUNTED or vid in plan.marked_devices:
                continue
            reason = self._staging_missing(vid, dev.device_mount_path, scan)
            if reason:
                self._mark_device(plan, vid, reason, dev.device_mount_path, found=False)
        for (uid, name), pv in list(self.asw.podvols.items()):
            if pv.state != MOUNTED or (uid, name) in plan.marked_podvols or not pv.mount_path:
                continue
            reason = self._mount_missing(uid, name, pv.volume_id, pv.mount_path, scan)
            if reason:
                self._mark_podvol(plan, uid, name, pv.volume_id, reason, found=False)

    def _staging_missing(self, volume_id: str, path: str, scan: NodeScan) -> str:
        """Why the device the log says is staged is not, or "" (nothing to say)."""
        if not path or scan.mount_at(path) is not None or not _inside(self.layout, path):
            return ""
        spec = self.device_spec(volume_id)
        parts = self.layout.relative_parts(path)
        if (spec is not None and spec.volume_mode == BLOCK) or VOLUME_DEVICES in parts:
            return ""  # a block global map dir is no mount (its pods' files are)
        seen = self._seen_mounted_at(device_stream(volume_id), "DeviceMounted")
        if seen is None:
            return ""  # no staging mount was ever seen there: nothing to miss
        return (
            f"the log says staged at {path} (mounted there at seq {seen}), but"
            " /proc/self/mountinfo has no mount there"
        )

    def _mount_missing(
        self, uid: str, name: str, volume_id: str, path_text: str, scan: NodeScan
    ) -> str:
        """Why the pod-volume the log says is Mounted is not, or ""."""
        path = Path(path_text)
        if not _inside(self.layout, path):
            return ""  # recorded under another root dir: not this node's to judge
        spec = self.spec_of(uid, name)
        entry = entry_of(self.layout, path)
        block = (
            spec.volume_mode == BLOCK
            if spec is not None
            else entry is not None and entry[1] == VOLUME_DEVICES
        )
        if not os.path.lexists(path):
            return f"the log says Mounted at {path}, but it does not exist on the node"
        if block:
            dev = self.asw.devices.get(volume_id)
            if dev is None or not dev.device_mount_path:
                return ""
            bind = Path(dev.device_mount_path) / uid
            if scan.mount_at(bind) is None:
                return (
                    f"the log says the block device is mapped for the pod, but {bind} has no"
                    " device bind-mounted on it"
                )
            return self._publish_missing(uid, name, dev.device_mount_path, scan)
        if scan.mount_at(path) is not None:
            return ""
        if spec is not None and spec.source.plugin == EMPTY_DIR_PLUGIN:
            if spec.source.medium != MEDIUM_MEMORY:
                return ""  # a plain emptyDir is a directory, not a mount
            return (
                f"the log says Mounted (emptyDir tmpfs) at {path}, but /proc/self/mountinfo"
                " has no mount there"
            )
        seen = self._seen_mounted_at(podvol_stream(uid, name), "VolumeMounted")
        if seen is None:
            return ""
        return (
            f"the log says Mounted at {path} (mounted there at seq {seen}), but"
            " /proc/self/mountinfo has no mount there"
        )

    def _publish_missing(self, uid: str, name: str, global_map: str, scan: NodeScan) -> str:
        """Why a CSI block volume's NodePublish bind the log saw is gone, or "".

        Like the filesystem check, only a mount the log saw after the publish
        (`VolumeMounted.mount_found`) can be missed: a driver that publishes a
        device node without a mount has nothing to lose here.
        """
        spec_name = Path(global_map).parent.name
        try:
            if self.layout.csi_block_global_map_path(spec_name) != Path(global_map):
                return ""  # not the kubelet's CSI block layout: no publish path to check
            publish = self.layout.csi_block_publish_path(spec_name, uid)
        except UnsafePathError:
            return ""
        if scan.mount_at(publish) is not None:
            return ""
        seen = self._seen_mounted_at(podvol_stream(uid, name), "VolumeMounted")
        if seen is None:
            return ""
        return (
            f"the log says the block device is published for the pod at {publish} (bound"
            f" there at seq {seen}), but /proc/self/mountinfo has no mount there"
        )

    # 3. what the node has and the log does not

    def entries_of(self, uid: str, dv: DesiredVolume) -> set[EntryKey]:
        """The pod volume dirs a spec can live in (the plugin's path, and the kubelet's)."""
        keys: set[EntryKey] = set()
        default = default_entry(uid, dv)
        if default is not None:
            keys.add(default)
        paths = self.ops.request_paths(dv, uid)
        if paths is not None and paths[1] is not None:
            found = entry_of(self.layout, paths[1])
            if found is not None:
                keys.add(found)
        return keys

    def _held_entries(self, plan: _Plan) -> dict[EntryKey, PodVolumeKey]:
        """The pod volume dirs of the entries the log holds (Mounted or Uncertain).

        The recorded mount path names the dir; only entries without one
        (Uncertain before any mount) need their plugin asked.
        """
        known: dict[EntryKey, PodVolumeKey] = {}
        for key, pv in self.asw.podvols.items():
            if pv.state not in HOLDING and key not in plan.marked_podvols:
                continue
            found = entry_of(self.layout, pv.mount_path)
            if found is not None:
                known[found] = key
                continue
            spec = self.spec_of(*key)
            if spec is not None:
                for entry in self.entries_of(key[0], spec):
                    known.setdefault(entry, key)
        return known

    def _spec_from_pod(self, entry: PodEntry) -> DesiredVolume | None:
        pod = self.index.pod_spec(entry.pod_uid)
        for dv in pod.volumes if pod is not None else ():
            if entry.key in self.entries_of(entry.pod_uid, dv):
                return dv
        return None

    def _plan_pod_entries(self, plan: _Plan, scan: NodeScan) -> None:
        if not scan.entries:
            return  # no pod volume dir on the node: nothing to match against the log
        held = self._held_entries(plan)
        for entry in scan.entries:
            key = held.get(entry.key)
            if key is not None:
                if self.spec_of(*key) is None and key not in plan.podvol_specs:
                    rec = recover_pod_entry(self.layout, entry, scan)
                    if isinstance(rec, Recovered):
                        plan.podvol_specs[key] = msgspec.structs.replace(rec.spec, name=key[1])
                continue
            self._plan_found_entry(plan, entry, scan)

    def _plan_found_entry(self, plan: _Plan, entry: PodEntry, scan: NodeScan) -> None:
        uid = entry.pod_uid
        spec = self._spec_from_pod(entry)
        device: Path | None = None
        if spec is None:
            rec = recover_pod_entry(self.layout, entry, scan)
            if isinstance(rec, str):
                self._orphan(plan, entry.path, rec, uid, entry.key, entry.name)
                return
            spec, device, note = rec.spec, rec.device_path, rec.note
        else:
            paths = self.ops.request_paths(spec, "")
            device, note = paths[0] if paths is not None else None, ""
        key = (uid, spec.name)
        pv = self.asw.podvols.get(key)
        if key in plan.marked_podvols or (pv is not None and pv.state in HOLDING):
            if self.spec_of(*key) is None:
                plan.podvol_specs.setdefault(key, spec)
            return
        mounted = scan.mounts_under(entry.path)
        reason = f"{REASON_FOUND}: {entry.path}"
        if mounted:
            reason += f" (mounted: {', '.join(mounted)})"
        if note:
            reason += f" ({note})"
        if self._staged_kind(spec):
            self._plan_device(plan, spec, device, reason)
        self._mark_podvol(plan, uid, spec.name, spec.volume_id, reason, found=True)
        plan.podvol_specs[key] = spec

    def _staged_kind(self, spec: DesiredVolume) -> bool:
        """Whether the volume is staged once per node: a CSI PV volume of a device-mountable
        plugin (assumed when its driver is not registered yet, as CSI always is)."""
        if spec.source.plugin != CSI_PLUGIN or not spec.pv_name:
            return False
        plugin = self.ops.find_plugin(spec.source)
        return isinstance(plugin, PluginError) or plugin.is_device_mountable(spec.source)

    def _plan_device(
        self, plan: _Plan, spec: DesiredVolume, path: Path | None, reason: str
    ) -> None:
        """A staged CSI volume the log does not hold as staged: Attached, then Uncertain."""
        vid = spec.volume_id
        dev = self.asw.devices.get(vid)
        if vid in plan.marked_devices or (dev is not None and dev.state in _STAGED):
            if self.device_spec(vid) is None:
                plan.device_specs.setdefault(vid, spec)
            return
        if dev is None:
            body = DeviceAttached(
                volume_id=vid, plugin=f"{CSI_PLUGIN}:{spec.source.driver}", attachable=False
            )
            plan.actions.append(_Fire(vid, "", "", "attach", body))
        self._mark_device(plan, vid, reason, os.fspath(path) if path else "", found=True)
        plan.device_specs.setdefault(vid, spec)

    def _plan_globals(self, plan: _Plan, scan: NodeScan) -> None:
        staged: dict[str, str] = {}
        for vid, dev in self.asw.devices.items():
            if dev.state in _STAGED and dev.device_mount_path:
                staged[dev.device_mount_path] = vid
        for entry in scan.globals:
            inner = os.fspath(entry.device_path)
            prefix = os.fspath(entry.path) + "/"
            known = staged.get(inner) or next(
                (v for p, v in staged.items() if p.startswith(prefix)), None
            )
            rec = recover_global(self.layout, entry)
            if known is not None:
                if isinstance(rec, Recovered) and self.device_spec(known) is None:
                    plan.device_specs.setdefault(known, rec.spec)
                continue
            if isinstance(rec, str):
                self._orphan(plan, entry.path, rec, "", None, entry.name)
                continue
            mounted = scan.mounts_under(entry.path)
            reason = f"{REASON_FOUND}: {entry.path}"
            if mounted:
                reason += f" (mounted: {', '.join(mounted)})"
            self._plan_device(plan, rec.spec, rec.device_path, reason)

    def _plan_junk(self, plan: _Plan, scan: NodeScan) -> None:
        for path, uid, why in scan.junk:
            self._orphan(plan, path, why, uid, None, path.name)

    def _orphan(
        self,
        plan: _Plan,
        path: Path,
        why: str,
        uid: str,
        entry: EntryKey | None,
        name: str,
    ) -> None:
        if uid and component_problem(name) is None:
            stream = podvol_stream(uid, name)
        else:
            try:
                where = "/".join(self.layout.relative_parts(path))
            except UnsafePathError:
                where = os.fspath(path)
            stream = device_stream(ORPHAN_STREAM_PREFIX + where)
        plan.report.orphans.append(Orphan(os.fspath(path), why, stream, uid, entry))

    # 4. entries the log holds without a spec (an earlier reconstruction's)

    def _plan_specless(self, plan: _Plan) -> None:
        """Give a spec, from its volume id, to every held entry that has none.

        Only entries an earlier reconstruction made lack a spec in the log;
        the scan above rebuilds theirs from the node when anything is left
        there. When nothing is (its dir went, e.g. a teardown finished but
        the process died before recording it), the volume id still names
        the plugin, driver and handle: enough for the plugin's idempotent
        teardown once no pod wants it.
        """
        for key, pv in list(self.asw.podvols.items()):
            if pv.state not in HOLDING or key in plan.podvol_specs:
                continue
            if self.spec_of(*key) is None:
                spec = spec_from_volume_id(pv.volume_id, *key)
                if spec is None:
                    log.warning("pod-volume %s/%s: no spec can be rebuilt for %r", *key,
                                pv.volume_id)  # fmt: skip
                else:
                    plan.podvol_specs[key] = spec
        for vid, dev in list(self.asw.devices.items()):
            if dev.state not in _STAGED or vid in plan.device_specs:
                continue
            if self.device_spec(vid) is None:
                spec = device_spec_from_volume_id(self.layout, vid, dev.device_mount_path)
                if spec is None:
                    log.warning("volume %s: no spec can be rebuilt; it cannot be unstaged", vid)
                else:
                    plan.device_specs[vid] = spec

    # 5. what the log never recorded creating

    def _plan_not_created(self, plan: _Plan) -> None:
        """Find the held pod-volumes whose stream has no mount by volfsm.

        Candidates: the ones found on the node now, and the ones an earlier
        start found (reconstructed, still held). A mount attempt on the
        stream (a desired pod's volume since) or a VolumeMounted makes the
        volume volfsm's; entries it saw Mounted are not even looked at.
        """
        keys = set(plan.found_podvols)
        keys.update(
            k for k, pv in self.asw.podvols.items() if pv.state in HOLDING and pv.reconstructed
        )
        for key in keys:
            if not any(_mounts(env.body) for env in self.log.read_stream(podvol_stream(*key))):
                plan.not_created.add(key)

    # ------------------------------------------------------------- applying

    async def _apply(self, plan: _Plan) -> None:
        first = True
        for action in plan.actions:
            try:
                if isinstance(action, _Record):
                    await self.handler.record_async(action.stream, [action.body])
                elif action.pod_uid:
                    await self.ops.fire_podvol(
                        action.pod_uid, action.name, action.trigger, action.body
                    )
                else:
                    await self.ops.fire_device(action.volume_id, action.trigger, action.body)
            except VolfsmError as exc:  # an illegal transition: the plan is wrong, not fatal
                log.error("reconstruction could not record %s: %s", action, exc)
                continue
            if first:
                first = False
                hit("reconstruct.mid")

    def _register(self, plan: _Plan) -> None:
        """Hand the reconstructed specs to the reconciler; queue pod dirs for cleanup."""
        registry = self.registry
        for key, spec in plan.podvol_specs.items():
            registry.reconstructed[key] = spec
            self._add_to_pod(key[0], spec)
        for vid, spec in plan.device_specs.items():
            registry.reconstructed_devices.setdefault(vid, spec)
        self.ops.found_on_node.update(plan.not_created)
        for orphan in plan.report.orphans:
            if orphan.pod_uid:
                self._add_to_pod(orphan.pod_uid, None)
        for uid in plan.pod_uids:
            if uid not in self.dsw.pods:
                registry.queue_pod_cleanup(uid)

    def _add_to_pod(self, uid: str, spec: DesiredVolume | None) -> None:
        """Make a pod the log does not know visible (status, pod dir cleanup) with its volumes."""
        if uid in self.dsw.pods:
            return
        pod = self.index.removed_pods.get(uid)
        if pod is None:
            pod = PodAdded(pod_uid=uid, namespace="", name="")
        if spec is not None and all(dv.name != spec.name for dv in pod.volumes):
            pod = PodAdded(
                pod_uid=uid,
                namespace=pod.namespace,
                name=pod.name,
                volumes=(*pod.volumes, spec),
            )
        self.index.removed_pods[uid] = pod

    # ------------------------------------------------------------- orphans

    @property
    def orphans(self) -> list[Orphan]:
        """What could not be reconstructed (empty before `run`)."""
        return self.report.orphans if self.report is not None else []

    def start_orphan_cleanup(self) -> None:
        """The reconciler's one-shot hook, on its first pass after the desired state is complete."""
        self.cleaner.start(self.orphans)

    async def wait(self) -> None:
        """Wait for a running orphan cleanup (stop, tests)."""
        await self.cleaner.wait()


def _mounts(body: Body) -> bool:
    """Whether a pod-volume event records volfsm mounting it (or starting to)."""
    if isinstance(body, OperationStarted):
        return body.operation in (VOLUME_MOUNT, MAP_VOLUME)
    return isinstance(body, VolumeMounted)


def _inside(layout: RootLayout, path: Path | str) -> bool:
    try:
        return bool(layout.relative_parts(path))
    except UnsafePathError:
        return False


__all__ = [
    "INTERRUPTED",
    "ORPHAN_CLEANUP",
    "REASON_FOUND",
    "GlobalEntry",
    "NodeScan",
    "Orphan",
    "PodEntry",
    "ReconstructionReport",
    "Reconstructor",
    "Recovered",
    "default_entry",
    "entry_of",
    "read_csi_vol_data",
    "read_vol_data",
    "recover_global",
    "recover_pod_entry",
    "scan_node",
]

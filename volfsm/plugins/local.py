"""The local volume plugin (kubelet's ``pkg/volume/local``): a PV's directory on this node.

A ``local`` PersistentVolume names a path on one node and must say which
node with ``spec.nodeAffinity``. This plugin checks the affinity against
this node's labels (``kubernetes.io/hostname`` = the node name) when the PV
is resolved, so a PV pinned to another node is refused at apply with the
reason (the kubelet checks it at MountVolume: "MountVolume.NodeAffinity
check failed"). The path must be a directory (``GetFileType``); SetUp bind
mounts it onto ``pods/<uid>/volumes/kubernetes.io~local-volume/<pv>``
(created 0750; ``ro`` for a read-only volume, plus the PV's mount options),
TearDown unmounts that bind and removes the empty pod dir. The local path
and its data are never deleted. The pod's fsGroup is applied at the pod's
mount (its change policy honoured) unless the volume is read-only or
another pod mounts it, as the kubelet does.

A local PV on a block device (volumeMode Filesystem) is mounted once at
``plugins/kubernetes.io/local-volume/mounts/<pv>`` (0750; formatted with the
PV's ``fsType``, default ext4, only when blkid finds no signature at all,
as the kubelet's FormatAndMount), bind mounted for each pod, and unmounted
when the last pod's bind goes.

volumeMode Block (the kubelet's local BlockVolumeMapper): the path must be
a block device, handed over as it is (never formatted, opened or written).
MapPodDevice only checks it and names it; the engine's block mapper
(`volfsm.node.blockmap`) binds it on the global map file
``plugins/kubernetes.io~local-volume/volumeDevices/<pv>/<pod uid>`` and
links ``pods/<uid>/volumeDevices/kubernetes.io~local-volume/<pv>`` to it,
and undoes both at unmap. Teardown touches nothing else: the device and
its data stay.

Reconstruction (after a lost log): a pod's bind mount dir is rebuilt as a
local PV named by its dir (on the device mounted at its global mount, if
that is where the bind comes from), a pod's device link as a Block local
PV on the device it links to, and a global map dir as that PV's device.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

from events.types import DesiredVolume, VolumeSource
from volfsm.desired.resolve import PLUGIN_LOCAL
from volfsm.node import mounts, ownership
from volfsm.node.layout import (
    VOLUME_DEVICES,
    RootLayout,
    UnsafePathError,
    escape_plugin_name,
    safe_component,
)
from volfsm.plugins.base import (
    BLOCK,
    ConstructedSpec,
    ErrorClass,
    GlobalDir,
    GlobalScan,
    MountResult,
    NodeView,
    PluginError,
    PodVolumeDir,
    VolumePlugin,
    VolumeRequest,
    list_dir,
)

ESCAPED_NAME = escape_plugin_name(PLUGIN_LOCAL)
DEFAULT_FS_TYPE = "ext4"
HOSTNAME_LABEL = "kubernetes.io/hostname"
AFFINITY_KEY = "nodeAffinity"
POD_DIR_MODE = 0o750


def _run(command: list[str], what: str) -> str:
    """Run a tool; its stdout. FINAL PluginError with its stderr if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise PluginError("ToolFailed", f"{what}: {done.stderr.strip()}", ErrorClass.FINAL)
    return done.stdout


def _signature(device: str) -> str:
    """What blkid finds on `device` (a filesystem type, or another signature's kind); ""
    if nothing at all (blkid exits 2)."""
    done = subprocess.run(
        ["blkid", "-p", "-o", "export", device], capture_output=True, text=True, timeout=60
    )
    if done.returncode == 2:
        return ""
    if done.returncode != 0:
        raise PluginError("ToolFailed", f"blkid {device}: {done.stderr.strip()}", ErrorClass.FINAL)
    fields = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return fields.get("TYPE") or fields.get("PTTYPE") or "an unknown signature"


def node_affinity_problem(affinity_json: str, labels: dict[str, str]) -> str | None:
    """Why a PV's nodeAffinity (``{"required": {"nodeSelectorTerms": [...]}}``) does not
    match `labels`, or None. Terms are ORed, a term's expressions ANDed (the API's rule)."""
    affinity = json.loads(affinity_json) if affinity_json else {}
    terms = (affinity.get("required") or {}).get("nodeSelectorTerms") or []
    if not terms:
        return "a local PersistentVolume needs spec.nodeAffinity.required.nodeSelectorTerms"
    for term in terms:
        if all(_matches(expr, labels) for expr in term.get("matchExpressions") or []):
            return None
    shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return f"nodeAffinity does not match this node ({shown})"


def _matches(expr: dict[str, object], labels: dict[str, str]) -> bool:
    key, op = str(expr.get("key", "")), str(expr.get("operator", ""))
    values = [str(v) for v in expr.get("values") or []]  # type: ignore[attr-defined]
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and values:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def global_map_path(layout: RootLayout, pv_name: str) -> Path:
    """plugins/kubernetes.io~local-volume/volumeDevices/<pv>: a Block local PV's global map
    dir (the kubelet's GetGlobalMapPath, under the escaped plugin name as the kubelet has it)."""
    return layout.plugins_dir / ESCAPED_NAME / VOLUME_DEVICES / safe_component(pv_name, "PV name")


def block_device_of(req: VolumeRequest) -> MountResult:
    """MapPodDevice of a Block local PV: its path, which must be a block device. Nothing is
    opened, formatted or written. FINAL PluginError with the reason otherwise."""
    path = req.source.path
    try:
        kind = stat.S_IFMT(os.stat(path).st_mode)
    except OSError as exc:
        code = errno.errorcode.get(exc.errno or 0, "OSError")
        raise PluginError(code, f"local path {path}: {exc.strerror}", ErrorClass.FINAL) from None
    if kind != stat.S_IFBLK:
        what = "a directory" if kind == stat.S_IFDIR else "not a block device"
        raise PluginError(
            "NotBlockDevice",
            f"local PV {req.spec_name}: {path} is {what}: volumeMode Block needs a block device",
            ErrorClass.FINAL,
        )
    return MountResult(path=path, device_path=path, detail=f"local block device {path}")


def _read_link(layout: RootLayout, path: Path) -> str:
    """Where the symlink `path` points (not followed); "" if it is none."""
    try:
        with layout.open_dir(path.parent) as fd:
            return os.readlink(path.name, dir_fd=fd)
    except (OSError, UnsafePathError):
        return ""


def _dev(info: mounts.MountInfo) -> tuple[int, int]:
    return (info.major, info.minor)


def local_spec(pv_name: str, path: str = "", volume_mode: str = "Filesystem") -> DesiredVolume:
    """A reconstructed local PV's spec: named by its PV, enough for its teardown."""
    source = VolumeSource(plugin=PLUGIN_LOCAL, path=path)
    return DesiredVolume(
        name=pv_name,
        volume_id=f"{PLUGIN_LOCAL}/{pv_name}",
        source=source,
        volume_mode=volume_mode,
        pv_name=pv_name,
    )


class LocalVolumePlugin(VolumePlugin):
    """kubernetes.io/local-volume: a local PV's directory, bind mounted for each pod."""

    name = PLUGIN_LOCAL

    def __init__(self, layout: RootLayout, node_labels: dict[str, str]) -> None:
        self.layout = layout
        self.node_labels = dict(node_labels)

    def supports(self, source: VolumeSource) -> bool:
        """Whether `source` is a local PV."""
        return source.plugin == self.name

    def supports_block(self, source: VolumeSource) -> bool:
        """Always: a Block local PV's path is a block device (checked at MapPodDevice)."""
        return True

    def mounts_one_pod_at_a_time(self, source: VolumeSource) -> bool:
        """Always: pods of one local PV share its global mount (a filesystem on a device) or
        its global map dir (Block); the kubelet's local plugin is device-mountable, so the
        kubelet runs one mount of a local volume at a time too."""
        return True

    def can_serve(self, source: VolumeSource, volume_mode: str) -> str | None:
        """On this node only (the PV's nodeAffinity matches its labels)."""
        problem = super().can_serve(source, volume_mode)
        if problem is not None:
            return problem
        return node_affinity_problem(source.attributes.get(AFFINITY_KEY, ""), self.node_labels)

    def volume_dir_name(self, spec: object) -> str:
        """The PV name, as the kubelet names a local volume's pod dir."""
        return str(getattr(spec, "pv_name", "") or getattr(spec, "name", ""))

    def spec_from_volume_id(self, volume_id: str, pod_uid: str, name: str) -> DesiredVolume | None:
        """A local volume's spec from its id (``kubernetes.io/local-volume/<pv>``): enough for
        its teardown, which unmounts the pod's bind by the PV's name."""
        prefix = f"{PLUGIN_LOCAL}/"
        if not volume_id.startswith(prefix):
            return None
        source = VolumeSource(plugin=PLUGIN_LOCAL)
        pv_name = volume_id[len(prefix) :]
        return DesiredVolume(name=name, volume_id=volume_id, source=source, pv_name=pv_name)

    def construct_volume_spec(
        self, layout: RootLayout, entry: PodVolumeDir, node: NodeView
    ) -> ConstructedSpec | str:
        """A pod's local volume dir: the PV its dir names; its device if the bind there
        comes from the PV's global mount (the kubelet's ConstructVolumeSpec)."""
        if not entry.is_dir:
            return f"{entry.path} is not a directory: no local volume dir"
        pod_mount = node.mount_at(entry.path)
        device = node.mount_at(self.global_mount_path(entry.name)) if pod_mount else None
        if pod_mount is None or device is None or _dev(device) != _dev(pod_mount):
            return ConstructedSpec(local_spec(entry.name))
        note = f"local PV on block device {device.source}"
        return ConstructedSpec(local_spec(entry.name, device.source), note=note)

    def construct_block_volume_spec(
        self, layout: RootLayout, entry: PodVolumeDir, node: NodeView
    ) -> ConstructedSpec | str:
        """A pod's device link: a Block local PV on the device it links to (kubelet's
        ConstructBlockVolumeSpec); its device is mapped at the PV's global map dir."""
        if entry.is_dir:
            return f"{entry.path} is a directory: no local block device link"
        target = _read_link(layout, entry.path)
        spec = local_spec(entry.name, target, BLOCK)
        return ConstructedSpec(spec, device_path=global_map_path(layout, entry.name))

    def scan_global_dirs(self, layout: RootLayout) -> GlobalScan:
        """The global map dirs of Block local PVs (volumeDevices/<pv>)."""
        scan = GlobalScan()
        where = layout.plugins_dir / ESCAPED_NAME / VOLUME_DEVICES
        try:
            names = list_dir(layout, where) or []
        except (UnsafePathError, OSError) as exc:
            scan.junk.append((where, f"cannot be read: {exc}"))
            return scan
        for name, is_dir in names:
            path = where / name
            if is_dir:
                scan.dirs.append(GlobalDir(self.name, path, name, path, block=True))
            else:
                scan.junk.append((path, "a file or link where a global map dir belongs"))
        return scan

    def construct_device_spec(self, layout: RootLayout, entry: GlobalDir) -> ConstructedSpec | str:
        """A global map dir: the Block local PV it is named after."""
        return ConstructedSpec(local_spec(entry.name, volume_mode=BLOCK), device_path=entry.path)

    def device_spec_from_volume_id(
        self, layout: RootLayout, volume_id: str, device_mount_path: str
    ) -> DesiredVolume | None:
        """A Block local PV's spec from its id and global map dir."""
        prefix = f"{PLUGIN_LOCAL}/"
        if not volume_id.startswith(prefix) or not device_mount_path:
            return None
        pv_name = volume_id[len(prefix) :]
        try:
            mine = os.fspath(global_map_path(layout, pv_name)) == device_mount_path
        except UnsafePathError:
            return None
        return local_spec(pv_name, volume_mode=BLOCK) if mine else None

    def expected_pod_mount(self, spec: object) -> str | None:
        """A bind mount of the local path."""
        return None

    def pod_mount_path(self, root: Path, req: VolumeRequest) -> Path:
        """pods/<uid>/volumes/kubernetes.io~local-volume/<pv name>; for Block the device
        link pods/<uid>/volumeDevices/kubernetes.io~local-volume/<pv name>."""
        layout = RootLayout(root)
        if req.volume_mode == BLOCK:
            return layout.pod_volume_device_path(req.pod_uid, ESCAPED_NAME, req.spec_name)
        return layout.pod_volume_dir(req.pod_uid, ESCAPED_NAME, req.spec_name)

    def device_mount_path(self, root: Path, req: VolumeRequest) -> Path | None:
        """The global map dir of a Block local PV (None in Filesystem mode)."""
        if req.volume_mode != BLOCK:
            return None
        return global_map_path(RootLayout(root), req.spec_name)

    async def set_up(self, req: VolumeRequest) -> MountResult:
        """Check the path is a directory; bind mount it at the pod's dir. Idempotent.

        Block: check the path is a block device and name it (MapPodDevice);
        the engine maps it.
        """
        if req.volume_mode == BLOCK:
            return await asyncio.to_thread(block_device_of, req)
        return await asyncio.to_thread(self._set_up, req)

    def _set_up(self, req: VolumeRequest) -> MountResult:
        path, target = req.source.path, req.mount_path
        if target is None:
            raise PluginError("InvalidArgument", "no pod mount path", ErrorClass.TRANSIENT)
        try:
            kind = stat.S_IFMT(os.stat(path).st_mode)
        except OSError as exc:
            code = errno.errorcode.get(exc.errno or 0, "OSError")
            raise PluginError(
                code, f"local path {path}: {exc.strerror}", ErrorClass.FINAL
            ) from None
        if kind == stat.S_IFBLK:
            path = str(self._mount_device(path, req))
        elif kind != stat.S_IFDIR:
            raise PluginError(
                "InvalidArgument",
                f"{path}: only directory and block device are supported",
                ErrorClass.FINAL,
            )
        try:
            self.layout.ensure_dir(target, POD_DIR_MODE)
            found = mounts.find_mount(target)
            if found is None:
                options = ["bind", *(("ro",) if req.read_only else ()), *req.source.mount_options]
                with self.layout.pin(target) as pinned:
                    mounts.mount(path, pinned, "", options)
                return self._apply_fs_group(target, req)
        except UnsafePathError as exc:
            raise PluginError("UnsafePath", str(exc), ErrorClass.TRANSIENT) from None
        except mounts.MountError as exc:
            raise PluginError(exc.code, str(exc), ErrorClass.FINAL) from None
        except OSError as exc:
            code = errno.errorcode.get(exc.errno or 0, "OSError")
            raise PluginError(code, f"mounting {path}: {exc}", ErrorClass.UNCERTAIN) from None
        return MountResult(path=str(target), mount_found=mounts.find_mount(target) is not None)

    def global_mount_path(self, spec_name: str) -> Path:
        """plugins/kubernetes.io/local-volume/mounts/<pv>: where a block device is mounted."""
        return self.layout.plugin_dir(PLUGIN_LOCAL) / "mounts" / spec_name

    def _mount_device(self, device: str, req: VolumeRequest) -> Path:
        """The kubelet's FormatAndMount of a local block device at its global mount path:
        ext4 (or the PV's fsType) made only when the device holds no signature at all."""
        where = self.global_mount_path(req.spec_name)
        try:
            self.layout.ensure_dir(where, POD_DIR_MODE)
            if mounts.find_mount(where) is not None:
                return where
            fs_type = req.source.fs_type or DEFAULT_FS_TYPE
            found = _signature(device)
            if found == "":
                _run(["mkfs." + fs_type, "-F", "-m0", device], f"formatting {device}")
            elif found != fs_type:
                raise PluginError(
                    "FormatMismatch",
                    f"{device} holds {found}, not {fs_type}: not formatted, not mounted",
                    ErrorClass.FINAL,
                )
            options = [*(("ro",) if req.read_only else ()), *req.source.mount_options]
            with self.layout.pin(where) as pinned:
                mounts.mount(device, pinned, fs_type, options)
        except UnsafePathError as exc:
            raise PluginError("UnsafePath", str(exc), ErrorClass.TRANSIENT) from None
        except mounts.MountError as exc:
            raise PluginError(exc.code, str(exc), ErrorClass.FINAL) from None
        return where

    def _unmount_device(self, spec_name: str) -> None:
        """Unmount a block device's global mount once no pod binds it; remove its dir."""
        where = self.global_mount_path(spec_name)
        found = mounts.find_mount(where)
        if found is not None:
            if self._binds_of(found, exclude=str(where)):
                return
            mounts.umount(where)
        try:
            with self.layout.open_dir(where.parent) as fd:
                os.rmdir(where.name, dir_fd=fd)
        except FileNotFoundError:
            return

    def _apply_fs_group(self, target: Path, req: VolumeRequest) -> MountResult:
        """The kubelet's ownership pass on a local volume: at a pod's first mount, not
        read-only, with the pod's change policy, and only when no other pod mounts it."""
        result = MountResult(path=str(target), mount_found=mounts.find_mount(target) is not None)
        if req.fs_group is None or req.read_only:
            return result
        others = self._other_pod_mounts(target)
        if others:
            note = f"fsGroup {req.fs_group} not applied: other pods mount it ({others[0]})"
            return replace(result, ownership=note)
        try:
            done = ownership.set_volume_ownership(
                target, req.fs_group, req.fs_group_change_policy, read_only=False
            )
        except OSError as exc:
            raise PluginError(
                "FSGroupFailed", f"applyFSGroup failed for {target}: {exc}", ErrorClass.UNCERTAIN
            ) from None
        return replace(result, ownership=done.summary(), ownership_s=done.duration_s)

    def _other_pod_mounts(self, target: Path) -> list[str]:
        """Mount points under the pods dir of the same directory as the one at `target`."""
        found = mounts.find_mount(target)
        return [] if found is None else self._binds_of(found, exclude=str(target))

    def _binds_of(self, mount: mounts.MountInfo, exclude: str) -> list[str]:
        """Mount points under the pods dir showing the same directory as `mount`."""
        pods = str(self.layout.root / "pods") + "/"
        return [
            info.mount_point
            for info in mounts.read_mountinfo()
            if info.mount_point != exclude
            and info.mount_point.startswith(pods)
            and (info.major, info.minor, info.root) == (mount.major, mount.minor, mount.root)
        ]

    async def tear_down(self, req: VolumeRequest) -> str | None:
        """Unmount the bind and remove the empty pod dir; the local path is left as it is.

        Block: nothing (the engine's unmap removed its links and binds; the device stays).
        """
        if req.volume_mode == BLOCK:
            return None
        return await asyncio.to_thread(self._tear_down, req)

    def _tear_down(self, req: VolumeRequest) -> str | None:
        target = req.mount_path
        if target is None:
            return None
        try:
            while mounts.find_mount(target) is not None:
                mounts.umount(target)
            self._unmount_device(req.spec_name)
            with self.layout.open_dir(target.parent) as fd:
                os.rmdir(target.name, dir_fd=fd)
        except FileNotFoundError:
            return None
        except (UnsafePathError, mounts.MountError) as exc:
            raise PluginError("TearDownFailed", str(exc), ErrorClass.UNCERTAIN) from None
        except OSError as exc:
            if req.keep_files and exc.errno == errno.ENOTEMPTY:
                return f"kept: {target}: not empty once unmounted (files the log did not create)"
            code = errno.errorcode.get(exc.errno or 0, "OSError")
            raise PluginError(code, f"removing {target}: {exc}", ErrorClass.UNCERTAIN) from None
        return None

"""Step 2, the log against the node: what the log says is staged or mounted must be there.

A device the log says is staged (DeviceGloballyMounted, and a mount was found
at its staging path when it was staged) or a pod-volume the log says is
Mounted that the node lacks in /proc/self/mountinfo becomes Uncertain with
the reason. What counts as "there" for a pod-volume: its path exists; a
block volume has its device bound on its global map file (the engine's own
bind), and the driver's publish bind if the plugin names one
(`SpecConstructor.block_publish_path`) and the log saw it; a filesystem
volume has a mount at its path if its plugin always mounts one there
(`SpecConstructor.expected_pod_mount`: emptyDir's tmpfs), else if the log
saw the driver's mount after the call (`mount_found`). Entries the node
confirms stay as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

from events.streams import device_stream, podvol_stream
from events.tables import GLOBALLY_MOUNTED, MOUNTED
from volfsm.engine.reconstruct.plan import Context, Plan
from volfsm.engine.reconstruct.scan import NodeScan, entry_of, inside
from volfsm.engine.reconstruct.specs import PluginSpecs
from volfsm.node.layout import VOLUME_DEVICES
from volfsm.plugins.base import BLOCK

NO_MOUNT = "/proc/self/mountinfo has no mount there"


def plan_against_node(ctx: Context, plan: Plan, scan: NodeScan, specs: PluginSpecs) -> None:
    """Mark Uncertain what the log says is staged or Mounted and the node lacks."""
    for vid, dev in list(ctx.asw.devices.items()):
        if dev.state != GLOBALLY_MOUNTED or vid in plan.marked_devices:
            continue
        reason = _staging_missing(ctx, vid, dev.device_mount_path, scan)
        if reason:
            plan.mark_device(vid, reason, dev.device_mount_path, found=False)
    for (uid, name), pv in list(ctx.asw.podvols.items()):
        if pv.state != MOUNTED or (uid, name) in plan.marked_podvols or not pv.mount_path:
            continue
        reason = _mount_missing(ctx, specs, uid, name, pv.volume_id, pv.mount_path, scan)
        if reason:
            plan.mark_podvol(uid, name, pv.volume_id, reason, found=False)


def _staging_missing(ctx: Context, volume_id: str, path: str, scan: NodeScan) -> str:
    """Why the device the log says is staged is not, or "" (nothing to say)."""
    if not path or scan.mount_at(path) is not None or not inside(ctx.layout, path):
        return ""
    spec = ctx.device_spec(volume_id)
    parts = ctx.layout.relative_parts(path)
    if (spec is not None and spec.volume_mode == BLOCK) or VOLUME_DEVICES in parts:
        return ""  # a block global map dir is no mount (its pods' files are)
    seen = ctx.seen_mounted_at(device_stream(volume_id), "DeviceMounted")
    if seen is None:
        return ""  # no staging mount was ever seen there: nothing to miss
    return f"the log says staged at {path} (mounted there at seq {seen}), but {NO_MOUNT}"


def _mount_missing(
    ctx: Context,
    specs: PluginSpecs,
    uid: str,
    name: str,
    volume_id: str,
    path_text: str,
    scan: NodeScan,
) -> str:
    """Why the pod-volume the log says is Mounted is not, or ""."""
    path = Path(path_text)
    if not inside(ctx.layout, path):
        return ""  # recorded under another root dir: not this node's to judge
    spec = ctx.spec_of(uid, name)
    entry = entry_of(ctx.layout, path)
    block = (
        spec.volume_mode == BLOCK
        if spec is not None
        else entry is not None and entry[1] == VOLUME_DEVICES
    )
    if not os.path.lexists(path):
        return f"the log says Mounted at {path}, but it does not exist on the node"
    if block:
        dev = ctx.asw.devices.get(volume_id)
        if dev is None or not dev.device_mount_path:
            return ""
        bind = Path(dev.device_mount_path) / uid
        if scan.mount_at(bind) is None:
            return (
                f"the log says the block device is mapped for the pod, but {bind} has no"
                " device bind-mounted on it"
            )
        plugin = specs.plugin_for(spec, entry)
        publish = (
            plugin.block_publish_path(ctx.layout, Path(dev.device_mount_path), uid)
            if plugin is not None
            else None
        )
        return _publish_missing(ctx, uid, name, publish, scan)
    if scan.mount_at(path) is not None:
        return ""
    expected = specs.expected_pod_mount(spec) if spec is not None else None
    if expected is not None:
        if not expected:
            return ""  # the plugin mounts nothing there (a plain directory)
        return f"the log says Mounted ({expected}) at {path}, but {NO_MOUNT}"
    seen = ctx.seen_mounted_at(podvol_stream(uid, name), "VolumeMounted")
    if seen is None:
        return ""
    return f"the log says Mounted at {path} (mounted there at seq {seen}), but {NO_MOUNT}"


def _publish_missing(
    ctx: Context, uid: str, name: str, publish: Path | None, scan: NodeScan
) -> str:
    """Why a block volume's publish bind the log saw is gone, or "".

    Like the filesystem check, only a mount the log saw after the publish
    (`VolumeMounted.mount_found`) can be missed: a driver that publishes a
    device node without a mount has nothing to lose here.
    """
    if publish is None or scan.mount_at(publish) is not None:
        return ""
    seen = ctx.seen_mounted_at(podvol_stream(uid, name), "VolumeMounted")
    if seen is None:
        return ""
    return (
        f"the log says the block device is published for the pod at {publish} (bound"
        f" there at seq {seen}), but {NO_MOUNT}"
    )

"""Step 3, the node against the log: volume entries on the node the log does not hold.

Every pod volume dir and every plugin global dir (a CSI staging or block
volume dir) that the log does not hold (log lost, restored from a backup,
written by another tool) becomes Uncertain with the reason "found on node,
not in the log" (counted in the report's ``reconstructed``). Its spec comes
from the log when the log knows the pod, else from the plugin owning the dir
(`volfsm.engine.reconstruct.specs`). A CSI PV volume found in a pod dir is
named by its dir (the PV name, kubelet's outerVolumeSpecName problem
#103143); when the pod is applied again under another volume name the
reconciler hands the entry over (`OperationGenerator.adopt`) instead of
unmounting the mount the pod uses. What no plugin can rebuild, and what is
not even a volume entry, is an orphan.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from events.types import DesiredVolume, DeviceAttached
from volfsm.engine.index import HOLDING
from volfsm.engine.reconstruct.plan import STAGED, Context, Fire, Plan, PodVolumeKey
from volfsm.engine.reconstruct.scan import EntryKey, NodeScan, entry_of
from volfsm.engine.reconstruct.specs import PluginSpecs
from volfsm.plugins.base import ConstructedSpec, PluginError, PodVolumeDir

REASON_FOUND = "found on node, not in the log"


def plan_found(ctx: Context, plan: Plan, scan: NodeScan, specs: PluginSpecs) -> None:
    """Pod volume dirs, then global dirs, then junk: Uncertain, or orphans."""
    _plan_pod_entries(ctx, plan, scan, specs)
    _plan_globals(ctx, plan, scan, specs)
    for junk in scan.junk:
        plan.orphan(ctx.layout, junk.path, junk.why, uid=junk.pod_uid, plugin=junk.plugin)


def _found_reason(path: Path, scan: NodeScan, note: str = "") -> str:
    reason = f"{REASON_FOUND}: {path}"
    mounted = scan.mounts_under(path)
    if mounted:
        reason += f" (mounted: {', '.join(mounted)})"
    if note:
        reason += f" ({note})"
    return reason


# ------------------------------------------------------------------ pod dirs


def _held_entries(ctx: Context, plan: Plan) -> dict[EntryKey, PodVolumeKey]:
    """The pod volume dirs of the entries the log holds (Mounted or Uncertain).

    The recorded mount path names the dir; only entries without one
    (Uncertain before any mount) need their plugin asked.
    """
    known: dict[EntryKey, PodVolumeKey] = {}
    for key, pv in ctx.asw.podvols.items():
        if pv.state not in HOLDING and key not in plan.marked_podvols:
            continue
        found = entry_of(ctx.layout, pv.mount_path)
        if found is not None:
            known[found] = key
            continue
        spec = ctx.spec_of(*key)
        if spec is not None:
            for entry in ctx.entries_of(key[0], spec):
                known.setdefault(entry, key)
    return known


def _spec_from_pod(ctx: Context, entry: PodVolumeDir) -> DesiredVolume | None:
    pod = ctx.index.pod_spec(entry.pod_uid)
    for dv in pod.volumes if pod is not None else ():
        if entry.key in ctx.entries_of(entry.pod_uid, dv):
            return dv
    return None


def _plan_pod_entries(ctx: Context, plan: Plan, scan: NodeScan, specs: PluginSpecs) -> None:
    if not scan.entries:
        return  # no pod volume dir on the node: nothing to match against the log
    held = _held_entries(ctx, plan)
    for entry in scan.entries:
        key = held.get(entry.key)
        if key is None:
            _plan_found_entry(ctx, plan, entry, scan, specs)
        elif ctx.spec_of(*key) is None and key not in plan.podvol_specs:
            rec = specs.construct(entry, scan)
            if isinstance(rec, ConstructedSpec):
                plan.podvol_specs[key] = msgspec.structs.replace(rec.spec, name=key[1])


def _plan_found_entry(
    ctx: Context, plan: Plan, entry: PodVolumeDir, scan: NodeScan, specs: PluginSpecs
) -> None:
    uid = entry.pod_uid
    spec = _spec_from_pod(ctx, entry)
    device: Path | None = None
    if spec is None:
        rec = specs.construct(entry, scan)
        if isinstance(rec, str):
            plan.orphan(ctx.layout, entry.path, rec, uid=uid, entry=entry.key)
            return
        spec, device, note = rec.spec, rec.device_path, rec.note
    else:
        paths = ctx.ops.request_paths(spec, "")
        device, note = paths[0] if paths is not None else None, ""
    key = (uid, spec.name)
    pv = ctx.asw.podvols.get(key)
    if key in plan.marked_podvols or (pv is not None and pv.state in HOLDING):
        if ctx.spec_of(*key) is None:
            plan.podvol_specs.setdefault(key, spec)
        return
    reason = _found_reason(entry.path, scan, note)
    if _staged_kind(ctx, specs, spec):
        _plan_device(ctx, plan, spec, device, reason)
    plan.mark_podvol(uid, spec.name, spec.volume_id, reason, found=True)
    plan.podvol_specs[key] = spec


def _staged_kind(ctx: Context, specs: PluginSpecs, spec: DesiredVolume) -> bool:
    """Whether the volume is staged once per node: a PV volume of a device-mountable
    plugin (when its plugin, e.g. a CSI driver, is not registered yet: as its kind is)."""
    if not spec.pv_name:
        return False
    plugin = ctx.ops.find_plugin(spec.source)
    if isinstance(plugin, PluginError):
        return specs.is_device_mountable(spec.source)
    return plugin.is_device_mountable(spec.source)


def _plan_device(
    ctx: Context, plan: Plan, spec: DesiredVolume, path: Path | None, reason: str
) -> None:
    """A staged volume the log does not hold as staged: Attached, then Uncertain."""
    vid = spec.volume_id
    dev = ctx.asw.devices.get(vid)
    if vid in plan.marked_devices or (dev is not None and dev.state in STAGED):
        if ctx.device_spec(vid) is None:
            plan.device_specs.setdefault(vid, spec)
        return
    if dev is None:
        source = spec.source
        label = f"{source.plugin}:{source.driver}" if source.driver else source.plugin
        plugin = ctx.ops.find_plugin(source)
        attachable = not isinstance(plugin, PluginError) and plugin.is_attachable(
            source, inline=not spec.pv_name
        )
        body = DeviceAttached(volume_id=vid, plugin=label, attachable=attachable)
        plan.actions.append(Fire(vid, "", "", "attach", body))
    plan.mark_device(vid, reason, os.fspath(path) if path else "", found=True)
    plan.device_specs.setdefault(vid, spec)


# --------------------------------------------------------------- global dirs


def _plan_globals(ctx: Context, plan: Plan, scan: NodeScan, specs: PluginSpecs) -> None:
    staged: dict[str, str] = {}
    for vid, dev in ctx.asw.devices.items():
        if dev.state in STAGED and dev.device_mount_path:
            staged[dev.device_mount_path] = vid
    for entry in scan.global_dirs:
        inner = os.fspath(entry.device_path)
        prefix = os.fspath(entry.path) + "/"
        known = staged.get(inner) or next(
            (v for p, v in staged.items() if p.startswith(prefix)), None
        )
        rec = specs.construct_device(entry)
        if known is not None:
            if isinstance(rec, ConstructedSpec) and ctx.device_spec(known) is None:
                plan.device_specs.setdefault(known, rec.spec)
            continue
        if isinstance(rec, str):
            plan.orphan(ctx.layout, entry.path, rec, plugin=entry.plugin)
            continue
        _plan_device(ctx, plan, rec.spec, rec.device_path, _found_reason(entry.path, scan))

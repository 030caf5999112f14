"""Steps 4 and 5: what the log holds but cannot fully vouch for.

4. **Entries without a spec.** Only entries an earlier reconstruction made
   lack a spec in the log; the scan rebuilds theirs from the node when
   anything is left there. When nothing is (its dir went, e.g. a teardown
   finished but the process died before recording it), the volume id still
   names the plugin and its volume (`SpecConstructor.spec_from_volume_id`):
   enough for the plugin's idempotent teardown once no pod wants it.
5. **What the log never created.** Every held pod-volume found on the node
   now or by an earlier start whose stream records no mount by volfsm is
   handed to the operation generator (`found_on_node`): its teardown keeps
   files (`VolumeRequest.keep_files`).
"""

from __future__ import annotations

from loguru import logger as log

from events.streams import podvol_stream
from events.types import Body, OperationStarted, VolumeMounted
from volfsm.engine.index import HOLDING
from volfsm.engine.operations import MAP_VOLUME, VOLUME_MOUNT
from volfsm.engine.reconstruct.plan import STAGED, Context, Plan
from volfsm.engine.reconstruct.specs import PluginSpecs


def plan_specless(ctx: Context, plan: Plan, specs: PluginSpecs) -> None:
    """Give a spec, from its volume id, to every held entry that has none."""
    for key, pv in list(ctx.asw.podvols.items()):
        if pv.state not in HOLDING or key in plan.podvol_specs:
            continue
        if ctx.spec_of(*key) is None:
            spec = specs.from_volume_id(pv.volume_id, *key)
            if spec is None:
                log.warning("pod-volume {}/{}: no spec can be rebuilt for {!r}", *key,
                            pv.volume_id)  # fmt: skip
            else:
                plan.podvol_specs[key] = spec
    for vid, dev in list(ctx.asw.devices.items()):
        if dev.state not in STAGED or vid in plan.device_specs:
            continue
        if ctx.device_spec(vid) is None:
            spec = specs.device_from_volume_id(vid, dev.device_mount_path)
            if spec is None:
                log.warning("volume {}: no spec can be rebuilt; it cannot be unstaged", vid)
            else:
                plan.device_specs[vid] = spec


def plan_not_created(ctx: Context, plan: Plan) -> None:
    """Find the held pod-volumes whose stream has no mount by volfsm.

    Candidates: the ones found on the node now, and the ones an earlier
    start found (reconstructed, still held). A mount attempt on the stream
    (a desired pod's volume since) or a VolumeMounted makes the volume
    volfsm's; entries it saw Mounted are not even looked at.
    """
    keys = set(plan.found_podvols)
    keys.update(k for k, pv in ctx.asw.podvols.items() if pv.state in HOLDING and pv.reconstructed)
    for key in keys:
        if not any(_mounts(env.body) for env in ctx.log.read_stream(podvol_stream(*key))):
            plan.not_created.add(key)


def _mounts(body: Body) -> bool:
    """Whether a pod-volume event records volfsm mounting it (or starting to)."""
    if isinstance(body, OperationStarted):
        return body.operation in (VOLUME_MOUNT, MAP_VOLUME)
    return isinstance(body, VolumeMounted)

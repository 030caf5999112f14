"""Step 1, interrupted operations: an `OperationStarted` with no outcome.

The process died mid-operation. If the operation's own last transition
(VolumeMounted, VolumeUnmounted, DeviceUnmounted) was recorded after its
start, the work was done and only the outcome is missing; otherwise exactly
the entry the operation acts on (the pod-volume for mount/unmount/map/unmap,
the device for unmount_device/unmap_device) is marked Uncertain, with the
reason "interrupted: <operation> started at seq N has no outcome". An online
expansion changes no mount state: nothing is marked. Either way an
`OperationFailed` (code "Interrupted", not final, no backoff) answers the
start, so no start dangles and replay, explain and analytics show what
happened.
"""

from __future__ import annotations

from events.streams import device_stream, podvol_stream
from events.types import Envelope, OperationFailed, OperationStarted
from projections.asw import OperationRecord
from volfsm.engine.operations import (
    MAP_VOLUME,
    UNMAP_DEVICE,
    UNMAP_VOLUME,
    UNMOUNT_DEVICE,
    VOLUME_MOUNT,
    VOLUME_UNMOUNT,
)
from volfsm.engine.reconstruct.plan import STAGED, Context, Plan, PodVolumeKey, Record

INTERRUPTED = "Interrupted"
"""OperationFailed code answering an operation the process died in."""

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


def plan_interrupted(ctx: Context, plan: Plan) -> None:
    """Answer every running operation in the ASW; mark what it acts on (module doc)."""
    for vid, dev in list(ctx.asw.devices.items()):
        op = dev.last_operation
        if op is not None and op.status == "running":
            _interrupted(ctx, plan, device_stream(vid), op, vid, None)
    for key, pv in list(ctx.asw.podvols.items()):
        op = pv.last_operation
        if op is not None and op.status == "running":
            _interrupted(ctx, plan, podvol_stream(*key), op, pv.volume_id, key)


def _start_and_after(
    ctx: Context, stream: str, op_id: str
) -> tuple[Envelope | None, list[Envelope]]:
    """The operation's OperationStarted on `stream` and the events after it."""
    start: Envelope | None = None
    after: list[Envelope] = []
    for env in ctx.log.read_stream(stream):
        if isinstance(env.body, OperationStarted) and env.body.op_id == op_id:
            start, after = env, []
        elif start is not None:
            after.append(env)
    return start, after


def _interrupted(
    ctx: Context,
    plan: Plan,
    stream: str,
    op: OperationRecord,
    volume_id: str,
    podvol: PodVolumeKey | None,
) -> None:
    start, after = _start_and_after(ctx, stream, op.op_id)
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
        marked = _mark(ctx, plan, op, volume_id, podvol, f"interrupted: {what} has no outcome")
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
    plan.actions.append(Record(stream, body))
    plan.report.interrupted.append(f"{stream}: {what}")


def _mark(
    ctx: Context,
    plan: Plan,
    op: OperationRecord,
    volume_id: str,
    podvol: PodVolumeKey | None,
    reason: str,
) -> bool:
    """Mark the entry the operation acts on Uncertain; whether there was one."""
    if podvol is not None and op.operation in _PODVOL_OPERATIONS:
        plan.mark_podvol(*podvol, volume_id, reason, found=False)
        return True
    if podvol is None and op.operation in _DEVICE_OPERATIONS:
        dev = ctx.asw.devices.get(volume_id)
        if dev is not None and dev.state in STAGED:
            plan.mark_device(volume_id, reason, dev.device_mount_path, found=False)
            return True
    return False

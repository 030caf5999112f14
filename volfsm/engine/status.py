"""What `VolumeEngine.pods()` / `volumes()` report: states, last operation, last error, retry.

Plain msgspec Structs, so the service can send them as JSON as they are.
Times are UTC microseconds, as in the log.
"""

from __future__ import annotations

import msgspec

from events.tables import MOUNTED, UNCERTAIN
from projections.asw import DeviceState, OperationRecord, PodVolumeState


class OperationStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One operation as the log recorded it."""

    op_id: str
    operation: str
    status: str
    started_us: int
    ended_us: int | None = None
    code: str = ""
    message: str = ""
    final: bool | None = None
    backoff_s: float = 0.0


class PodVolumeStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One volume of a pod."""

    name: str
    volume_id: str
    state: str
    desired: bool
    since_us: int = 0
    mount_path: str = ""
    reason: str = ""
    waiting: str = ""
    """Why the engine does not mount it yet though the pod wants it (ReadWriteOncePod)."""
    reconstructed: bool = False
    last_operation: OperationStatus | None = None
    last_error: OperationStatus | None = None
    next_retry_us: int | None = None
    claim: str = ""
    """The PersistentVolumeClaim behind the volume ("" if none)."""
    capacity_bytes: int | None = None
    """From the last volume stats gathering (PVC-backed and Mounted only)."""
    used_bytes: int | None = None
    available_bytes: int | None = None
    abnormal: bool = False
    """The driver reports the volume condition abnormal (`condition` says why)."""
    condition: str = ""


class PodStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A pod the engine knows: desired, or still holding volumes.

    `phase`: "Mounted" (every volume Mounted: containers may start),
    "Pending" (desired, not all Mounted; a pending pod lists only its
    waiting volumes, each with what it waits for in `waiting`),
    "Terminating" (deleted, some volume still Mounted or Uncertain) or "Gone".
    """

    uid: str
    namespace: str
    name: str
    desired: bool
    phase: str
    volumes: tuple[PodVolumeStatus, ...] = ()


class VolumeStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A volume on the node (its device FSM) and who uses it."""

    volume_id: str
    state: str
    plugin: str = ""
    attachable: bool = False
    device_path: str = ""
    device_mount_path: str = ""
    size_bytes: int | None = None
    desired_size_bytes: int | None = None
    since_us: int = 0
    reason: str = ""
    reconstructed: bool = False
    held_by: tuple[str, ...] = ()
    """Pods with the volume Mounted or Uncertain ("<uid>/<volume name>")."""
    wanted_by: tuple[str, ...] = ()
    """Pods that want the volume (uids)."""
    last_operation: OperationStatus | None = None
    last_error: OperationStatus | None = None
    next_retry_us: int | None = None
    capacity_bytes: int | None = None
    """From the last volume stats gathering of a pod using it (PVC-backed volumes)."""
    used_bytes: int | None = None
    available_bytes: int | None = None
    abnormal: bool = False
    condition: str = ""


def operation_status(record: OperationRecord | None) -> OperationStatus | None:
    """An ASW operation record as a status."""
    if record is None:
        return None
    return OperationStatus(
        op_id=record.op_id,
        operation=record.operation,
        status=record.status,
        started_us=record.started_us,
        ended_us=record.ended_us,
        code=record.code,
        message=record.message,
        final=record.final,
        backoff_s=record.backoff_s,
    )


def next_retry_us(entry: DeviceState | PodVolumeState) -> int | None:
    """When the entry's failed last operation may be retried (None if it did not fail)."""
    op = entry.last_operation
    if op is None:
        return None
    return op.retry_at_us


PENDING = "Pending"
"""The phase of a desired pod not all of whose volumes are Mounted (a pending pod too)."""


def pod_phase(desired: bool, states: list[str]) -> str:
    """The pod's phase from its volumes' states (see `PodStatus`)."""
    if desired:
        return MOUNTED if all(s == MOUNTED for s in states) else PENDING
    if any(s in (MOUNTED, UNCERTAIN) for s in states):
        return "Terminating"
    return "Gone"


__all__ = [
    "PENDING",
    "OperationStatus",
    "PodStatus",
    "PodVolumeStatus",
    "VolumeStatus",
    "next_retry_us",
    "operation_status",
    "pod_phase",
]

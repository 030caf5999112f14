"""Event bodies: a msgspec tagged union, one Struct per event type.

Every body type carries a schema version (`SCHEMA`); bodies written with an
older schema are decoded through `events.upcast`. The tag (`type` field in
JSON) is the class name and is part of the public contract: it appears in
the log, on NATS subjects and in every JSON output.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec


class Body(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=True):
    """Base of every event body."""

    SCHEMA: ClassVar[int] = 1
    KIND: ClassVar[str] = "event"


# --------------------------------------------------------------------------
# Desired state (stream "pod/<uid>")


class VolumeSource(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a plugin needs to mount a volume: resolved from PV, inline csi or emptyDir."""

    plugin: str
    driver: str = ""
    volume_handle: str = ""
    fs_type: str = ""
    mount_options: tuple[str, ...] = ()
    attributes: dict[str, str] = {}
    access_modes: tuple[str, ...] = ()
    medium: str = ""
    size_limit_bytes: int | None = None
    node_stage_secret_ref: str = ""  # "namespace/name" of the Secret; volfsm never reads it
    node_publish_secret_ref: str = ""


class DesiredVolume(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One volume of a pod as the desired state holds it."""

    name: str
    volume_id: str
    source: VolumeSource
    volume_mode: str = "Filesystem"
    pv_name: str = ""
    claim_name: str = ""
    size_bytes: int | None = None
    read_only: bool = False
    claim_read_only: bool = False  # the pod's persistentVolumeClaim.readOnly as written
    claim_capacity_bytes: int | None = None
    """The claim's status.capacity.storage when the pod was added (None: the claim had none).

    Below `size_bytes` (the PV's capacity), the volume grew while the claim
    still says the old size: the first mount on this node expands it.
    """


class PodAdded(Body, frozen=True, kw_only=True):
    """A pod was added to the desired state with these volumes."""

    KIND = "desired"
    pod_uid: str
    namespace: str
    name: str
    volumes: tuple[DesiredVolume, ...] = ()


class PodRemoved(Body, frozen=True, kw_only=True):
    """A pod was removed from the desired state."""

    KIND = "desired"
    pod_uid: str
    namespace: str
    name: str


class PodCleanedUp(Body, frozen=True, kw_only=True):
    """A removed pod is done with: its volumes unmounted, its pod dir removed.

    Recorded by the reconciler after it removed the pod dir. Folds forget
    the pod: the ASW drops its Unmounted pod-volume entries (`volume_names`)
    and the engine's index its spec, so the state a restart rebuilds holds
    what is on the node, not every pod the node ever ran (the kubelet drops
    a pod from its actual state once its volumes are unmounted).
    """

    KIND = "desired"
    pod_uid: str
    volume_names: tuple[str, ...] = ()


class DesiredSizeChanged(Body, frozen=True, kw_only=True):
    """A volume's desired size changed (PV capacity grew): expansion wanted."""

    KIND = "desired"
    volume_id: str
    size_bytes: int


# --------------------------------------------------------------------------
# Device transitions (stream "device/<volume_id>")


class DeviceAttached(Body, frozen=True, kw_only=True):
    """The volume is attached to this node (or its plugin is not attachable)."""

    KIND = "device"
    volume_id: str
    plugin: str
    attachable: bool = False
    device_path: str = ""


class DeviceMounted(Body, frozen=True, kw_only=True):
    """NodeStage / MountDevice / SetUpDevice succeeded.

    `mount_found` is what /proc/self/mountinfo showed at the staging path
    afterwards (None when not checked or no mount is expected).
    """

    KIND = "device"
    volume_id: str
    device_mount_path: str = ""
    mount_found: bool | None = None


class DeviceMountUncertain(Body, frozen=True, kw_only=True):
    """A stage or unstage may or may not have happened.

    `reconstructed`: marked by reconstruction at start; a final error on the
    retry then leaves the entry Uncertain (kubelet's reconstructed volumes).
    """

    KIND = "device"
    volume_id: str
    reason: str
    reconstructed: bool = False
    device_mount_path: str = ""


class DeviceUnmounted(Body, frozen=True, kw_only=True):
    """The device is not staged (unstage succeeded, or a final error after Uncertain)."""

    KIND = "device"
    volume_id: str
    reason: str = ""


class DeviceDetached(Body, frozen=True, kw_only=True):
    """The volume is no longer attached / known on this node."""

    KIND = "device"
    volume_id: str


class VolumeResized(Body, frozen=True, kw_only=True):
    """The volume's recorded size changed (expansion succeeded or first size known)."""

    KIND = "device"
    volume_id: str
    size_bytes: int


# --------------------------------------------------------------------------
# Pod-volume transitions (stream "podvol/<pod_uid>/<volume_name>")


class VolumeMounted(Body, frozen=True, kw_only=True):
    """NodePublish / SetUp / MapPodDevice succeeded for this pod."""

    KIND = "podvol"
    volume_id: str
    pod_uid: str
    volume_name: str
    mount_path: str = ""
    mount_found: bool | None = None


class VolumeMountUncertain(Body, frozen=True, kw_only=True):
    """A publish or unpublish for this pod may or may not have happened.

    `reconstructed`: marked by reconstruction at start; a final error on the
    retry then leaves the entry Uncertain (kubelet's reconstructed volumes).
    """

    KIND = "podvol"
    volume_id: str
    pod_uid: str
    volume_name: str
    reason: str
    reconstructed: bool = False


class VolumeUnmounted(Body, frozen=True, kw_only=True):
    """The volume is not mounted for this pod."""

    KIND = "podvol"
    volume_id: str
    pod_uid: str
    volume_name: str
    reason: str = ""


# --------------------------------------------------------------------------
# Operation records (on the stream the operation's key names)


class OperationStarted(Body, frozen=True, kw_only=True):
    """An operation is about to call a plugin. Written before the call."""

    KIND = "operation"
    op_id: str
    operation: str
    volume_id: str
    pod_uid: str = ""
    plugin: str = ""
    reason: str = ""


class OperationSucceeded(Body, frozen=True, kw_only=True):
    """The operation with `op_id` finished successfully."""

    KIND = "operation"
    op_id: str
    operation: str
    duration_s: float = 0.0


class OperationFailed(Body, frozen=True, kw_only=True):
    """The operation with `op_id` failed.

    Schema 2: `code`/`message` replace v1's combined `error` string, `final`
    replaces v1's inverted `retriable`, and the backoff is in seconds.
    """

    SCHEMA = 2
    KIND = "operation"
    op_id: str
    operation: str
    code: str
    message: str
    final: bool
    backoff_s: float = 0.0
    duration_s: float = 0.0


Event = (
    PodAdded
    | PodRemoved
    | PodCleanedUp
    | DesiredSizeChanged
    | DeviceAttached
    | DeviceMounted
    | DeviceMountUncertain
    | DeviceUnmounted
    | DeviceDetached
    | VolumeResized
    | VolumeMounted
    | VolumeMountUncertain
    | VolumeUnmounted
    | OperationStarted
    | OperationSucceeded
    | OperationFailed
)

EVENT_TYPES: dict[str, type[Body]] = {
    cls.__name__: cls
    for cls in (
        PodAdded,
        PodRemoved,
        PodCleanedUp,
        DesiredSizeChanged,
        DeviceAttached,
        DeviceMounted,
        DeviceMountUncertain,
        DeviceUnmounted,
        DeviceDetached,
        VolumeResized,
        VolumeMounted,
        VolumeMountUncertain,
        VolumeUnmounted,
        OperationStarted,
        OperationSucceeded,
        OperationFailed,
    )
}


def schema_of(body: Body) -> int:
    """The schema version a body of this type is written with today."""
    return type(body).SCHEMA


def type_name(body: Body) -> str:
    """The public type name (the union tag) of a body."""
    return type(body).__name__


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """One logged event: where it sits in the log and in its stream, and its body.

    `ts` is UTC microseconds since the Unix epoch.
    """

    seq: int
    stream: str
    version: int
    type: str
    schema: int
    ts: int
    node: str
    body: Event

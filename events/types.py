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
    path: str = ""  # hostPath / local: the path on the node
    pod_memory_limit_bytes: int | None = None  # emptyDir Memory: the pod's memory limit, if any
    path_type: str = ""  # hostPath: its type ("" = no check)
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
    fs_group: int | None = None  # the pod's securityContext.fsGroup
    fs_group_change_policy: str = ""  # its fsGroupChangePolicy ("" = Always)
    claim_capacity_bytes: int | None = None
    """The claim's status.capacity.storage when the pod was added (None: the claim had none).

    Below `size_bytes` (the PV's capacity), the volume grew while the claim
    still says the old size: the first mount on this node expands it.
    """


class PodAdded(Body, frozen=True, kw_only=True, omit_defaults=True):
    """A pod was added to the desired state with these volumes."""

    KIND = "desired"
    pod_uid: str
    namespace: str
    name: str
    volumes: tuple[DesiredVolume, ...] = ()
    service_account: str = ""  # spec.serviceAccountName ("" in logs written before it was kept)


class PendingVolume(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A volume of a pending pod, and the object it waits for."""

    name: str
    waits_for: str
    """The object: "PersistentVolumeClaim <namespace>/<name>", "PersistentVolume <name>",
    or "CSI driver <name>" (not registered on this node yet)."""
    reason: str = ""
    """What is missing of it ("not found yet; ...", "not bound yet (...)", "not registered
    on this node yet")."""
    needs: tuple[str, ...] = ()
    """Further objects whose apply may change the answer (the PV a claim names)."""

    @property
    def text(self) -> str:
        """'PersistentVolumeClaim default/web-data: not found yet; ...'."""
        if self.waits_for and self.reason:
            return f"{self.waits_for}: {self.reason}"
        return self.waits_for or self.reason


class PodPending(Body, frozen=True, kw_only=True, omit_defaults=True):
    """A pod is in the desired state, but some of its volumes wait for objects not there yet.

    The kubelet's populator keeps such a pod (ContainerCreating) and retries
    it; here an apply of an object it waits for re-resolves it, and a
    `PodAdded` of the same uid follows once every volume resolves. Nothing is
    mounted for a pending pod. A later `PodPending` replaces the reasons.
    """

    KIND = "desired"
    pod_uid: str
    namespace: str
    name: str
    waiting: tuple[PendingVolume, ...] = ()


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
# The node's object store (stream "object/<Kind>/<namespace>/<name>", or
# "object/<Kind>/<name>" for cluster-scoped kinds)


class ObjectApplied(Body, frozen=True, kw_only=True):
    """An object of the node's object store was created or changed (a Pod, PV, PVC,
    ConfigMap, Secret, ServiceAccount, ClusterTrustBundle or CSIDriver).

    Never a value: `content_hash` identifies the content, "sha256:<hex>" of
    the object's canonical JSON, or for a Secret "hmac-sha256:<hex>" keyed by
    a node secret kept beside the store, so a copied log lets nobody test
    guesses of a value. `resource_version` is the store's revision (node-local,
    increasing, what the object's metadata.resourceVersion says). `keys`
    names a ConfigMap's or Secret's keys. `action`: created, configured or
    replaced (a new uid under the same name). `reason` is set when the event
    was recorded at start for a change the store had and the log did not.
    """

    KIND = "object"
    kind: str
    namespace: str = ""
    name: str
    uid: str
    resource_version: int
    content_hash: str
    action: str = "created"
    keys: tuple[str, ...] = ()
    reason: str = ""


class ObjectDeleted(Body, frozen=True, kw_only=True):
    """An object was deleted from the node's object store."""

    KIND = "object"
    kind: str
    namespace: str = ""
    name: str
    uid: str
    resource_version: int
    reason: str = ""


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


class VolumeMounted(Body, frozen=True, kw_only=True, omit_defaults=True):
    """NodePublish / SetUp / MapPodDevice succeeded for this pod."""

    KIND = "podvol"
    volume_id: str
    pod_uid: str
    volume_name: str
    mount_path: str = ""
    mount_found: bool | None = None
    ownership: str = ""
    """What the fsGroup ownership pass did and how long it took ("" if none ran)."""
    ownership_s: float = 0.0
    contents: str = ""
    """Which object versions a configMap/secret/downwardAPI/projected volume's files came
    from ("written: ConfigMap default/app uid=... rv=3 sha256:..."), never a value."""


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


# --------------------------------------------------------------------------
# Observations of a mounted pod-volume (stream "podvol/<pod_uid>/<volume_name>")
#
# Not transitions: like operation records they may appear in any state. The
# volume stats gatherer (`volfsm.engine.volstats`) records them only when
# what it sees changes, never every period.


class VolumeConditionChanged(Body, frozen=True, kw_only=True):
    """The volume's health, as its CSI driver reports it (VOLUME_CONDITION), changed.

    Recorded when a volume turns abnormal, when its message changes while
    abnormal, and when it is normal again; a first normal report is not a
    change. `claim` is the PersistentVolumeClaim ("" for other volumes).
    A disk-backed emptyDir is abnormal while it uses more than its
    sizeLimit (the message is the kubelet's eviction message).
    """

    KIND = "observation"
    volume_id: str
    pod_uid: str
    volume_name: str
    abnormal: bool
    message: str = ""
    namespace: str = ""
    claim: str = ""


class VolumeUsageChanged(Body, frozen=True, kw_only=True):
    """A PVC-backed volume's usage moved to another step (see `volfsm.engine.volstats`).

    Bytes and inodes as the kubelet's `kubelet_volume_stats_*` gauges have
    them (0 where the source did not say); `source` is "csi"
    (NodeGetVolumeStats) or "statvfs".
    """

    KIND = "observation"
    volume_id: str
    pod_uid: str
    volume_name: str
    namespace: str
    claim: str
    capacity_bytes: int = 0
    available_bytes: int = 0
    used_bytes: int = 0
    inodes: int = 0
    inodes_free: int = 0
    inodes_used: int = 0
    source: str = ""


Event = (
    PodAdded
    | PodRemoved
    | PodCleanedUp
    | DesiredSizeChanged
    | PodPending
    | ObjectApplied
    | ObjectDeleted
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
    | VolumeConditionChanged
    | VolumeUsageChanged
)

EVENT_TYPES: dict[str, type[Body]] = {
    cls.__name__: cls
    for cls in (
        PodAdded,
        PodRemoved,
        PodCleanedUp,
        DesiredSizeChanged,
        PodPending,
        ObjectApplied,
        ObjectDeleted,
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
        VolumeConditionChanged,
        VolumeUsageChanged,
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

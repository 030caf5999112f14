"""Analytics rows: one envelope (or its JSON form, as published on NATS) as scalar columns.

Also the names the analytics use: the CSI phase of each engine operation
(`PHASES`; stage has no operation of its own in the engine, so its samples
are derived and named `mount_device` / `map_device`) and the driver of a
plugin label or volume id.
"""

from __future__ import annotations

import msgspec

from events.codec import CURRENT_SCHEMAS, envelope_from_json
from events.streams import DEVICE_PREFIX, PODVOL_PREFIX
from events.types import (
    EVENT_TYPES,
    DeviceAttached,
    Envelope,
    OperationFailed,
    OperationStarted,
    OperationSucceeded,
    PodAdded,
)

CSI_PLUGIN = "kubernetes.io/csi"
"""Plugin name of CSI volumes; their volume ids are `kubernetes.io/csi/<driver>^<handle>`."""

STAGE_OF = {"volume_mount": "mount_device", "map_volume": "map_device"}
"""Operations that stage the device first -> the name of the derived stage sample."""

PHASES: dict[str, str] = {
    "mount_device": "stage",
    "map_device": "stage",
    "volume_mount": "publish",
    "map_volume": "publish",
    "volume_unmount": "unpublish",
    "unmap_volume": "unpublish",
    "unmount_device": "unstage",
    "unmap_device": "unstage",
    "volume_fs_resize": "expand",
}
"""Engine operation name (volfsm.engine.operations) -> CSI phase reported."""

PHASE_ORDER = ("stage", "publish", "unpublish", "unstage", "expand", "other")

UNKNOWN_DRIVER = "unknown"

_KIND_OF_TYPE = {name: cls.KIND for name, cls in EVENT_TYPES.items()}


def phase_of(operation: str) -> str:
    """The CSI phase an engine operation belongs to ('other' for unknown names)."""
    return PHASES.get(operation, "other")


def driver_of(plugin: str, volume_id: str) -> str:
    """The driver label: the CSI driver name, else the plugin name; "" if neither is known.

    `plugin` is the engine's label (`kubernetes.io/csi:<driver>` or a plugin
    name); `volume_id` the unique volume name (`kubernetes.io/csi/<driver>^<handle>`,
    `kubernetes.io/empty-dir/<uid>-<name>`).
    """
    if plugin.startswith(CSI_PLUGIN + ":"):
        return plugin[len(CSI_PLUGIN) + 1 :]
    if volume_id.startswith(CSI_PLUGIN + "/"):
        rest = volume_id[len(CSI_PLUGIN) + 1 :]
        driver, sep, _ = rest.partition("^")
        if sep and driver:
            return driver
    if plugin:
        return plugin
    head, sep, _ = volume_id.rpartition("/")
    return head if sep else ""


# --------------------------------------------------------------------------
# Flat rows


class EventRow(msgspec.Struct, kw_only=True):
    """One event as an analytics row: scalar columns, empty string / None when not applicable.

    `kind` is the body's KIND (desired, device, podvol, operation);
    `pod_volumes` holds a PodAdded's volume names joined by commas.
    """

    node: str
    seq: int
    ts_us: int
    type: str
    kind: str
    stream: str
    volume_id: str = ""
    pod_uid: str = ""
    volume_name: str = ""
    driver: str = ""
    operation: str = ""
    op_id: str = ""
    code: str = ""
    final: bool | None = None
    duration_s: float | None = None
    reconstructed: bool = False
    pod_volumes: str = ""


ROW_COLUMNS: tuple[str, ...] = EventRow.__struct_fields__
"""Column names of an `EventRow`, in order (`msgspec.structs.astuple` order)."""


def _stream_keys(stream: str) -> tuple[str, str, str]:
    """(volume_id, pod_uid, volume_name) a stream name itself tells."""
    if stream.startswith(DEVICE_PREFIX):
        return stream[len(DEVICE_PREFIX) :], "", ""
    if stream.startswith(PODVOL_PREFIX):
        uid, _, name = stream[len(PODVOL_PREFIX) :].partition("/")
        return "", uid, name
    return "", "", ""


def flatten(env: Envelope) -> EventRow:
    """The analytics row of one envelope."""
    body = env.body
    volume_id, pod_uid, volume_name = _stream_keys(env.stream)
    row = EventRow(
        node=env.node,
        seq=env.seq,
        ts_us=env.ts,
        type=env.type,
        kind=type(body).KIND,
        stream=env.stream,
        volume_id=getattr(body, "volume_id", "") or volume_id,
        pod_uid=getattr(body, "pod_uid", "") or pod_uid,
        volume_name=getattr(body, "volume_name", "") or volume_name,
        reconstructed=bool(getattr(body, "reconstructed", False)),
    )
    plugin = ""
    if isinstance(body, OperationStarted):
        row.op_id, row.operation, plugin = body.op_id, body.operation, body.plugin
    elif isinstance(body, OperationSucceeded):
        row.op_id, row.operation, row.duration_s = body.op_id, body.operation, body.duration_s
    elif isinstance(body, OperationFailed):
        row.op_id, row.operation, row.duration_s = body.op_id, body.operation, body.duration_s
        row.code, row.final = body.code, body.final
    elif isinstance(body, DeviceAttached):
        plugin = body.plugin
    elif isinstance(body, PodAdded):
        row.pod_volumes = ",".join(v.name for v in body.volumes)
    row.driver = driver_of(plugin, row.volume_id)
    return row


class _FlatVolume(msgspec.Struct):
    name: str = ""


class _FlatBody(msgspec.Struct, kw_only=True):
    volume_id: str = ""
    pod_uid: str = ""
    volume_name: str = ""
    op_id: str = ""
    operation: str = ""
    plugin: str = ""
    code: str = ""
    final: bool | None = None
    duration_s: float | None = None
    reconstructed: bool = False
    volumes: list[_FlatVolume] = []


class _FlatEnvelope(msgspec.Struct, kw_only=True):
    seq: int
    stream: str
    type: str
    schema: int
    ts: int
    node: str
    body: _FlatBody


_flat_decoder = msgspec.json.Decoder(_FlatEnvelope)


def flatten_json(data: bytes | str) -> EventRow:
    """The analytics row of a JSON envelope (the NATS body); equal to `flatten(decode(data))`.

    Bodies of the current schema are read straight into the row; older ones
    go through the codec's upcasters. Raises `msgspec.DecodeError` or
    `events.errors.UnknownEventError` for what no build of this version reads.
    """
    flat = _flat_decoder.decode(data)
    if CURRENT_SCHEMAS.get(flat.type) != flat.schema:
        return flatten(envelope_from_json(data))
    body = flat.body
    volume_id, pod_uid, volume_name = _stream_keys(flat.stream)
    row = EventRow(
        node=flat.node,
        seq=flat.seq,
        ts_us=flat.ts,
        type=flat.type,
        kind=_KIND_OF_TYPE[flat.type],
        stream=flat.stream,
        volume_id=body.volume_id or volume_id,
        pod_uid=body.pod_uid or pod_uid,
        volume_name=body.volume_name or volume_name,
        operation=body.operation,
        op_id=body.op_id,
        code=body.code,
        final=body.final,
        duration_s=body.duration_s,
        reconstructed=body.reconstructed,
    )
    if body.volumes:
        row.pod_volumes = ",".join(v.name for v in body.volumes)
    row.driver = driver_of(body.plugin, row.volume_id)
    return row

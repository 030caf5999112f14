"""The ASW as a snapshot part: to a msgspec struct (and bytes) and back, exactly.

The codec is generic over `Asw`: every field of the dataclass, and every
field of its entry structs, is encoded by msgspec as it is declared, so a
field added to `Asw`, `DeviceState`, `PodVolumeState` or `OperationRecord`
is carried without touching this module (older snapshots decode with the
field's default; `volfsm.engine.snapshot` refuses snapshots of another
build anyway).

One thing msgspec cannot see is sharing: after a failure an entry's
`last_error` is the very object of its `last_operation`, and a later
outcome of the same operation updates both. The snapshot lists the
entries where they are one object and `restore_asw` joins them again, so
a restored ASW folds the following events exactly as the original would.
"""

from __future__ import annotations

import dataclasses

import msgspec

from projections.asw import Asw


class AswSnapshot(msgspec.Struct, array_like=True, frozen=True):
    """An ASW as stored in a snapshot."""

    asw: Asw
    shared_device_errors: list[str] = []
    """Devices whose `last_error` is their `last_operation` (one object)."""
    shared_podvol_errors: list[tuple[str, str]] = []
    """Pod-volumes whose `last_error` is their `last_operation` (one object)."""


_ASW_FIELDS = tuple(f.name for f in dataclasses.fields(Asw))
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(AswSnapshot)


def snapshot_asw(asw: Asw) -> AswSnapshot:
    """The snapshot part of `asw` (shares its objects: encode it before the ASW changes)."""
    devices = [
        vid
        for vid, dev in asw.devices.items()
        if dev.last_error is not None and dev.last_error is dev.last_operation
    ]
    podvols = [
        key
        for key, pv in asw.podvols.items()
        if pv.last_error is not None and pv.last_error is pv.last_operation
    ]
    return AswSnapshot(asw=asw, shared_device_errors=devices, shared_podvol_errors=podvols)


def restore_asw(snap: AswSnapshot, into: Asw | None = None) -> Asw:
    """The ASW of a decoded snapshot part, filled into `into` (in place) if given.

    In place means the same `Asw` object and the same dict objects, so
    holders of references to them (the reconciler, the executor) see the
    restored state.
    """
    restored = snap.asw
    for vid in snap.shared_device_errors:
        dev = restored.devices.get(vid)
        if dev is not None and dev.last_operation is not None:
            dev.last_error = dev.last_operation
    for key in snap.shared_podvol_errors:
        pv = restored.podvols.get(key)
        if pv is not None and pv.last_operation is not None:
            pv.last_error = pv.last_operation
    if into is None:
        return restored
    for name in _ASW_FIELDS:
        new = getattr(restored, name)
        old = getattr(into, name)
        if isinstance(old, dict) and isinstance(new, dict):
            old.clear()
            old.update(new)
        else:
            setattr(into, name, new)
    return into


def encode_asw(asw: Asw) -> bytes:
    """msgpack bytes of an ASW (what `decode_asw` reads)."""
    return _encoder.encode(snapshot_asw(asw))


def decode_asw(data: bytes) -> Asw:
    """The ASW `encode_asw` wrote (`msgspec.DecodeError` for anything else)."""
    return restore_asw(_decoder.decode(data))
